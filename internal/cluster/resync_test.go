package cluster

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/stretchr/testify/require"
)

// TestDroppedGossipIsResynced: a node misses every packet that carries a
// capacity update of the origin (as when its handler queue overflowed
// through the whole wave and the repairs), and push/pull is too rare to
// help. Once memberlist reports a dropped message, the node exchanges
// state with a peer and sees the change.
func TestDroppedGossipIsResynced(t *testing.T) {
	n := memnet.New(0)
	cs := startGossipOnlyCluster(t, n, 20)
	origin, victim := cs[7], cs[3]
	const want = 33 << 30
	mark := capacityMark(origin)
	n.Filter(func(_, to string, p []byte) bool {
		return to == victim.name && strings.Contains(string(p), mark)
	})
	require.NoError(t, origin.SetMeta(func(m *Meta) { m.Tiers[2].Free = want }))
	waitFor(t, "every node but the victim sees the change", func() bool {
		for _, c := range cs {
			if m, _ := c.Member(origin.name); c != victim && m.Meta.Tiers[2].Free != want {
				return false
			}
		}
		return true
	})
	m, _ := victim.Member(origin.name)
	require.NotEqual(t, int64(want), m.Meta.Tiers[2].Free, "the victim got a packet the filter should have dropped")
	require.Zero(t, victim.Stats().Resyncs)

	victim.onHandoffDrop() // what memberlist's "handler queue full" log line calls
	victim.onHandoffDrop() // a burst schedules one resync
	waitFor(t, "the victim sees the change", func() bool {
		m, _ := victim.Member(origin.name)
		return m.Meta.Tiers[2].Free == want
	})
	s := victim.Stats()
	require.Equal(t, uint64(2), s.HandoffDrops)
	require.Equal(t, uint64(1), s.Resyncs)
}

// TestHandoffDropLineIsSeen: the line memberlist v0.7.0 logs when its
// handler queue is full (in memberlist's net.go, ingestPacket: "[WARN]
// memberlist: handler queue full, dropping message (%d) %s") reaches
// onDrop through the logger the Cluster gives memberlist, once per line,
// and other lines do not.
// A memberlist upgrade that rewords it must update handoffFull.
func TestHandoffDropLineIsSeen(t *testing.T) {
	var drops int
	l := memberlistLogger(slog.New(slog.DiscardHandler), func() { drops++ })
	l.Printf("[WARN] memberlist: handler queue full, dropping message (%d) %s", 8, "from=10.0.0.7:7946")
	l.Printf("[DEBUG] memberlist: Stream connection %s", "from=10.0.0.7:7946")
	require.Equal(t, 1, drops)
}
