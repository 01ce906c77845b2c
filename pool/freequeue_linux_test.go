package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
)

// TestFreeQueue: frees at a peer queued by freeLater go out a few at a
// time, each segment once however often it is asked for; when the peer
// does not answer, the rest of its queue is dropped after the first
// batch's timeout (one timeout, not one per segment) and the peer is
// marked, and the reconcile once it answers frees them all.
func TestFreeQueue(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 2, leaseTTL: 10 * time.Second})
	var stall atomic.Bool
	var refuse atomic.Uint64  // a segment whose Free the home refuses
	var refuseAll atomic.Bool // the home refuses every Free
	var refusedCalls atomic.Int64
	var inFlight, most atomic.Int64
	var sent sync.Map // the segments whose Free the home was sent while it did not answer
	sc.hosts[1].cfg.sim.grpc = append(sc.hosts[1].cfg.sim.grpc, grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			if !strings.HasSuffix(info.FullMethod, "/Free") {
				return next(ctx, req)
			}
			if refuseAll.Load() {
				refusedCalls.Add(1)
				return nil, errs.ToStatus(fmt.Errorf("the test refuses every free: %w", errs.ErrLeaseExpired))
			}
			if req.(*poolv1.FreeRequest).Id == refuse.Load() {
				return nil, errs.ToStatus(fmt.Errorf("the test refuses this free: %w", errs.ErrInUse))
			}
			if !stall.Load() {
				return next(ctx, req)
			}
			sent.Store(req.(*poolv1.FreeRequest).Id, true)
			n := inFlight.Add(1)
			defer inFlight.Add(-1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-ctx.Done() // a home that does not answer
			return nil, ctx.Err()
		}))
	owner, home, kept, pc := startOwnerAndHome(t, sc)
	// From here on the home answers no Free: the reconcile that the new
	// session with it started may list the orphans below too.
	stall.Store(true)
	const n = 40
	orphans := orphansAt(t, pc, n)
	ps := owner.pool.peers
	for range 3 {
		for _, id := range orphans {
			ps.freeLater(home.cfg.Node, id)
		}
	}
	queued := func() (waiting, all int) {
		ps.mu.Lock()
		defer ps.mu.Unlock()
		if q := ps.frees[home.cfg.Node]; q != nil {
			return len(q.ids), len(q.queued)
		}
		return 0, 0
	}
	_, all := queued()
	require.Equal(t, n, all, "each segment is queued once")
	// The first batch times out, the rest of the queue is dropped and the
	// peer marked; the reconcile that follows (every few seconds while
	// the peer does not answer) queues the orphans again and sends a
	// batch of them.
	require.Eventually(t, func() bool { return owner.pool.orphans.marked(home.cfg.Node) }, 3*freeTimeout, 50*time.Millisecond,
		"a peer that does not answer is marked after the first batch's timeout")
	distinct := 0
	sent.Range(func(any, any) bool { distinct++; return true })
	require.LessOrEqual(t, distinct, 2*freeAtOnce, "a batch or two was sent, the rest put off")
	require.LessOrEqual(t, most.Load(), int64(freeAtOnce))
	for _, id := range orphans {
		_, err := home.pool.Stat(id)
		require.NoError(t, err, "unanswered: still held")
	}

	stall.Store(false)
	deadline := time.Now().Add(time.Minute)
	for _, id := range orphans {
		for {
			if _, err := home.pool.Stat(id); errors.Is(err, errs.ErrNotFound) {
				break
			}
			require.True(t, time.Now().Before(deadline), "orphan %d is still held a minute after the home answers again", id)
			time.Sleep(50 * time.Millisecond)
		}
	}
	_, err := home.pool.Stat(kept.HomeID)
	require.NoError(t, err, "the recorded segment stays")

	// A free the home answers with a refusal holds up none of the others
	// queued behind it, and is asked again.
	orphans = orphansAt(t, pc, 3*freeAtOnce)
	refuse.Store(orphans[0])
	for _, id := range orphans {
		ps.freeLater(home.cfg.Node, id)
	}
	gone := func(id uint64) bool {
		_, err := home.pool.Stat(id)
		return errors.Is(err, errs.ErrNotFound)
	}
	// One pass of the queue frees them: it is not dropped at the refusal.
	require.Eventually(t, func() bool { _, all := queued(); return all == 0 }, time.Minute, 10*time.Millisecond)
	for _, id := range orphans[1:] {
		require.True(t, gone(id), "segment %d, queued behind a refused free, is freed in the same pass", id)
	}
	require.False(t, gone(orphans[0]), "the refused one is held")
	refuse.Store(0)
	require.Eventually(t, func() bool { return gone(orphans[0]) }, time.Minute, 50*time.Millisecond, "the refused one, asked again")

	// A node that refuses a whole batch (this daemon's session there
	// ended, say) is not sent the rest: its queue waits for a reconcile.
	orphans = orphansAt(t, pc, 3*freeAtOnce)
	refuseAll.Store(true)
	for _, id := range orphans {
		ps.freeLater(home.cfg.Node, id)
	}
	require.Eventually(t, func() bool { _, all := queued(); return refusedCalls.Load() > 0 && all == 0 }, time.Minute, 5*time.Millisecond)
	require.Less(t, refusedCalls.Load(), int64(len(orphans)), "the queue stops at a batch refused whole")
	refuseAll.Store(false)
	for _, id := range orphans {
		require.Eventually(t, func() bool { return gone(id) }, time.Minute, 50*time.Millisecond, "segment %d, once the node takes frees again", id)
	}
}

// startOwnerAndHome starts sc's two hosts and places a persistent
// segment of the first's (owner) on the second (home), which opens the
// owner's peer session there (pc).
func startOwnerAndHome(t *testing.T, sc *simCluster) (owner, home *Daemon, kept *record, pc *session.Conn) {
	t.Helper()
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	owner, home = sc.hosts[0].daemon(), sc.hosts[1].daemon()
	kept, err = owner.pool.Alloc(t.Context(), caller{}, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
	require.NoError(t, err)
	require.Equal(t, home.cfg.Node, kept.Home)
	pc = owner.pool.peers.conn(home.cfg.Node)
	require.NotNil(t, pc)
	return owner, home, kept, pc
}

// orphansAt allocates n segments at pc's node for its daemon, through its
// own session, that no record at the daemon names: orphans.
func orphansAt(t *testing.T, pc *session.Conn, n int) []uint64 {
	t.Helper()
	var ids []uint64
	for range n {
		cctx, _, err := pc.Call(t.Context())
		require.NoError(t, err)
		seg, err := pc.API().Alloc(cctx, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true})
		require.NoError(t, err)
		ids = append(ids, seg.Id)
	}
	return ids
}
