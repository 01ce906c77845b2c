package cluster

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/stretchr/testify/require"
)

func TestBatchRoundTrip(t *testing.T) {
	capa := capUpdate{name: "n1", boot: 1, seq: 2, free: []int64{3}}.encode()
	leave := encodeLeave("n2", 4)
	b := encodeBatch([][]byte{capa, leave})
	msgs, ok := decodeBatch(b)
	require.True(t, ok)
	require.Equal(t, [][]byte{capa, leave}, msgs)

	for name, bad := range map[string][]byte{
		"truncated":          b[:len(b)-1],
		"a byte left over":   append(append([]byte{}, b...), 0),
		"a batch in a batch": encodeBatch([][]byte{b}),
		"an empty message":   {msgBatch, 1, 0},
		"count beyond bytes": {msgBatch, 3, 1, msgLeave},
		"not a batch":        capa,
		"empty":              {},
	} {
		msgs, ok := decodeBatch(bad)
		require.False(t, ok, name)
		require.Nil(t, msgs, name)
	}
}

// TestBroadcastQueueCrowded: the queue is crowded when messages wait
// from one look to the next and no gossip packet in between took all of
// them, whether memberlist offered too little room or none; the lane's own
// packets do not count as gossip that took them.
func TestBroadcastQueueCrowded(t *testing.T) {
	q := newBroadcastQueue(func() int { return 4 }, 3, time.Second)
	require.False(t, q.crowded(), "empty")
	msg := capUpdate{name: "n1", boot: 1, seq: 1, free: []int64{1 << 30}}.encode()
	q.queue(&gossipBroadcast{key: "cap/n1", msg: msg, seq: 1}, false)
	require.False(t, q.crowded(), "queued since the last look: it may not have met a gossip packet yet")
	require.True(t, q.crowded(), "queued for a whole period, and no gossip packet offered room")

	got, _ := q.get(3, len(msg)) // one byte short
	require.Empty(t, got)
	require.True(t, q.crowded(), "offered too little room")

	got, _ = q.overflow(laneLenOverhead, 1400)
	require.Len(t, got, 1)
	require.True(t, q.crowded(), "the lane took it, gossip did not")

	got, _ = q.get(3, 1400)
	require.Len(t, got, 1)
	require.False(t, q.crowded(), "a gossip packet took all that was queued")
	require.True(t, q.crowded(), "a new period: still queued, no gossip packet since")

	q.get(3, 1400)
	q.get(3, 1400) // the fourth transmission: done
	require.False(t, q.crowded(), "nothing queued")

	// The lane's transmissions count as gossip's do.
	q.queue(&gossipBroadcast{key: "cap/n1", msg: msg, seq: 2}, false)
	for range 4 {
		got, _ = q.overflow(laneLenOverhead, 1400)
		require.Len(t, got, 1)
	}
	queued, _ := q.stats()
	require.Zero(t, queued, "sent four times by the lane, and still queued")
}

// TestCrowdedGossipTakesTheLane: memberlist's own alive messages fill
// every gossip packet (15 nodes change their Meta four times a round,
// large Metas and small ones, so that the room they leave is smaller than
// the smallest of them), so the nodes' queues are crowded, and a node's
// capacity change must spread through their overflow lanes: the network
// drops every other packet that carries it. Every node sees the change,
// relayed by nodes whose own queues are as crowded. startGossipOnlyCluster
// runs no push/pull within a test, so nothing else brings it.
func TestCrowdedGossipTakesTheLane(t *testing.T) {
	n := memnet.New(0)
	cs := startGossipOnlyCluster(t, n, 16)
	origin := cs[0]
	// Eight tiers of large free bytes: the origin's update is about 90
	// bytes, a small Meta's alive message about 50.
	tiers := func(free int64) []TierFree {
		var ts []TierFree
		for i := range MaxTiers {
			ts = append(ts, TierFree{Name: fmt.Sprintf("tier-%d-%s", i, strings.Repeat("x", 9)), Capacity: 1 << 62, Free: free})
		}
		return ts
	}
	require.NoError(t, origin.SetMeta(func(m *Meta) { m.Tiers = tiers(1 << 61) }))
	waitFor(t, "every node sees the origin's eight tiers", func() bool {
		for _, c := range cs[1:] {
			if m, _ := c.Member(origin.name); len(m.Meta.Tiers) != MaxTiers {
				return false
			}
		}
		return true
	})

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		wg.Wait()
	}()
	round := origin.cfg.GossipInterval
	for i, c := range cs[1:] {
		wg.Go(func() {
			tick := time.NewTicker(round / 4)
			defer tick.Stop()
			for k := 0; ; k++ {
				err := c.SetMeta(func(m *Meta) {
					if i%2 == 0 {
						*m = Meta{Proto: 1, GRPCAddr: "h:1", DataAddr: "h:2", Zone: string(rune('a' + k%2))}
					} else {
						m.Tiers, m.Zone = tiers(1<<60), strings.Repeat(string(rune('a'+k%2)), MaxZone)
					}
				})
				if err != nil {
					t.Errorf("%s: SetMeta: %v", c.name, err)
					return
				}
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		})
	}
	time.Sleep(10 * round) // until every queue is full of them

	s0 := origin.Stats()
	lanes0 := uint64(0)
	for _, c := range cs[1:] {
		lanes0 += c.Stats().LanePackets
	}
	mark := capacityMark(origin)
	var mu sync.Mutex
	viaLane, dropped := map[string]bool{}, 0
	n.Filter(func(from, to string, p []byte) bool {
		if !strings.Contains(string(p), mark) {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		if lanePacket(p) {
			viaLane[to] = true
			return false
		}
		dropped++
		return true
	})
	const want = 1<<61 - 1
	require.NoError(t, origin.SetMeta(func(m *Meta) { m.Tiers[7].Free = want }))
	waitFor(t, "every node sees the origin's change", func() bool {
		for _, c := range cs[1:] {
			if m, _ := c.Member(origin.name); m.Meta.Tiers[7].Free != want {
				return false
			}
		}
		return true
	})
	s1 := origin.Stats()
	lanes := uint64(0)
	for _, c := range cs[1:] {
		lanes += c.Stats().LanePackets
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("the origin sent its update %d times, %d lane packets; the other nodes %d lane packets; %d nodes were sent it in one, %d gossip packets that carried it were dropped",
		s1.CapacitySends-s0.CapacitySends, s1.LanePackets-s0.LanePackets, lanes-lanes0, len(viaLane), dropped)
	require.Positive(t, s1.LanePackets-s0.LanePackets)
	require.Positive(t, lanes-lanes0, "no other node's lane relayed anything")
}

// lanePacket reports whether p, a packet as memberlist v0.7.0 sends it
// without compression or encryption, is an overflow lane packet: a user
// message (memberlist's type 8) that is a batch, after an optional CRC
// header (type 12 and four bytes).
func lanePacket(p []byte) bool {
	const userMsg, hasCrcMsg = 8, 12
	if len(p) > 5 && p[0] == hasCrcMsg {
		p = p[5:]
	}
	return len(p) > 2 && p[0] == userMsg && p[1] == msgBatch
}
