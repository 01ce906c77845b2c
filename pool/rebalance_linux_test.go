package pool

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/size"
)

// TestRebalanceSim: three lenders of 64 MiB with --rebalance (threshold
// 0.2) and an origin that lends nothing. While two of them drain, the
// origin's twelve 4 MiB segments all land on the third (75% used); once
// they stop draining, that node is 50 points above the cluster's mean and
// moves segments away, one at a time, until it is within the threshold
// and no segment fits in what is over half of it (it settles), and the
// others take them. Every segment keeps its id and its bytes.
func TestRebalanceSim(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second, timing: pushPullEverySecond})
	for i, h := range sc.hosts {
		h.cfg.GossipProfile = cluster.ProfileLocal
		h.cfg.ExportSize = 64 * size.MiB
		if i == 0 {
			h.cfg.ExportSize = 0
		}
		h.cfg.Rebalance, h.cfg.RebalanceThreshold = true, 0.2
	}
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()
	origin, full := sc.hosts[0].daemon(), sc.hosts[1]
	others := sc.hosts[2:]
	for _, h := range others {
		require.NoError(t, sc.drain(h, false))
	}
	require.Eventually(t, func() bool {
		for _, h := range others {
			if m, ok := origin.pool.cl.Member(h.name); !ok || !m.Meta.Draining {
				return false
			}
		}
		return true
	}, time.Minute, 10*time.Millisecond, "the drains are not gossiped")

	const segs, segSize = 12, 4 << 20
	ids := make([]uint64, segs)
	for i := range ids {
		r, err := origin.pool.Alloc(ctx, caller{}, allocRequest{Size: segSize, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
		require.NoError(t, err)
		require.Equal(t, full.name, r.Home)
		ids[i] = r.ID
		require.NoError(t, homeConn(t, origin, plainHome(*r)).Write(ctx, homeRegion(plainHome(*r)), 0, bytes.Repeat([]byte{byte(i + 1)}, 4096)))
	}
	_, used := rdmaUse(full.daemon())
	require.EqualValues(t, segs*segSize, used)
	// Nothing moves while the others drain: the mean is the full node's own.
	time.Sleep(2 * rebalanceScan)
	require.Len(t, sc.homedOn(full.name)[sc.hosts[0]], segs)

	for _, h := range others {
		require.NoError(t, sc.drain(h, true))
	}
	within := func() bool {
		u, _, excess := full.daemon().pool.rebalanceExcess(0.2)
		return excess == 0 && u < 0.75
	}
	require.Eventually(t, within, time.Minute, 50*time.Millisecond, "the full node does not come within the threshold")
	// Settled: no segment left fits in what is over half the threshold,
	// so the rebalancer has nothing more to move.
	require.Eventually(t, func() bool {
		_, _, excess := full.daemon().pool.rebalanceExcess(0.1)
		_, more := pickRebalance(full.daemon().pool.peerHeldItems(), excess, nil, time.Now())
		return !more
	}, time.Minute, 50*time.Millisecond, "the full node does not settle")
	moved := segs - len(sc.homedOn(full.name)[sc.hosts[0]])
	require.Positive(t, moved)
	u, mean, _ := full.daemon().pool.rebalanceExcess(0.2)
	t.Logf("moved %d of %d segments away; the node's rdma tier is %.0f%% used, the cluster's mean %.0f%%", moved, segs, 100*u, 100*mean)
	for _, h := range others {
		_, u := rdmaUse(h.daemon())
		require.Positive(t, u, "%s took none of the segments", h.name)
	}
	for i, id := range ids {
		r, err := origin.pool.Stat(id)
		require.NoError(t, err)
		require.False(t, r.Lost)
		got := make([]byte, 4096)
		require.NoError(t, homeConn(t, origin, plainHome(r)).Read(ctx, homeRegion(plainHome(r)), 0, got))
		require.Equal(t, bytes.Repeat([]byte{byte(i + 1)}, 4096), got, "segment %d at %s", id, r.Home)
	}
}

// plainHome is the home of r, a plain segment placed on a peer, as a
// homeRef: what homeConn and homeRegion take.
func plainHome(r record) homeRef {
	return homeRef{Node: r.Home, HomeID: r.HomeID, DataAddr: r.DataAddr, Key: r.Key, Epoch: r.Epoch}
}
