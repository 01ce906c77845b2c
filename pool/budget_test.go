package pool_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/emulation"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
)

// TestBudgetOnTheWire checks placement by budget at the daemon's API, as
// any client (memctl, another language) sees it: a negative bound is
// INVALID, a budget no tier meets is RESOURCE_EXHAUSTED carrying
// ErrOverBudget (counted as over_budget, not no_capacity), and the reply's Placement names the figure the tier was
// judged by and the budget.
func TestBudgetOnTheWire(t *testing.T) {
	cfg := pooltest.Config(t)
	var err error
	cfg.EmulateLatency, err = emulation.Parse("cxl=300ns,rdma=5us")
	require.NoError(t, err)
	cfg.Metrics = "127.0.0.1:0"
	d := pooltest.Start(t, cfg)
	conn, err := session.Channel("unix", cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	api := poolv1.NewPoolClient(conn)
	alloc := func(req *poolv1.AllocRequest) (*poolv1.Segment, error) {
		req.Size, req.Persist = 4096, true
		return api.Alloc(t.Context(), req)
	}

	for _, req := range []*poolv1.AllocRequest{{MaxReadLatencyNs: -1}, {MinReadBandwidthBps: -1}, {MaxReadLatencyNs: -1, Tier: poolv1.Tier_TIER_CXL}} {
		_, err := alloc(req)
		require.Equal(t, codes.InvalidArgument, grpcstatus.Code(err))
		require.ErrorIs(t, errs.FromStatus(err), errs.ErrInvalid)
		require.ErrorContains(t, err, "is negative")
	}

	_, err = alloc(&poolv1.AllocRequest{MaxReadLatencyNs: 100})
	require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(err))
	require.ErrorIs(t, errs.FromStatus(err), errs.ErrOverBudget)
	require.ErrorContains(t, err, "the best tier, cxl, reads in 300ns p50 (injected), over 100ns")
	fams := scrape(t, d)
	require.Equal(t, 1.0, sample(t, fams, "farmem_alloc_failures_total", map[string]string{"reason": "over_budget"}))
	require.Zero(t, sample(t, fams, "farmem_alloc_failures_total", map[string]string{"reason": "no_capacity"}))

	seg, err := alloc(&poolv1.AllocRequest{MaxReadLatencyNs: 1000})
	require.NoError(t, err)
	require.Equal(t, poolv1.Tier_TIER_CXL, seg.Tier)
	pl := seg.Placement
	require.NotNil(t, pl)
	require.Equal(t, int64(300), pl.ReadLatency.GetP50Ns())
	require.Equal(t, "injected", pl.ReadLatency.GetSource())
	require.Equal(t, int64(1000), pl.MaxReadLatencyNs)
	require.Contains(t, pl.Reason, "rdma reads in 5µs p50 (injected), over 1µs")

	// A listing does not carry it: the decision is not stored.
	got, err := api.Stat(t.Context(), &poolv1.StatRequest{Id: seg.Id})
	require.NoError(t, err)
	require.Nil(t, got.Placement)
}

// TestBudgetWaitsForFirstMeasurement checks that an Alloc with a read
// budget that arrives while poold still measures its tiers at start waits
// for the figures, as long as the call's deadline allows, instead of being
// refused for want of them: one with a short deadline ends with it (not
// over budget), the next one, without, lands on a measured tier.
func TestBudgetWaitsForFirstMeasurement(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.MeasureTiers = true
	pooltest.Start(t, cfg)
	conn, err := session.Channel("unix", cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	api := poolv1.NewPoolClient(conn)
	req := &poolv1.AllocRequest{Size: 4096, Persist: true, MaxReadLatencyNs: time.Millisecond.Nanoseconds()}

	// The measurement reads each tier's 16 MiB probe span six times and
	// times 400 loads per chain: far longer than this.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
	defer cancel()
	_, err = api.Alloc(ctx, req)
	require.Equal(t, codes.DeadlineExceeded, grpcstatus.Code(err), "%v", err)
	require.NotErrorIs(t, errs.FromStatus(err), errs.ErrOverBudget)

	seg, err := api.Alloc(t.Context(), req)
	require.NoError(t, err)
	require.Equal(t, "measured", seg.Placement.GetReadLatency().GetSource())
	require.LessOrEqual(t, seg.Placement.ReadLatency.P50Ns, req.MaxReadLatencyNs)
}
