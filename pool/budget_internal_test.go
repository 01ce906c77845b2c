package pool

import (
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

const (
	tLocal = poolv1.Tier_TIER_LOCAL
	tCXL   = poolv1.Tier_TIER_CXL
	tRDMA  = poolv1.Tier_TIER_RDMA
)

func measured(ns int64) figure {
	return figure{lat: &poolv1.Latency{P50Ns: ns, P99Ns: ns, Samples: 400, Source: "measured"}}
}

// TestByLatency: TierAny tries the fastest tier first; tiers within
// sameSpeed of the fastest of their group count as equally fast and go
// cheapest first, so that two tiers of the same DRAM do not swap places
// with the probe's noise; tiers without a figure go last, in the order
// given.
func TestByLatency(t *testing.T) {
	for _, tc := range []struct {
		name string
		figs map[poolv1.Tier]figure
		want []poolv1.Tier
	}{
		{"local clearly faster", map[poolv1.Tier]figure{tLocal: measured(100), tCXL: measured(300), tRDMA: measured(20000)}, []poolv1.Tier{tLocal, tCXL, tRDMA}},
		{"cxl clearly faster", map[poolv1.Tier]figure{tLocal: measured(300), tCXL: measured(100), tRDMA: measured(20000)}, []poolv1.Tier{tCXL, tLocal, tRDMA}},
		{"same DRAM, local a bit faster", map[poolv1.Tier]figure{tLocal: measured(180), tCXL: measured(216), tRDMA: measured(20000)}, []poolv1.Tier{tCXL, tLocal, tRDMA}},
		{"same DRAM, cxl a bit faster", map[poolv1.Tier]figure{tLocal: measured(200), tCXL: measured(190), tRDMA: measured(20000)}, []poolv1.Tier{tCXL, tLocal, tRDMA}},
		{"rdma as fast as dram", map[poolv1.Tier]figure{tLocal: measured(100), tCXL: measured(500), tRDMA: measured(110)}, []poolv1.Tier{tRDMA, tLocal, tCXL}},
		{"rdma not measured", map[poolv1.Tier]figure{tLocal: measured(100), tCXL: measured(500), tRDMA: {}}, []poolv1.Tier{tLocal, tCXL, tRDMA}},
		{"nothing measured", map[poolv1.Tier]figure{tLocal: {}, tCXL: {}, tRDMA: {}}, fixedOrder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := plan{figs: tc.figs}.byLatency(fixedOrder)
			require.Equal(t, tc.want, got)
			require.NotEmpty(t, why)
		})
	}
}

// TestOverBudgetMessage: the error for a budget no tier meets is ErrOverBudget
// (and ErrNoCapacity), names the best tier by the bound asked and its
// figure, and lists every tier's figures; with no figure at all it says
// how to measure.
func TestOverBudgetMessage(t *testing.T) {
	figs := map[poolv1.Tier]figure{tLocal: measured(180), tCXL: measured(216), tRDMA: measured(20000)}
	figs[tRDMA] = figure{lat: figs[tRDMA].lat, bps: 800e6, bpsSource: "measured"}
	all := []poolv1.Tier{tCXL, tLocal, tRDMA}

	err := plan{figs: figs, budget: readBudget{maxLatencyNs: 1}}.overBudget(4096, all)
	require.ErrorIs(t, err, errs.ErrOverBudget)
	require.ErrorIs(t, err, errs.ErrNoCapacity)
	require.Contains(t, err.Error(), "read latency ≤ 1ns")
	require.Contains(t, err.Error(), "the best tier, local, reads in 180ns p50 (measured), over 1ns")
	require.Contains(t, err.Error(), "rdma 20µs p50 (measured), 800.00 MB/s (measured)")

	err = plan{figs: figs, budget: readBudget{minBps: 1e9}}.overBudget(4096, all)
	require.ErrorIs(t, err, errs.ErrOverBudget)
	require.Contains(t, err.Error(), "the best tier, rdma, reads at 800.00 MB/s (measured), under 1.00 GB/s")

	err = plan{figs: map[poolv1.Tier]figure{}, budget: readBudget{maxLatencyNs: 1000}}.overBudget(4096, all)
	require.ErrorIs(t, err, errs.ErrOverBudget)
	require.Contains(t, err.Error(), "memctl tiers --measure")
}

func TestBandwidthFormat(t *testing.T) {
	for bps, want := range map[int64]string{0: "0 B/s", 999: "999 B/s", 1000: "1.00 KB/s", 12e9: "12.00 GB/s", 1.5e12: "1.50 TB/s"} {
		require.Equal(t, want, bandwidth(bps))
	}
}
