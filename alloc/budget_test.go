package alloc_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/emulation"
	"github.com/farmem/farmem/internal/pooltest"
)

// allocPlaced allocates with opts, checks the segment's Placement against
// its tier and budget, frees it, and returns the placement.
func allocPlaced(t *testing.T, c *alloc.Client, opts ...alloc.AllocOption) alloc.Placement {
	t.Helper()
	seg, err := c.Alloc(t.Context(), 4096, opts...)
	require.NoError(t, err)
	defer func() { require.NoError(t, seg.Free(t.Context())) }()
	p, ok := seg.Placement()
	require.True(t, ok, "a segment this client allocated says why it is where it is")
	require.Equal(t, seg.Tier(), p.Tier)
	require.NotEmpty(t, p.Reason)
	return p
}

// TestMaxLatencyInjected places by budget on a daemon whose tiers have
// injected latencies (local 100ns, cxl 300ns, rdma 5µs at 1 GB/s): the
// figures are known from the start and exact, so every choice is
// predictable. A budget takes the cheapest tier that meets it (rdma, cxl,
// local); a named tier and its fallbacks keep their order; TierAny without
// a budget takes the fastest first.
func TestMaxLatencyInjected(t *testing.T) {
	cfg := pooltest.Config(t)
	var err error
	cfg.EmulateLatency, err = emulation.Parse("local=100ns,cxl=300ns,rdma=5us/1GB/s")
	require.NoError(t, err)
	pooltest.Start(t, cfg)
	c := dial(t, cfg.Socket)

	for _, tc := range []struct {
		name string
		opts []alloc.AllocOption
		want alloc.Tier
		ns   int64
	}{
		{"rdma over 2µs, cxl the next cheapest", []alloc.AllocOption{alloc.WithMaxLatency(2 * time.Microsecond)}, alloc.TierCXL, 300},
		{"only local within 200ns", []alloc.AllocOption{alloc.WithMaxLatency(200 * time.Nanosecond)}, alloc.TierLocal, 100},
		{"rdma within 10µs and cheapest", []alloc.AllocOption{alloc.WithMaxLatency(10 * time.Microsecond)}, alloc.TierRDMA, 5064},
		{"a named tier over budget, its fallback within", []alloc.AllocOption{alloc.WithTier(alloc.TierRDMA), alloc.WithFallback(alloc.TierLocal, alloc.TierCXL), alloc.WithMaxLatency(time.Microsecond)}, alloc.TierLocal, 100},
		{"bandwidth: rdma's injected cap meets it", []alloc.AllocOption{alloc.WithMinBandwidth(500e6)}, alloc.TierRDMA, 5064},
		{"TierAny without a budget: fastest first", nil, alloc.TierLocal, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := allocPlaced(t, c, tc.opts...)
			require.Equal(t, tc.want, p.Tier, p.Reason)
			require.Equal(t, tc.ns, p.ReadLatency.P50Ns, "rdma: 5µs + 64 B at 1 GB/s")
			require.Equal(t, "injected", p.ReadLatency.Source)
		})
	}

	p := allocPlaced(t, c, alloc.WithMaxLatency(2*time.Microsecond))
	require.Equal(t, 2*time.Microsecond, p.MaxLatency)
	require.Contains(t, p.Reason, "rdma reads in 5.064µs p50 (injected), over 2µs", "says what the budget left out")
	p = allocPlaced(t, c, alloc.WithMaxLatency(10*time.Microsecond), alloc.WithMinBandwidth(500e6))
	require.Equal(t, alloc.TierRDMA, p.Tier, "both bounds hold; local and cxl have no bandwidth figure")
	require.Equal(t, 10*time.Microsecond, p.MaxLatency)
	require.EqualValues(t, 500e6, p.MinBandwidth)
	require.Equal(t, int64(1e9), p.ReadBandwidth)
	require.Equal(t, "injected", p.ReadBandwidthSource)
	require.Contains(t, p.Reason, "local read bandwidth not measured")

	for _, tc := range []struct {
		name string
		opts []alloc.AllocOption
		says string
	}{
		{"faster than every tier", []alloc.AllocOption{alloc.WithMaxLatency(50 * time.Nanosecond)}, "the best tier, local, reads in 100ns p50 (injected), over 50ns"},
		{"a named tier over budget", []alloc.AllocOption{alloc.WithTier(alloc.TierRDMA), alloc.WithMaxLatency(2 * time.Microsecond)}, "the best tier, rdma, reads in 5.064µs p50 (injected), over 2µs"},
		{"more bandwidth than known", []alloc.AllocOption{alloc.WithMinBandwidth(2e9)}, "the best tier, rdma, reads at 1.00 GB/s (injected), under 2.00 GB/s"},
		{"both bounds, each met by another tier", []alloc.AllocOption{alloc.WithMaxLatency(2 * time.Microsecond), alloc.WithMinBandwidth(1)}, "the best tier, rdma, reads in 5.064µs p50 (injected), over 2µs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Alloc(t.Context(), 4096, tc.opts...)
			require.ErrorIs(t, err, alloc.ErrOverBudget)
			require.ErrorIs(t, err, alloc.ErrNoCapacity, "no tier the caller accepts can take it")
			require.ErrorContains(t, err, tc.says)
		})
	}
}

// TestMaxLatencyMeasured places by the figures poold measured: 2µs lands
// on cxl or local (the loopback rdma tier reads in tens of µs over TCP),
// judged by the measured figure memctl tiers shows; 1ns is refused,
// naming the fastest tier; TierAny takes a tier within 25% of the fastest.
func TestMaxLatencyMeasured(t *testing.T) {
	cfg := pooltest.Config(t)
	d := pooltest.Start(t, cfg)
	c := dial(t, cfg.Socket)
	_, err := c.Alloc(t.Context(), 4096, alloc.WithMaxLatency(time.Millisecond))
	require.ErrorIs(t, err, alloc.ErrOverBudget, "nothing measured yet: no tier is taken on trust")
	require.ErrorContains(t, err, "memctl tiers --measure")

	require.NoError(t, d.MeasureTiers(t.Context()))
	tiers, err := c.Tiers(t.Context())
	require.NoError(t, err)
	p50 := map[alloc.Tier]int64{}
	fastest := tiers[0]
	for _, ti := range tiers {
		require.Equal(t, "measured", ti.ReadLatency.Source, ti.Tier.String())
		p50[ti.Tier] = ti.ReadLatency.P50Ns
		if ti.ReadLatency.P50Ns < fastest.ReadLatency.P50Ns {
			fastest = ti
		}
	}
	t.Logf("measured read p50: %v", p50)

	p := allocPlaced(t, c, alloc.WithMaxLatency(2*time.Microsecond))
	require.Contains(t, []alloc.Tier{alloc.TierCXL, alloc.TierLocal}, p.Tier)
	require.Equal(t, "measured", p.ReadLatency.Source)
	require.Equal(t, p50[p.Tier], p.ReadLatency.P50Ns, "judged by the figure Tiers shows")
	require.LessOrEqual(t, p.ReadLatency.P50Ns, int64(2000))

	p = allocPlaced(t, c)
	require.LessOrEqual(t, float64(p50[p.Tier]), 1.25*float64(fastest.ReadLatency.P50Ns), p.Reason)
	require.Contains(t, p.Reason, "fastest read latency p50 first")

	_, err = c.Alloc(t.Context(), 4096, alloc.WithMaxLatency(time.Nanosecond))
	require.ErrorIs(t, err, alloc.ErrOverBudget)
	require.ErrorContains(t, err, "read latency ≤ 1ns")
	require.ErrorContains(t, err, "the best tier, "+fastest.Tier.String()+", reads in ")
}

// TestBudgetInvalid: a zero or negative budget is ErrInvalid, saying which
// option and value, before anything reaches the daemon.
func TestBudgetInvalid(t *testing.T) {
	_, c := startPool(t)
	for _, tc := range []struct {
		opt  alloc.AllocOption
		says string
	}{
		{alloc.WithMaxLatency(0), "WithMaxLatency(0s): a latency budget must be positive"},
		{alloc.WithMaxLatency(-time.Microsecond), "WithMaxLatency(-1µs)"},
		{alloc.WithMinBandwidth(0), "WithMinBandwidth(0): a bandwidth budget must be positive"},
		{alloc.WithMinBandwidth(-1), "WithMinBandwidth(-1)"},
	} {
		_, err := c.Alloc(t.Context(), 4096, tc.opt)
		require.ErrorIs(t, err, alloc.ErrInvalid)
		require.ErrorContains(t, err, tc.says)
	}
}

// TestPlacementAttached: the decision is the allocating client's to see;
// a segment attached by name has none.
func TestPlacementAttached(t *testing.T) {
	cfg, c := startPool(t)
	seg, err := c.Alloc(t.Context(), 4096, alloc.WithTier(alloc.TierCXL), alloc.WithName("placed"))
	require.NoError(t, err)
	defer seg.Free(t.Context())
	p, ok := seg.Placement()
	require.True(t, ok)
	require.Equal(t, "asked for cxl", p.Reason)
	require.Zero(t, p.ReadLatency, "nothing measured (pooltest turns the probe off)")
	other, err := dial(t, cfg.Socket).Attach(t.Context(), "placed")
	require.NoError(t, err)
	_, ok = other.Placement()
	require.False(t, ok)
}
