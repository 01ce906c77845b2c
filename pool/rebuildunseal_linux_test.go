package pool

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// TestRebuildUnsealAfterOriginRestart kills the origin of a replicas=2
// segment after a rebuild's switch committed the new home OK and before
// the primary took the ABORT that unseals it (the primary refuses every
// ABORT until the origin is down). The restarted origin has nothing to
// rebuild; it unseals the primary once it has set its forwarding again
// (replicateLater, unsealIdle), and a write there is applied.
func TestRebuildUnsealAfterOriginRestart(t *testing.T) {
	rs := newRedundantSim(t, 9, 1<<20, func(*simHost) {})
	sc, primary := rs.sc, rs.rep.Homes[0]
	pr := sc.host(primary.Node).daemon().pool
	var sealed, refuse atomic.Bool
	refuse.Store(true)
	refused := make(chan struct{}, 1)
	pr.cfg.sim.moveOutStep = func(_ caller, req *poolv1.MoveOutRequest) error {
		switch {
		case req.HomeId != primary.HomeID:
		case req.Phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL:
			sealed.Store(true)
		case req.Phase == poolv1.MoveOutPhase_MOVE_OUT_ABORT && sealed.Load() && refuse.Load():
			select {
			case refused <- struct{}{}:
			default:
			}
			return fmt.Errorf("%w: the test stands for an origin killed before this ABORT", errs.ErrUnavailable)
		}
		return nil
	}
	sc.crash(sc.host(rs.rep.Homes[1].Node))
	select {
	case <-refused:
	case <-time.After(time.Minute):
		t.Fatal("the rebuild did not unseal the primary after its SEAL")
	}
	origin := rs.oh.daemon()
	r, _ := origin.pool.redundantRecord(rs.repID)
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, r.Homes[1].State, "the switch committed the new home OK")
	crashed := errors.New("killed by the test")
	origin.failErr.Store(&crashed) // no leave: the others do not hear it go
	require.NoError(t, origin.Close())
	refuse.Store(false)
	require.NoError(t, sc.start(rs.oh))
	require.Eventually(t, func() bool {
		pr.mu.Lock()
		defer pr.mu.Unlock()
		rec, ok := pr.segs[primary.HomeID]
		return ok && !rec.Sealed
	}, 30*time.Second, 10*time.Millisecond, "the restarted origin does not unseal the primary")
	c := homeConn(t, rs.oh.daemon(), primary)
	require.NoError(t, c.Do(t.Context(), &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(primary), Buf: []byte{1}}))
}

// TestUnsealOnlyWhenSealed: replicateLater unseals the writers of a
// redundant segment (MoveOut ABORT at its primary) only while a seal may be
// left on them (unsealIdle): not for a segment just allocated, nor after a
// rebuild whose fill unsealed every survivor itself; after the origin
// restarts, which cannot know, once, and not again after that. Each
// replicateLater still tells both homes how they are written.
func TestUnsealOnlyWhenSealed(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second, timing: fastDetection})
	var aborts, replicates atomic.Int64
	for _, h := range sc.hosts {
		h.cfg.sim.grpc = append(h.cfg.sim.grpc, grpc.ChainUnaryInterceptor(
			func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
				switch r := req.(type) {
				case *poolv1.MoveOutRequest:
					if r.Phase == poolv1.MoveOutPhase_MOVE_OUT_ABORT {
						aborts.Add(1)
					}
				case *poolv1.ReplicateRequest:
					replicates.Add(1)
				}
				return next(ctx, req)
			}))
	}
	oh := sc.hosts[3]     // not the seed: it rejoins through it
	oh.cfg.ExportSize = 0 // every home on another host
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	seg, err := allocSpec(t.Context(), t, oh.daemon(), 64<<10, "replicas=2")
	require.NoError(t, err)
	id := seg.ID
	idle := func(p *core) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		_, running := p.replicating[id]
		return !running
	}
	// replicateOnce runs replicateLater on the segment and waits for it to
	// end; it returns the ABORTs and Replicates sent meanwhile.
	replicateOnce := func() (abort, replicate int64) {
		t.Helper()
		p := oh.daemon().pool
		a, r := aborts.Load(), replicates.Load()
		p.replicateLater(id)
		require.Eventually(t, func() bool { return idle(p) }, 30*time.Second, 10*time.Millisecond, "replicateLater does not end")
		return aborts.Load() - a, replicates.Load() - r
	}

	a, r := replicateOnce()
	require.Zero(t, a, "a segment just allocated was never sealed")
	require.GreaterOrEqual(t, r, int64(2), "both homes are told")

	sc.crash(sc.host(seg.Homes[1].Node))
	require.Eventually(t, func() bool {
		cur, ok := oh.daemon().pool.redundantRecord(id)
		return ok && cur.redundancyState() == poolv1.RedundancyState_REDUNDANCY_STATE_OK && cur.Homes[1].Node != seg.Homes[1].Node
	}, time.Minute, 10*time.Millisecond, "the backup is not rebuilt")
	rebuilt := oh.daemon().metrics.rebuilds.runs.WithLabelValues("ok")
	require.Eventually(t, func() bool {
		var m dto.Metric
		_ = rebuilt.Write(&m) // a counter's Write does not fail
		return m.GetCounter().GetValue() == 1 && idle(oh.daemon().pool)
	}, 30*time.Second, 10*time.Millisecond, "the rebuild (its fill's unseal included) does not end")
	a, r = replicateOnce()
	require.Zero(t, a, "the rebuild's fill unsealed the primary itself")
	require.GreaterOrEqual(t, r, int64(2))

	before := aborts.Load()
	crashed := errors.New("killed by the test")
	origin := oh.daemon()
	origin.failErr.Store(&crashed) // no leave: the others do not hear it go
	require.NoError(t, origin.Close())
	require.NoError(t, sc.start(oh))
	require.Eventually(t, func() bool { return aborts.Load() > before && idle(oh.daemon().pool) }, 30*time.Second, 10*time.Millisecond,
		"the restarted origin does not unseal the primary, which it cannot know unsealed")
	a, r = replicateOnce()
	require.Zero(t, a, "unsealed once after the restart")
	require.GreaterOrEqual(t, r, int64(2))
}

// TestUnsealPromotedBackup: a home move seals the backup that leaves
// (every copy of replicas is a writer to it), and an undo whose ABORTs
// did not reach that backup leaves it sealed, for unsealIdle to unseal
// (unsealHomes). Here the origin seals the backup of a replicas=2
// segment as such a move does and counts it as possibly sealed, as a
// start does; replicateLater then runs. When the primary's host crashes,
// the backup is promoted (no host is left to rebuild on, so no fill
// unseals it), and a write there is applied: unsealIdle did not take the
// segment for unsealed while its backup was sealed.
func TestUnsealPromotedBackup(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second, timing: fastDetection})
	oh := sc.hosts[2]     // not the seed
	oh.cfg.ExportSize = 0 // both homes on the other hosts, and nowhere to rebuild
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	seg, err := allocSpec(t.Context(), t, oh.daemon(), 64<<10, "replicas=2")
	require.NoError(t, err)
	id, primary, backup := seg.ID, seg.Homes[0], seg.Homes[1]
	origin := oh.daemon().pool
	pc, err := origin.homeSession(t.Context(), backup.Node, "backup")
	require.NoError(t, err)
	for _, phase := range []poolv1.MoveOutPhase{poolv1.MoveOutPhase_MOVE_OUT_TRACK, poolv1.MoveOutPhase_MOVE_OUT_SEAL} {
		_, err := moveOutAt(t.Context(), pc, backup.HomeID, phase, moveChunkMin)
		require.NoError(t, err, "%s at the backup", phase)
	}
	bp := sc.host(backup.Node).daemon().pool
	sealed := func() bool {
		bp.mu.Lock()
		defer bp.mu.Unlock()
		rec, ok := bp.segs[backup.HomeID]
		return ok && rec.Sealed
	}
	require.True(t, sealed())
	origin.moving.mightSeal(id)
	idle := func() bool {
		origin.mu.Lock()
		defer origin.mu.Unlock()
		_, running := origin.replicating[id]
		return !running
	}
	origin.replicateLater(id)
	require.Eventually(t, idle, 30*time.Second, 10*time.Millisecond, "replicateLater does not end")

	sc.crash(sc.host(primary.Node))
	require.Eventually(t, func() bool {
		cur, ok := origin.redundantRecord(id)
		return ok && cur.Homes[0].Node == backup.Node && cur.Homes[0].State == poolv1.HomeState_HOME_STATE_OK
	}, time.Minute, 10*time.Millisecond, "the backup is not promoted")
	require.Eventually(t, func() bool { return !sealed() }, 30*time.Second, 10*time.Millisecond,
		"the promoted backup stays sealed: every write to the segment is refused")
	cur, _ := origin.redundantRecord(id)
	c := homeConn(t, oh.daemon(), cur.Homes[0])
	require.NoError(t, c.Do(t.Context(), &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(cur.Homes[0]), Buf: []byte{1}}))
}
