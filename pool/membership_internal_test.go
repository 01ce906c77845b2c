package pool

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
)

func TestCapacityMoved(t *testing.T) {
	const c = 64 << 20 // one announceStep is 1 MiB
	rdma := func(free int64) []cluster.TierFree {
		return []cluster.TierFree{{Name: "rdma", Capacity: c, Free: free}}
	}
	for _, tc := range []struct {
		name       string
		last, now  []cluster.TierFree
		wantGossip bool
	}{
		{"first announcement", nil, rdma(c), true},
		{"unchanged", rdma(c), rdma(c), false},
		{"less than a step", rdma(c), rdma(c - 1<<20 + 1), false},
		{"one step down", rdma(c), rdma(c - 1<<20), true},
		{"one step up", rdma(c - 1<<20), rdma(c), true},
		{"full", rdma(1 << 10), rdma(0), true},
		{"no longer full", rdma(0), rdma(1 << 10), true},
		{"capacity changed", rdma(c), []cluster.TierFree{{Name: "rdma", Capacity: 2 * c, Free: c}}, true},
		{"tier added", rdma(c), append(rdma(c), cluster.TierFree{Name: "cxl", Capacity: c, Free: c}), true},
		{"tier renamed", rdma(c), []cluster.TierFree{{Name: "cxl", Capacity: c, Free: c}}, true},
		{"tiny tier, any change", []cluster.TierFree{{Name: "cxl", Capacity: 10, Free: 10}}, []cluster.TierFree{{Name: "cxl", Capacity: 10, Free: 9}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.wantGossip, capacityMoved(tc.last, tc.now))
		})
	}
}

// TestAnnounceBeforeJoin: a node whose own seeds never answer, but which
// another node joined, still gossips its capacity changes. Its join
// attempts go on beside the announcements; they used to come first, and
// such a node never announced anything (in the 200-host simulation a host
// whose first joins timed out on a busy seed kept its capacity to itself).
func TestAnnounceBeforeJoin(t *testing.T) {
	// a's only seed is a port nobody listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	deadSeed := l.Addr().String()
	require.NoError(t, l.Close())

	cfgA := clusterNodeConfig(t, "a")
	cfgA.Join = []string{deadSeed}
	a, err := Start(cfgA, nil)
	require.NoError(t, err)
	defer a.Close()
	b := startNode(t, clusterNodeConfig(t, "b"), a)

	cxlFree := func(m cluster.Member) int64 {
		tf, _ := m.Meta.Tier("cxl")
		return tf.Free
	}
	require.Eventually(t, func() bool {
		m, ok := b.pool.gossip().Member("a")
		return ok && m.State == cluster.StateAlive && cxlFree(m) > 0
	}, 20*time.Second, 20*time.Millisecond, "b never listed a alive")

	_, err = a.pool.Alloc(context.Background(), caller{}, allocRequest{Size: 4 << 20, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.NoError(t, err)
	want := gossipFree(a.pool, "cxl")
	require.Eventually(t, func() bool {
		m, ok := b.pool.gossip().Member("a")
		return ok && cxlFree(m) == want
	}, 20*time.Second, 20*time.Millisecond, "b never saw a's cxl free bytes move to %d", want)
}

// gossipFree is the free bytes of tier that p gossips; -1 without it.
func gossipFree(p *core, tier string) int64 {
	for _, t := range p.gossipTiers() {
		if t.Name == tier {
			return t.Free
		}
	}
	return -1
}
