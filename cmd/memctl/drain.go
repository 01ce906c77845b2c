package main

import (
	"context"
	"fmt"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

func newDrainCmd(g *globals) *cobra.Command {
	var undo bool
	cmd := &cobra.Command{
		Use:   "drain NODE",
		Short: "Stop new placements on a node; its segments stay (--undo reverses it)",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) error {
				_, err := c.Drain(ctx, &poolv1.DrainRequest{Node: args[0], Undo: undo})
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(map[string]any{"node": args[0], "draining": !undo})
			}
			if undo {
				fmt.Fprintf(g.out, "%s accepts placements again\n", args[0])
			} else {
				fmt.Fprintf(g.out, "%s is draining: no new placements; its segments stay\n", args[0])
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&undo, "undo", false, "accept placements again")
	return cmd
}
