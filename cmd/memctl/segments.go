package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/tier"
)

func newSegmentsCmd(g *globals) *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "segments",
		Short: "List the segments the daemon holds",
		Long: `List the segments the daemon holds (with --all, every alive node's), by
id (by node, then id, with --all). memctl fetches them in pages of 1000, so
a table of any size lists; --timeout bounds each page.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var segs []*poolv1.Segment
			err := g.callWithin(0, func(ctx context.Context, c poolv1.PoolClient) (err error) {
				segs, err = poolv1.ListAll(ctx, c, &poolv1.ListRequest{All: all}, g.timeout)
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				out := make([]segmentJSON, len(segs))
				for i, s := range segs {
					out[i] = segmentView(s)
				}
				return g.printJSON(out)
			}
			w := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tNAME\tTIER\tKIND\tHARDWARE\tSIZE\tNODE\tDEVICE\tSTATE\tREDUNDANCY\tSHARERS\tOWNER\tACCESS")
			for _, s := range segs {
				name := s.Name
				if name == "" {
					name = "-"
				}
				owner := s.Owner
				if owner == "" {
					owner = "(admin)"
				}
				sharers := "-"
				if s.Sharers > 0 {
					sharers = fmt.Sprint(s.Sharers)
				}
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Id, name, tier.Name(s.Tier), s.Kind, reality(s.Emulated),
					human(s.Size), s.Node, s.Device, stateName(s.State), redundancyCell(segmentView(s)), sharers, owner, access(s))
			}
			return w.Flush()
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "every alive node's segments, cluster-wide")
	return cmd
}

// access says who may attach a named segment, in one word: its creator's
// identity, then each identity granted, "(free)" marking those that may
// also free it, e.g. "cn:app,+cn:app2,+cn:ops(free)"; "-" for an unnamed
// segment, which only its owner reaches.
func access(s *poolv1.Segment) string {
	if s.Name == "" {
		return "-"
	}
	out := s.Creator
	if out == "" {
		out = "(unknown-creator)"
	}
	for _, id := range s.Allow {
		out += ",+" + id
	}
	for _, id := range s.AllowFree {
		out += ",+" + id + "(free)"
	}
	return out
}
