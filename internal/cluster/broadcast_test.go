package cluster

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/stretchr/testify/require"
)

// TestBroadcastQueueLosesNothing drives the queue as a relaying node at
// 200 nodes does, with messages of one length (as capacity updates are)
// under many keys, and packets with more or less room: every message goes
// out exactly limit times unless a newer one with its key replaced it,
// and every message is finished. memberlist's TransmitLimitedQueue (v0.7.0)
// loses a few in a thousand of them this way.
func TestBroadcastQueueLosesNothing(t *testing.T) {
	const limit = 12
	for _, room := range []int{60, 200, 1400} {
		t.Run(fmt.Sprint(room), func(t *testing.T) {
			q := newBroadcastQueue(func() int { return limit }, 3, time.Second)
			rnd := rand.New(rand.NewPCG(uint64(room), 1))
			type msg struct {
				b        *gossipBroadcast
				sends    int
				replaced bool
			}
			var all []*msg
			byBody := map[string]*msg{}
			current := map[string]*msg{}
			collect := func(msgs [][]byte) {
				for _, b := range msgs {
					m := byBody[string(b)]
					require.NotNil(t, m, "a message nobody queued: %q", b)
					m.sends++
				}
			}
			for i := range 5000 {
				for k := rnd.IntN(4); k > 0; k-- {
					key := fmt.Sprintf("cap/h%04d", rnd.IntN(50))
					body := fmt.Sprintf("%s#%08d", key, i*4+k)
					m := &msg{b: &gossipBroadcast{key: key, msg: []byte(body + strings.Repeat(".", 50-len(body))), sent: make(chan struct{})}}
					if old := current[key]; old != nil && old.sends < limit {
						old.replaced = true
					}
					current[key] = m
					all = append(all, m)
					byBody[string(m.b.msg)] = m
					q.queue(m.b, false)
				}
				for range 3 {
					msgs, _ := q.get(3, 20+rnd.IntN(room))
					collect(msgs)
				}
			}
			for n, _ := q.stats(); n > 0; n, _ = q.stats() {
				msgs, _ := q.get(3, 1<<20)
				collect(msgs)
			}
			for _, m := range all {
				if !m.replaced {
					require.Equal(t, limit, m.sends, "%s was sent %d times", m.b.msg, m.sends)
				}
				require.LessOrEqual(t, m.sends, limit)
				select {
				case <-m.b.sent:
				default:
					t.Fatalf("%s was never finished", m.b.msg)
				}
			}
		})
	}
}

// TestBroadcastQueueOrder: the fewest transmissions first and the newest
// first among those; a message that does not fit makes room for smaller
// ones; an older capacity update never replaces a newer one queued.
func TestBroadcastQueueOrder(t *testing.T) {
	q := newBroadcastQueue(func() int { return 3 }, 1, time.Second)
	bc := func(key, msg string, seq uint64) *gossipBroadcast {
		return &gossipBroadcast{key: key, msg: []byte(msg), seq: seq}
	}
	q.queue(bc("a", "a1", 1), false)
	msgs, _ := q.get(0, 100)
	require.Equal(t, [][]byte{[]byte("a1")}, msgs)
	q.queue(bc("b", "b1", 1), false)
	q.queue(bc("c", "c1-long", 1), false)
	msgs, _ = q.get(0, 100)
	require.Equal(t, [][]byte{[]byte("c1-long"), []byte("b1"), []byte("a1")}, msgs, "fewest transmissions first, newest first")
	msgs, _ = q.get(0, 3)
	require.Equal(t, [][]byte{[]byte("b1")}, msgs, "c1-long does not fit, b1 does, a1 no more")

	q.queue(bc("b", "b3", 3), false)
	q.queue(bc("b", "b2", 2), false)
	msgs, _ = q.get(0, 100)
	require.Equal(t, [][]byte{[]byte("b3"), []byte("c1-long"), []byte("a1")}, msgs, "b2 is older than b3")

	leave := &gossipBroadcast{key: "leave/me", msg: []byte("bye"), sent: make(chan struct{})}
	q.queue(leave, false)
	for range 3 {
		_, _ = q.get(0, 100)
	}
	_, ok := <-leave.sent
	require.False(t, ok, "a leave announcement's channel is closed once it went out limit times")
	n, _ := q.stats()
	require.Zero(t, n)
}

// TestBroadcastQueueRepairsOwnUpdate: once the node's own capacity update
// has gone out limit times, it goes out again to fanout peers after each
// of repairRounds, then no more; a newer update starts over.
func TestBroadcastQueueRepairsOwnUpdate(t *testing.T) {
	const limit, fanout, round = 6, 2, time.Second
	q := newBroadcastQueue(func() int { return limit }, fanout, round)
	clock := time.Unix(1000, 0)
	q.now = func() time.Time { return clock }
	sends := func() int {
		total := 0
		for {
			msgs, own := q.get(0, 100)
			require.Equal(t, len(msgs), own)
			if own == 0 {
				return total
			}
			total += own
		}
	}
	q.queue(&gossipBroadcast{key: "cap/me", msg: []byte("u1"), seq: 1}, true)
	require.Equal(t, limit, sends())
	for i, r := range repairRounds {
		clock = clock.Add(time.Duration(r-1) * round)
		require.Zero(t, sends(), "repair %d not due yet", i+1)
		clock = clock.Add(round)
		require.Equal(t, fanout, sends(), "repair %d", i+1)
		_, repaired := q.stats()
		require.Equal(t, uint64(i+1), repaired)
	}
	clock = clock.Add(1000 * round)
	require.Zero(t, sends(), "no repair after the last")

	q.queue(&gossipBroadcast{key: "cap/me", msg: []byte("u2"), seq: 2}, true)
	q.queue(&gossipBroadcast{key: "cap/me", msg: []byte("u1"), seq: 1}, true)
	require.Equal(t, limit, sends(), "the newer update, not the older")
	clock = clock.Add(time.Duration(repairRounds[0]) * round)
	msgs, own := q.get(0, 100)
	require.Equal(t, [][]byte{[]byte("u2")}, msgs)
	require.Equal(t, 1, own)
}

// TestLostCapacityWaveIsRepaired: every packet that carries a node's
// capacity update is lost until the node has sent it as often as gossip
// sends a broadcast, so that no peer hears of the change; push/pull is
// too rare to help. The node's repair sends it again, the peers it reaches
// pass it on, and every node sees the change, but for a node the repaired
// wave never reached, which happens in about one run of 8,500 (waitWave).
// Failure detection sees nothing amiss (no link is cut), so no refutation
// carries the new Meta either.
func TestLostCapacityWaveIsRepaired(t *testing.T) {
	n := memnet.New(0)
	cs := startGossipOnlyCluster(t, n, 20)
	origin := cs[7]
	const want = 33 << 30
	// What cs[0] last got from memberlist for the origin: its Meta as the
	// last alive message carried it.
	raw := func() []byte {
		cs[0].mu.Lock()
		defer cs[0].mu.Unlock()
		return cs[0].members[origin.name].raw
	}
	before := raw()
	s0 := origin.Stats()
	first := watchWave(n, origin, func(from, _ string) bool { return from == origin.name })
	require.NoError(t, origin.SetMeta(func(m *Meta) { m.Tiers[2].Free = want }))
	// The wave is limit transmissions, a packet each. The queue is empty
	// once the last packet is built, before memberlist writes it: wait
	// until the filter has dropped them all, or the last one could pass
	// the filter that follows.
	waitFor(t, "the first wave is over and lost", func() bool {
		return first.lost() >= origin.bcast.limit()
	})
	w := watchWave(n, origin, nil)
	for _, c := range cs {
		if c != origin {
			require.False(t, sees(c, origin, want), "%s saw the change although its wave was lost", c.name)
		}
	}
	missed := waitWave(t, w, cs, origin, s0.CapacityRepairs, nil, want)
	require.Greater(t, origin.Stats().CapacityRepairs, s0.CapacityRepairs)
	var relayed []string
	for _, c := range cs {
		if c != origin && sees(c, origin, want) && w.count(origin.name, c.name) == 0 {
			relayed = append(relayed, c.name)
		}
	}
	require.NotEmpty(t, relayed, "only the peers the origin repaired have the change: they did not pass it on")
	for _, c := range missed {
		t.Logf("the repaired wave never reached %s: no node that had the change sent it a packet carrying it; push/pull would bring it", c.name)
	}
	require.Equal(t, before, raw(), "no alive message (a refutation) brought the change")
}
