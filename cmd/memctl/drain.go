package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// drainEffect says what a drain does, and what it does not do yet.
const drainEffect = "no new placements; its segments stay (moving them off is not built yet)"

func newDrainCmd(g *globals) *cobra.Command {
	var undo bool
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Stop new placements on a node until --undo, across restarts; its segments stay",
		Long: "Stop new placements on NODE: peers place no segments there and leave its free space out\n" +
			"of the cluster's FREE (applications of NODE's own daemon still allocate on it). NODE's\n" +
			"daemon keeps the drain in its metadata store, so it holds across restarts until\n" +
			"'memctl drain NODE --undo'. The node's segments stay: moving them off is not built yet.\n" +
			"Any daemon of the cluster forwards the request to NODE's daemon.",
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			var resp *poolv1.DrainResponse
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				resp, err = c.Drain(ctx, &poolv1.DrainRequest{Node: args[0], Undo: undo})
				return err
			})
			if err != nil {
				return err
			}
			if resp.Node == "" { // a poold that predates the answer's fields: it did as asked
				resp = &poolv1.DrainResponse{Node: args[0], Draining: !undo, Changed: true}
			}
			if g.output == "json" {
				return g.printJSON(map[string]any{"node": resp.Node, "draining": resp.Draining, "changed": resp.Changed,
					"draining_since": optRFC3339(resp.DrainingSinceUnixMs)})
			}
			switch {
			case undo && resp.Changed:
				fmt.Fprintf(g.out, "%s accepts placements again\n", resp.Node)
			case undo:
				fmt.Fprintf(g.out, "%s was not draining; nothing to undo\n", resp.Node)
			case resp.Changed:
				fmt.Fprintf(g.out, "%s is %s\n", resp.Node, drainingText(resp.DrainingSinceUnixMs))
			default:
				fmt.Fprintf(g.out, "%s was already %s\n", resp.Node, drainingText(resp.DrainingSinceUnixMs))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&undo, "undo", false, "accept placements again")
	return cmd
}

// drainingText describes a drain that began at sinceMs (Unix ms; 0 when
// the daemon did not say).
func drainingText(sinceMs int64) string {
	if sinceMs == 0 {
		return "draining: " + drainEffect
	}
	return fmt.Sprintf("draining since %s (%s ago): %s", rfc3339(sinceMs),
		time.Since(time.UnixMilli(sinceMs)).Round(time.Second), drainEffect)
}

// rfc3339 formats Unix milliseconds as UTC RFC 3339.
func rfc3339(ms int64) string { return time.UnixMilli(ms).UTC().Format(time.RFC3339) }

// optRFC3339 is rfc3339 of ms, or nil (JSON null) for 0.
func optRFC3339(ms int64) any {
	if ms == 0 {
		return nil
	}
	return rfc3339(ms)
}
