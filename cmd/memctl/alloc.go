package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/tier"
)

func newAllocCmd(g *globals) *cobra.Command {
	var (
		sz               sizeFlag
		tierFlag         string
		name             string
		allow, allowFree []string
	)
	cmd := &cobra.Command{
		Use:   "alloc --size SIZE [--tier cxl] [--name NAME [--allow IDENTITY,...] [--allow-free IDENTITY,...]]",
		Short: "Allocate a segment that stays until 'memctl free'",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			t, err := tier.Parse(tierFlag)
			if err != nil {
				return fmt.Errorf("--tier: %w", err)
			}
			var seg *poolv1.Segment
			err = g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				seg, err = c.Alloc(ctx, &poolv1.AllocRequest{Size: int64(sz.Size), Tier: t, Name: name, Persist: true, Allow: allow, AllowFree: allowFree})
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(segmentView(seg))
			}
			fmt.Fprintf(g.out, "allocated segment %d: %s on %s (%s, %s, device %s, node %s)\n", seg.Id, human(seg.Size),
				tier.Name(seg.Tier), seg.Kind, reality(seg.Emulated), seg.Device, seg.Node)
			return nil
		},
	}
	cmd.Flags().Var(&sz, "size", "segment size, e.g. 64MiB (required)")
	cmd.Flags().StringVar(&tierFlag, "tier", "any", "tier: local, cxl, rdma or any")
	cmd.Flags().StringVar(&name, "name", "", "unique name clients of the identities allowed can attach")
	cmd.Flags().StringSliceVar(&allow, "allow", nil, "identities besides memctl's own that may attach the name: uid:N, gid:N (primary gid) or cn:NAME (client certificate), comma-separated")
	cmd.Flags().StringSliceVar(&allowFree, "allow-free", nil, "identities that may attach the name and free it")
	cmd.MarkFlagRequired("size")
	return cmd
}

// sizeFlag is a byte-size flag with no default: its help shows none
// (pflag would print "(default 0B)" beside "(required)").
type sizeFlag struct{ size.Size }

func (f *sizeFlag) String() string {
	if f.Size == 0 {
		return ""
	}
	return f.Size.String()
}
