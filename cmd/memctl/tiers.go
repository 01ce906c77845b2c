package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/tier"
)

// measureTimeout is the least time memctl tiers --measure waits: the
// daemon probes every tier (well under 2 s each, longer on a busy host) and
// waits for a measurement already running.
const measureTimeout = 2 * time.Minute

func newTiersCmd(g *globals) *cobra.Command {
	var measure bool
	cmd := &cobra.Command{
		Use:   "tiers",
		Short: "Show each memory tier: what backs it, real or emulated, capacity, free and latency",
		Long: `Show each memory tier: what backs it, whether it is real or emulated, its
capacity and free space, and its read latency with where the figure comes
from: "measured" on this host by poold (at start, or now with --measure),
"measured: peer NODE" for the peers' rdma tier (the nearest peer's 64-byte
one-sided reads over its data plane, taken when it joins, comes back or
moves, every --measure-peers-every and with --measure; the note lists every
peer's figure or why it has none), "injected" by latency emulation (poold
--emulate-latency; the measured figure of the real memory is shown beside
it), or "hmat" (the firmware's rating).`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			var resp *poolv1.TiersResponse
			if measure {
				g.timeout = max(g.timeout, measureTimeout)
			}
			err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
				if measure {
					resp, err = c.MeasureTiers(ctx, &poolv1.MeasureTiersRequest{})
					return err
				}
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
	cmd.Flags().BoolVar(&measure, "measure", false, "have poold measure every tier and every peer now (up to a few seconds; briefly takes up to 64MiB of each tier, 2MiB at each peer) and show the fresh figures")
	return cmd
}

// known reports whether l holds a figure: a measurement with samples, or
// an injected or firmware value.
func known(l *poolv1.Latency) bool {
	return l != nil && (l.Samples > 0 || l.P50Ns > 0 && l.Source != "measured")
}

func printLatency(l *poolv1.Latency) string {
	if !known(l) {
		return "-"
	}
	if l.Source == "injected" {
		return fmt.Sprintf("%s (injected)", time.Duration(l.P50Ns))
	}
	return fmt.Sprintf("%s p50 (%s)", time.Duration(l.P50Ns), l.Source)
}

// readLatency shows the measured (or injected) read latency with, for an
// injected one, the measurement of the real memory, and the firmware's
// HMAT figure beside the measured one, with how far apart they are.
func readLatency(t *poolv1.TierInfo) string {
	s := printLatency(t.ReadLatency)
	measured := t.ReadLatency
	if t.ReadLatency.GetSource() == "injected" {
		measured = t.MeasuredReadLatency
		if known(measured) {
			s += fmt.Sprintf(", measured %s p50", time.Duration(measured.P50Ns))
		}
	}
	h := t.HmatReadLatency
	if h == nil || h.P50Ns == 0 {
		return s
	}
	s += fmt.Sprintf(", hmat %s", time.Duration(h.P50Ns))
	if known(measured) && measured.Source == "measured" {
		s += fmt.Sprintf(" (%+.0f%%)", 100*(float64(measured.P50Ns)-float64(h.P50Ns))/float64(h.P50Ns))
	}
	return s
}

// printTiers writes the tier table, then each tier's note.
func printTiers(w *tabwriter.Writer, tiers []*poolv1.TierInfo) {
	fmt.Fprintln(w, "TIER\tKIND\tHARDWARE\tCAPACITY\tFREE\tSEGMENTS\tREAD LATENCY\tDEVICES")
	for _, t := range tiers {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", tier.Name(t.Tier), t.Kind, reality(t.Emulated),
			human(t.Capacity), human(t.Free), t.Segments, readLatency(t), strings.Join(t.Devices, ","))
	}
	for _, t := range tiers {
		if t.Note != "" {
			fmt.Fprintf(w, "\n%s: %s", tier.Name(t.Tier), t.Note)
		}
	}
	fmt.Fprintln(w)
}
