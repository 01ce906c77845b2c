package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

func newTiersCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "tiers",
		Short: "Show each memory tier: what backs it, real or emulated, capacity and free",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var resp *poolv1.TiersResponse
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				resp, err = c.Tiers(ctx, &poolv1.TiersRequest{})
				return err
			})
			if err != nil {
				return err
			}
			if g.output == "json" {
				out := make([]tierJSON, len(resp.Tiers))
				for i, t := range resp.Tiers {
					out[i] = tierView(t)
				}
				return g.printJSON(out)
			}
			w := tabwriter.NewWriter(g.out, 0, 4, 2, ' ', 0)
			printTiers(w, resp.Tiers)
			return w.Flush()
		},
	}
}

func printLatency(l *poolv1.Latency) string {
	if l == nil || l.Samples == 0 {
		return "-"
	}
	return fmt.Sprintf("%s p50 (%s)", time.Duration(l.P50Ns), l.Source)
}

// readLatency shows the measured (or injected) read latency with the
// firmware's HMAT figure beside it, and how far apart they are.
func readLatency(t *poolv1.TierInfo) string {
	s := printLatency(t.ReadLatency)
	h := t.HmatReadLatency
	if h == nil || h.P50Ns == 0 {
		return s
	}
	s += fmt.Sprintf(", hmat %s", time.Duration(h.P50Ns))
	if m := t.ReadLatency; m != nil && m.Samples > 0 {
		s += fmt.Sprintf(" (%+.0f%%)", 100*(float64(m.P50Ns)-float64(h.P50Ns))/float64(h.P50Ns))
	}
	return s
}

// printTiers writes the tier table, then each tier's note.
func printTiers(w *tabwriter.Writer, tiers []*poolv1.TierInfo) {
	fmt.Fprintln(w, "TIER\tKIND\tHARDWARE\tCAPACITY\tFREE\tSEGMENTS\tREAD LATENCY\tDEVICES")
	for _, t := range tiers {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", tierName(t.Tier), t.Kind, reality(t.Emulated),
			human(t.Capacity), human(t.Free), t.Segments, readLatency(t), strings.Join(t.Devices, ","))
	}
	for _, t := range tiers {
		if t.Note != "" {
			fmt.Fprintf(w, "\n%s: %s", tierName(t.Tier), t.Note)
		}
	}
	fmt.Fprintln(w)
}
