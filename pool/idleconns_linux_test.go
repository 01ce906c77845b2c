package pool

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// TestIdlePeerSessionsClosed: a session with a peer that no segment needs
// is closed once nothing asked for it within peerIdle; the session with
// the home of a segment stays until the segment is freed, and a peer
// asked for again is dialed again.
func TestIdlePeerSessionsClosed(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second})
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	owner := sc.hosts[0].daemon().pool
	ctx := t.Context()
	seg, err := owner.Alloc(ctx, caller{}, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
	require.NoError(t, err)
	home := seg.Home
	other := sc.hosts[1].name
	if other == home {
		other = sc.hosts[2].name
	}
	// A session no segment needs: what a home opens to report a failed
	// forward to its origin, or a rebuild with a home it read from.
	_, err = owner.homeSession(ctx, other, "test")
	require.NoError(t, err)
	sessions := func() []string {
		owner.peers.mu.Lock()
		defer owner.peers.mu.Unlock()
		var out []string
		for node := range owner.peers.conns {
			out = append(out, node)
		}
		return out
	}
	require.ElementsMatch(t, []string{home, other}, sessions())

	owner.closeIdleConns(time.Now())
	require.ElementsMatch(t, []string{home, other}, sessions(), "both were asked for within peerIdle")
	owner.closeIdleConns(time.Now().Add(2 * peerIdle))
	require.ElementsMatch(t, []string{home}, sessions(), "the session with %s, which holds nothing of this node's, is closed; the home's stays", other)

	require.NoError(t, owner.Free(caller{}, seg.ID, ""))
	hd := sc.host(home).daemon().pool
	require.Eventually(t, func() bool {
		_, err := hd.Stat(seg.HomeID)
		return errors.Is(err, errs.ErrNotFound)
	}, 10*time.Second, 20*time.Millisecond, "the home frees the segment")
	owner.closeIdleConns(time.Now().Add(2 * peerIdle))
	require.Empty(t, sessions(), "with its segment freed, the home's session is closed too")

	// Needed again: dialed again, and placements work as before.
	seg, err = owner.Alloc(ctx, caller{}, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
	require.NoError(t, err)
	require.Contains(t, sessions(), seg.Home)
}

// TestIdlePushersClosed: a push's connections to its target are closed
// when the segment goes (freed at its home) without the move's COMMIT or
// ABORT, and when they have not pushed for pusherIdle.
func TestIdlePushersClosed(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 2, leaseTTL: 10 * time.Second})
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	owner, home := sc.hosts[0].daemon().pool, sc.hosts[1].daemon().pool
	ctx := t.Context()
	alloc := func() *record {
		r, err := owner.Alloc(ctx, caller{}, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
		require.NoError(t, err)
		require.Equal(t, sc.hosts[1].name, r.Home)
		return r
	}
	// A pusher of the home's segment, towards the home's own data plane
	// (dialed with its own credential): what a PUSH step sets up.
	push := func(r *record) *pusher {
		target := &poolv1.SegmentHome{Node: sc.hosts[1].name, DataAddr: home.dp.addr, HomeId: r.HomeID, Key: make([]byte, len(rdma.Key{}))}
		pu, err := home.pushing.get(ctx, r.HomeID, target, home.auth.self, moveTLS{}, false)
		require.NoError(t, err)
		require.Len(t, pu.conns, pushLanes)
		return pu
	}
	// closed waits for pu's connections to be closed: a pusher leaves
	// the table before its connections close (drop closes them after it
	// lets go of the table's lock).
	closed := func(pu *pusher) {
		t.Helper()
		for _, c := range pu.conns {
			require.Eventually(t, func() bool {
				return errors.Is(c.Read(ctx, pu.region, 0, make([]byte, 8)), rdma.ErrClosed)
			}, 10*time.Second, 10*time.Millisecond, "a read on a connection of the dropped pusher ends in ErrClosed")
		}
	}
	held := func() int {
		home.pushing.mu.Lock()
		defer home.pushing.mu.Unlock()
		return len(home.pushing.m)
	}

	freed, idle := alloc(), alloc()
	puFreed, puIdle := push(freed), push(idle)
	require.Equal(t, 2, held())

	require.NoError(t, owner.Free(caller{}, freed.ID, ""))
	require.Eventually(t, func() bool { return held() == 1 }, 10*time.Second, 20*time.Millisecond, "the freed segment's pusher is dropped")
	closed(puFreed)

	home.closeIdleConns(time.Now())
	require.Equal(t, 1, held(), "a pusher used within pusherIdle stays")
	home.closeIdleConns(time.Now().Add(2 * pusherIdle))
	require.Zero(t, held(), "an idle pusher is closed")
	closed(puIdle)

	// A later push dials again.
	puAgain := push(idle)
	require.Equal(t, 1, held())
	require.False(t, puAgain.reused)

	// A move that ends leaves its connections spare; the next push to the
	// same node with the same credential takes them, and spares left
	// unused for pusherIdle are closed.
	spares := func() int {
		home.pushing.mu.Lock()
		defer home.pushing.mu.Unlock()
		return len(home.pushing.spare[puAgain.lanes])
	}
	home.pushing.retire(idle.HomeID)
	require.Zero(t, held())
	require.Equal(t, pushLanes, spares())
	next := push(alloc())
	require.True(t, next.reused)
	require.ElementsMatch(t, puAgain.conns, next.conns, "the next push takes the spares")
	require.Zero(t, spares())
	home.pushing.retire(next.region.Segment)
	require.Equal(t, pushLanes, spares())
	home.closeIdleConns(time.Now())
	require.Equal(t, pushLanes, spares(), "spares left within pusherIdle stay")
	home.closeIdleConns(time.Now().Add(2 * pusherIdle))
	require.Zero(t, spares(), "spares left for pusherIdle are closed")
	closed(next)
}
