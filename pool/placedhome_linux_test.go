package pool

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// placedCheck is what the placed hook of TestPlacedHomeKept saw of one new
// home: whether the reconcile of its node ran, and whether the home was
// still held there after it.
type placedCheck struct {
	seg        uint64
	home       homeRef
	reconciled bool
	survived   bool
}

// TestPlacedHomeKept: a reconcile of a node runs between the placement
// of a new home there and the moment the record (a rebuild) or the move's
// intent (a home move) names it, as any reconcile may (a node's return, a
// sweep, a home found missing). It must not take the new home for an
// orphan: the rebuild of a replicas=2 segment's lost backup and then the
// move of its primary each complete at the first try with the home placed,
// which holds the bytes written. Freed there, the fill failed and the
// rebuild or move was tried again with another home.
func TestPlacedHomeKept(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 5, leaseTTL: 10 * time.Second, timing: fastDetection})
	oh := sc.hosts[0]
	oh.cfg.ExportSize = 0 // every home on another host
	var mu sync.Mutex
	var seen []placedCheck
	oh.cfg.sim.placed = func(seg uint64, h homeRef) {
		_, ok := oh.daemon().pool.reconcile(context.Background(), h.Node)
		// A free reconcile ordered runs in the background: give it time
		// to land.
		held := func() bool { _, err := sc.host(h.Node).daemon().pool.Stat(h.HomeID); return err == nil }
		for deadline := time.Now().Add(2 * time.Second); held() && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		mu.Lock()
		seen = append(seen, placedCheck{seg: seg, home: h, reconciled: ok, survived: held()})
		mu.Unlock()
	}
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx, origin := t.Context(), oh.daemon()
	const size = 64 << 10
	seg, err := allocSpec(ctx, t, origin, size, "replicas=2")
	require.NoError(t, err)
	r := *seg
	want := bytes.Repeat([]byte{0x5a}, size)
	require.NoError(t, homeConn(t, origin, r.Homes[0]).Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(r.Homes[0]), Buf: want}))
	state := func() record {
		cur, ok := origin.pool.redundantRecord(r.ID)
		require.True(t, ok)
		return cur
	}
	placed := func(n int) placedCheck {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		require.Len(t, seen, n, "one new home placed each time")
		c := seen[n-1]
		require.Equal(t, r.ID, c.seg)
		require.True(t, c.reconciled, "the reconcile of %s ran", c.home.Node)
		require.True(t, c.survived, "the reconcile of %s freed the new home %d there", c.home.Node, c.home.HomeID)
		return c
	}
	count := func(c prometheus.Counter) float64 {
		var m dto.Metric
		_ = c.Write(&m) // a counter's Write does not fail
		return m.GetCounter().GetValue()
	}

	sc.crash(sc.host(r.Homes[1].Node))
	var cur record
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		cur = state()
		if cur.redundancyState() == poolv1.RedundancyState_REDUNDANCY_STATE_OK && cur.Homes[1].Node != r.Homes[1].Node {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the backup is not rebuilt: %s", homesString(cur.Homes))
		}
	}
	c := placed(1)
	require.Equal(t, c.home.Node, cur.Homes[1].Node, "the backup is the home placed")
	require.Equal(t, c.home.HomeID, cur.Homes[1].HomeID)
	rebuilds := origin.metrics.rebuilds.runs
	require.Eventually(t, func() bool { return count(rebuilds.WithLabelValues("ok")) == 1 }, 10*time.Second, 10*time.Millisecond,
		"farmem_rebuilds_total{result=\"ok\"} does not count the rebuild")
	require.Zero(t, count(rebuilds.WithLabelValues("failed")), "farmem_rebuilds_total{result=\"failed\"}")

	leaving := cur.Homes[0]
	for {
		// The backup's rebuild has the homes told again (replicateLater),
		// which holds the segment's move lock a while.
		_, err = origin.pool.move(ctx, caller{client: &client{id: peerClientPrefix + leaving.Node}},
			&poolv1.MoveRequest{Home: leaving.Node, HomeId: leaving.HomeID}, origin.moveTLS(), origin.moveClients())
		if !errors.Is(err, errMoveBusy) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, err, "the move of the primary")
	c = placed(2)
	cur = state()
	require.Equal(t, c.home.Node, cur.Homes[0].Node, "the primary is the home placed")
	require.Equal(t, c.home.HomeID, cur.Homes[0].HomeID)
	require.Zero(t, count(origin.metrics.moves.runs.WithLabelValues("failed")), "farmem_moves_total{result=\"failed\"}")
	for _, h := range cur.Homes {
		require.True(t, bytes.Equal(want, homeBytes(ctx, t, origin, h, size)), "the home on %s holds the bytes written", h.Node)
	}
}

// TestAllocHomeGoneUnmarked: a home of a redundant segment being
// allocated that its node no longer holds when the allocation tells it how
// it is written (here: freed there as the Replicate arrives) fails the
// allocation with an error that says the node no longer holds it, and not
// that the home was marked lost: there is no record yet to mark.
func TestAllocHomeGoneUnmarked(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second})
	var gone atomic.Bool // the next Replicate finds its copy freed
	for _, h := range sc.hosts {
		h.cfg.Rebuild = false
		h.cfg.sim.grpc = append(h.cfg.sim.grpc, grpc.ChainUnaryInterceptor(
			func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
				if rr, ok := req.(*poolv1.ReplicateRequest); ok && gone.CompareAndSwap(true, false) {
					reclaimHere(h.daemon().pool, rr.HomeId, "the test's home lost its copy")
				}
				return next(ctx, req)
			}))
	}
	sc.hosts[0].cfg.ExportSize = 0
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	origin := sc.hosts[0].daemon()
	gone.Store(true)
	_, err = allocSpec(t.Context(), t, origin, 8192, "replicas=2")
	require.False(t, gone.Load(), "no Replicate reached a home")
	require.ErrorIs(t, err, errs.ErrNotFound)
	require.ErrorContains(t, err, "its node holds it no more")
	require.NotContains(t, err.Error(), "marked lost", "no record names the home yet")
	for _, r := range origin.pool.List() {
		require.False(t, r.redundant(), "no record of the failed allocation: %+v", r)
	}
}
