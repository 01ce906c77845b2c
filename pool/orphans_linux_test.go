package pool

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// TestRestartAsksEveryPeer: a segment a peer holds for a daemon that no
// record of the daemon names (an allocation whose answer was lost when
// the daemon went down) is freed once the daemon restarts, although it
// has no record on that peer and so no reason to open a session there:
// a restarted daemon asks each peer what it holds for it at its first
// sight of it. Otherwise it would wait for the peer lease (minutes).
func TestRestartAsksEveryPeer(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: time.Second, timing: fastDetection})
	origin := sc.hosts[2]
	origin.cfg.ExportSize = 0 // its segments go to the two peers
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()
	o := origin.daemon().pool
	seg, err := o.Alloc(ctx, caller{}, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
	require.NoError(t, err, "a record, so that the daemon's store is not a fresh one")
	var other *simHost
	for _, h := range sc.hosts[:2] {
		if h.name != seg.Home {
			other = h
		}
	}
	sc.crash(origin)
	// The orphan: allocated on the other peer for the origin, unrecorded,
	// as when the origin went down before the answer came. It is made
	// while the origin is down: made before, any check of the origin's
	// that ran first (a reconcile after a mark, the judgment of a peer
	// whose death a loaded machine made up) would free it, rightly.
	op := other.daemon().pool
	lost := sessionCaller(t, op, "answer-lost", peerClientPrefix+origin.name, 0, 0)
	orphan, err := op.Alloc(ctx, lost, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true})
	require.NoError(t, err)
	op.closeSession("answer-lost")
	require.Contains(t, sc.heldFor(origin.name)[other.name], orphan.ID)

	sc.net.Heal()
	require.NoError(t, sc.start(origin))
	require.Eventually(t, func() bool {
		return !slices.Contains(sc.heldFor(origin.name)[other.name], orphan.ID)
	}, 30*time.Second, 50*time.Millisecond, "the restarted daemon frees what the peer holds for it and no record names")
	r, err := origin.daemon().pool.Stat(seg.ID)
	require.NoError(t, err)
	require.False(t, r.Lost, "the recorded segment is kept")
	require.Contains(t, sc.heldFor(origin.name)[seg.Home], seg.HomeID)
}
