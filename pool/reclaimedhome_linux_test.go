package pool

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
)

// reclaimAt frees home h of a redundant segment at its node as the node
// does when the origin's lease there runs out (sessions.go, reap): the
// origin is not told, and finds out only by asking the node.
func reclaimAt(t *testing.T, sc *simCluster, h homeRef) {
	t.Helper()
	require.True(t, reclaimHere(sc.host(h.Node).daemon().pool, h.HomeID, "lease expired"), "the home on %s", h.Node)
}

// reclaimHere frees segment id of p, if p holds it, as the lease of its
// owner running out does, and reports whether p held it.
func reclaimHere(p *core, id uint64, reason string) bool {
	p.mu.Lock()
	r := p.segs[id]
	if r == nil {
		p.mu.Unlock()
		return false
	}
	if _, err := p.unlinkFreed(r); err != nil {
		p.mu.Unlock()
		return false
	}
	p.mu.Unlock()
	p.dispose(reason, r)
	return true
}

// TestHomeJudgedWhileSegmentLost: an ec=4+2 segment loses both parity
// homes (crashed), then a partition cuts its origin off from every data
// home: the first one it hears dead is kept (UNREACHABLE) and the segment
// is lost for now, waiting for it. The other data homes' deaths are judged
// all the same, and while the partition lasts two of their nodes reclaim
// their shards (the origin's lease there ran out). At the heal the homes
// that return with their shard are OK again, and the two that return
// without are lost: the segment stays lost, never restored with a home
// that no longer holds its shard. Judged only for a segment not lost, the
// two stayed OK through the partition and the segment came back naming
// them.
func TestHomeJudgedWhileSegmentLost(t *testing.T) {
	sc := redundantCluster(t, 7, fastDetection, true)
	oh := sc.hosts[0]
	origin := oh.daemon()
	seg, err := allocSpec(t.Context(), t, origin, 64<<10, "ec=4+2")
	require.NoError(t, err)
	ec := *seg
	state := func() record {
		r, ok := origin.pool.redundantRecord(ec.ID)
		require.True(t, ok)
		return r
	}
	sc.crash(sc.host(ec.Homes[4].Node))
	sc.crash(sc.host(ec.Homes[5].Node))
	require.Eventually(t, func() bool { r := state(); return r.homesIn(poolv1.HomeState_HOME_STATE_LOST) == 2 }, time.Minute, 10*time.Millisecond,
		"the parity homes are not marked lost: %s", homesString(state().Homes))
	require.False(t, state().Lost)

	var others []*simHost
	for _, h := range sc.up() {
		if h != oh {
			others = append(others, h)
		}
	}
	sc.partition([]*simHost{oh}, others)
	dead := func(node string) bool {
		m, ok := origin.pool.cl.Member(node)
		return ok && m.State != cluster.StateAlive
	}
	require.Eventually(t, func() bool {
		return state().Lost && !slices.ContainsFunc(ec.Homes[:4], func(h homeRef) bool { return !dead(h.Node) })
	}, time.Minute, 10*time.Millisecond, "the origin does not list the data homes dead, the segment lost: %s", homesString(state().Homes))
	reclaimAt(t, sc, ec.Homes[1])
	reclaimAt(t, sc, ec.Homes[2])

	sc.net.Heal()
	require.Eventually(t, func() bool {
		r := state()
		return !slices.ContainsFunc(ec.Homes[:4], func(h homeRef) bool { return dead(h.Node) }) &&
			r.homesIn(poolv1.HomeState_HOME_STATE_UNREACHABLE) == 0
	}, time.Minute, 10*time.Millisecond, "the data homes' return is not judged: %s", homesString(state().Homes))
	r := state()
	require.Equal(t, poolv1.HomeState_HOME_STATE_LOST, r.Homes[1].State, "returned without its shard: %s", homesString(r.Homes))
	require.Equal(t, poolv1.HomeState_HOME_STATE_LOST, r.Homes[2].State, "returned without its shard: %s", homesString(r.Homes))
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, r.Homes[0].State, "returned with its shard: %s", homesString(r.Homes))
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, r.Homes[3].State, "returned with its shard: %s", homesString(r.Homes))
	require.True(t, r.Lost, "two shards of six are left")
}

// TestReclaimedSourceLost: a data home of an ec=4+2 segment is reclaimed
// at its node without the origin knowing (its lease there ran out while
// a partition cut them off, after the origin last judged the home). When
// another data home crashes, the rebuild's steps (and the origin's
// replicate) at the reclaimed home answer that it has no such segment: the
// origin asks the node what it holds, marks the home lost, and rebuilds
// both shards from the four left, rather than retry a step the home can
// never take. Every shard then holds the code of the bytes written.
func TestReclaimedSourceLost(t *testing.T) {
	rs := newRedundantSim(t, 9, 64<<10, func(*simHost) {})
	origin, ec := rs.oh.daemon(), rs.ec
	reclaimAt(t, rs.sc, ec.Homes[1])
	victim, crashed := rs.crashShard0(t, false)
	whole := func() bool {
		r, _ := origin.pool.redundantRecord(rs.ecID)
		return !slices.ContainsFunc(r.Homes, func(h homeRef) bool {
			was := func(x homeRef) bool { return h.Node == x.Node && h.HomeID == x.HomeID }
			return h.State != poolv1.HomeState_HOME_STATE_OK || was(ec.Homes[0]) || was(ec.Homes[1])
		})
	}
	for deadline := time.Now().Add(time.Minute); !whole(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			r, _ := origin.pool.redundantRecord(rs.ecID)
			t.Fatalf("data shards 0 and 1 are not rebuilt: %s", homesString(r.Homes))
		}
	}
	t.Logf("data shard 0 (on %s, crashed) and 1 (reclaimed on %s) rebuilt %v after the crash", victim, ec.Homes[1].Node, time.Since(crashed).Round(time.Millisecond))
	rs.checkShards(t)
}

// TestMoveHomeTargetGoneAtSwitch: the backup of a replicas=2 segment is
// lost (its host crashed; no rebuild here), and the primary's host
// evacuates: the origin moves the primary to the one host left, fills the
// new copy and switches the record to it, the writers sealed. The new
// copy is gone when the switch's Replicate reaches it (its node no longer
// holds it), so the origin marks it lost and the segment has no OK copy
// left. The leaving primary holds every acknowledged write (the writers
// are sealed from before the switch until the move lets it go): it takes
// its place back, and the segment is not lost. Let go as for a move that
// succeeded, the data was gone for good.
func TestMoveHomeTargetGoneAtSwitch(t *testing.T) {
	ls := newLostBackupSim(t)
	var armed atomic.Bool
	armed.Store(true)
	ls.arm(func(h *simHost, req *poolv1.ReplicateRequest) error {
		armed.Store(false)
		return freeCopy(h, req)
	})
	err := ls.movePrimary(t)
	t.Logf("the move: %v", err)
	require.False(t, armed.Load(), "the switch's Replicate did not reach the new copy")
	ls.checkLeavingServes(t)
}

// TestHomeMissingUnmarked: homeMissing reports a home marked lost only
// when the record says so. A home whose node no longer holds it, found
// while the origin's store cannot commit, is still OK in the record:
// reported marked, the rebuild looked again at once (errRebuildAgain, no
// backoff) and found it again, a List at its node and an error logged
// each time, for as long as the store failed.
func TestHomeMissingUnmarked(t *testing.T) {
	sc := redundantCluster(t, 7, fastDetection, true)
	origin := sc.hosts[0].daemon()
	seg, err := allocSpec(t.Context(), t, origin, 64<<10, "ec=4+2")
	require.NoError(t, err)
	h := seg.Homes[1]
	reclaimAt(t, sc, h)
	require.NoError(t, origin.pool.st.db.Close()) // every commit fails from now on
	notFound := fmt.Errorf("rebuild segment %d: TRACK at %s: %w", seg.ID, h.Node, errs.ErrNotFound)
	marked := origin.pool.homeMissing(t.Context(), seg.ID, h, notFound)
	r, ok := origin.pool.redundantRecord(seg.ID)
	require.True(t, ok)
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, r.Homes[1].State, "the store commits nothing")
	require.False(t, marked, "homeMissing reports a home marked lost that the record still names OK")
}
