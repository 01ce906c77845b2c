package main

import (
	"context"
	"fmt"
	"strconv"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

func newFreeCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "free ID|NAME",
		Short: "Free a segment by id or name",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			req := &poolv1.FreeRequest{Name: args[0]}
			if id, err := strconv.ParseUint(args[0], 10, 64); err == nil {
				req = &poolv1.FreeRequest{Id: id}
			}
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) error {
				_, err := c.Free(ctx, req)
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				return g.printJSON(map[string]any{"freed": args[0]})
			}
			fmt.Fprintf(g.out, "freed %s\n", args[0])
			return nil
		},
	}
}
