package pool

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
)

// TestRebalanceMeanCountsPeers: the cluster mean a node's rebalancer
// compares its rdma tier with counts only the members it holds a peer
// session with, which proves their name (their certificate's). Gossip
// members that hold the gossip key but no certificate, announcing an idle
// rdma tier, would drag the mean down until every node was over it by the
// threshold: each would move segments away for ever (a live move pauses
// its segment each time). Here three such members join a and b, both half
// used: a's mean stays b's and its own, nothing is over, and once a is
// fuller the mean is still theirs and a has bytes to move.
func TestRebalanceMeanCountsPeers(t *testing.T) {
	cfgA := clusterNodeConfig(t, "a")
	a := startNode(t, cfgA)
	b := startNode(t, clusterNodeConfig(t, "b"), a)
	ctx := t.Context()
	fill := func(d *Daemon, n int64) {
		_, err := d.pool.Alloc(ctx, peerCaller(t, d.pool, "x", 1), allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: "app"})
		require.NoError(t, err)
	}
	fill(a, 8<<20)
	fill(b, 8<<20)
	usedOf := func(tiers []cluster.TierFree) float64 {
		for _, t := range tiers {
			if t.Name == "rdma" {
				return float64(t.Capacity-t.Free) / float64(t.Capacity)
			}
		}
		return -1
	}
	require.Eventually(t, func() bool {
		m, ok := a.pool.cl.Member("b")
		return ok && usedOf(m.Meta.Tiers) == usedOf(b.pool.gossipTiers())
	}, 30*time.Second, 10*time.Millisecond, "a sees b's use")
	ub := usedOf(b.pool.gossipTiers())
	require.InDelta(t, 0.5, ub, 0.01)

	// The idle members: the gossip key, b's addresses, no certificate.
	bm := b.pool.gossip().Self().Meta
	keys, err := cfgA.gossipKeys()
	require.NoError(t, err)
	for i := range 3 {
		rc := cluster.DefaultConfig()
		rc.Name, rc.BindAddr, rc.BindPort, rc.Profile, rc.Keys = fmt.Sprintf("idle%d", i), "127.0.0.1", 0, cluster.ProfileLocal, keys
		rogue, err := cluster.New(rc, cluster.Meta{Proto: protoVersion, GRPCAddr: bm.GRPCAddr, DataAddr: bm.DataAddr,
			Tiers: []cluster.TierFree{{Name: "rdma", Capacity: 1 << 20, Free: 1 << 20}}})
		require.NoError(t, err)
		t.Cleanup(func() { rogue.Shutdown() })
		_, err = rogue.Join(ctx, []string{seedOf(t, a)})
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			m, ok := a.pool.cl.Member(rc.Name)
			return ok && m.State == cluster.StateAlive
		}, 10*time.Second, 10*time.Millisecond)
	}
	a.pool.meetPeers(ctx)
	require.NotNil(t, a.pool.peers.conn("b"), "a holds a session with b")
	for i := range 3 {
		require.Nil(t, a.pool.peers.conn(fmt.Sprintf("idle%d", i)), "its certificate names b")
	}

	ua, mean, excess := a.pool.rebalanceExcess(0.1)
	require.InDelta(t, 0.5, ua, 0.01)
	require.InDelta(t, (ua+ub)/2, mean, 1e-9, "the idle members count for nothing")
	require.Zero(t, excess, "a is not over the mean")

	fill(a, 6<<20)
	ua, mean, excess = a.pool.rebalanceExcess(0.1)
	require.Greater(t, ua, ub+0.3)
	require.InDelta(t, (ua+ub)/2, mean, 1e-9, "b counts")
	require.Positive(t, excess, "a is over the mean of a and b")

	// The session nothing else needs closes, idle: b proved its name once,
	// so it still counts, and the rebalancer does not dial it again.
	a.pool.peers.closeIdle([]string{"b"}, time.Now().Add(time.Second))
	require.Nil(t, a.pool.peers.conn("b"))
	a.pool.meetPeers(ctx)
	require.Nil(t, a.pool.peers.conn("b"), "a proven member is not dialed again")
	_, mean2, _ := a.pool.rebalanceExcess(0.1)
	require.InDelta(t, mean, mean2, 1e-9, "b still counts")
}
