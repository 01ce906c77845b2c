package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/tier"
)

// moveTimeout is how long memctl move waits for the daemon when --timeout
// is not given: a move copies the whole segment.
const moveTimeout = time.Hour

func newMoveCmd(g *globals) *cobra.Command {
	var to, tierFlag string
	cmd := &cobra.Command{
		Use:   "move SEGMENT",
		Short: "Move a segment to another node or tier while it is in use",
		Long: "Move SEGMENT (an id or a name) to NODE (--to), or to a node placement picks: the daemon\n" +
			"that placed it copies it while its clients go on reading and writing, seals the old home\n" +
			"for the switch-over (operations wait a moment; none is lost or applied twice) and\n" +
			"commits the new home. With --tier a segment changes tier: a load/store segment (cxl,\n" +
			"local) moves to rdma once no client maps it (each lets go with Segment.Close; the\n" +
			"refusal names them), and an rdma segment moves into this host's cxl or local memory\n" +
			"once no other client holds a session on it. Shared segments do not move.\n" +
			"Ask the daemon that placed the segment (the one its clients use).",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := &poolv1.MoveRequest{Name: args[0], ToNode: to}
			if id, err := strconv.ParseUint(args[0], 10, 64); err == nil {
				req = &poolv1.MoveRequest{Id: id, ToNode: to}
			}
			if tierFlag != "" {
				t, err := tier.Parse(tierFlag)
				if err != nil {
					return err
				}
				req.ToTier = t
			}
			wait := g.timeout
			if f := cmd.Flag("timeout"); f == nil || !f.Changed {
				wait = moveTimeout
			}
			var resp *poolv1.MoveResponse
			err := g.callWithin(wait, func(ctx context.Context, c poolv1.PoolClient) (err error) {
				if _, err := c.Status(ctx, &poolv1.StatusRequest{}); err != nil {
					return err
				}
				resp, err = c.Move(ctx, req)
				if err = errs.FromStatus(err); errors.Is(err, errs.ErrUnavailable) {
					// The daemon answered: a home of the move is away, not
					// the daemon (which call would report).
					return errors.New(err.Error())
				}
				return err
			})
			if err != nil {
				return err
			}
			to, toTier, fromTier := resp.GetSegment().GetNode(), tier.Name(resp.GetSegment().GetTier()), tier.Name(resp.FromTier)
			if g.output == "json" {
				return g.printJSON(map[string]any{"segment": resp.GetSegment().GetId(), "name": resp.GetSegment().GetName(),
					"from": resp.FromNode, "to": to, "from_tier": fromTier, "tier": toTier,
					"bytes_copied": resp.BytesCopied, "rounds": resp.Rounds, "pause_us": resp.PauseUs})
			}
			from, dest := resp.FromNode, to
			if resp.FromTier != poolv1.Tier_TIER_UNSPECIFIED && fromTier != toTier {
				from, dest = fmt.Sprintf("the %s tier of %s", fromTier, from), fmt.Sprintf("the %s tier of %s", toTier, dest)
			}
			fmt.Fprintf(g.out, "moved segment %s from %s to %s: %s copied in %d rounds, operations paused %v\n",
				args[0], from, dest, size.Size(resp.BytesCopied).Human(), resp.Rounds,
				(time.Duration(resp.PauseUs) * time.Microsecond).Round(time.Microsecond))
			return nil
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "the node to move it to (default: placement picks an alive node with room that does not drain)")
	cmd.Flags().StringVar(&tierFlag, "tier", "", "the tier to move it to: rdma for a cxl or local segment, cxl or local (this host's) for an rdma one (default: its own)")
	return cmd
}
