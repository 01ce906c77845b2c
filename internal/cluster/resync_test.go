package cluster

import (
	"log/slog"
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
	s0 := origin.Stats()
	w := watchWave(n, origin, func(_, to string) bool { return to == victim.name })
	require.NoError(t, origin.SetMeta(func(m *Meta) { m.Tiers[2].Free = want }))
	// The victim's resync must find the change at any peer it picks: a
	// node the wave missed (waitWave) gets it by a push/pull with the
	// origin, as it would by memberlist's periodic one.
	for _, c := range waitWave(t, w, cs, origin, s0.CapacityRepairs, victim, want) {
		t.Logf("the wave never reached %s; it exchanges state with the origin", c.name)
		_, err := c.Join(t.Context(), []string{origin.Self().Addr})
		require.NoError(t, err)
		require.True(t, sees(c, origin, want), "%s pulled the origin's state and still does not see the change", c.name)
	}
	require.False(t, sees(victim, origin, want), "the victim got a packet the filter should have dropped")
	require.Zero(t, victim.Stats().Resyncs)

	victim.onHandoffDrop() // what memberlist's "handler queue full" log line calls
	victim.onHandoffDrop() // a burst schedules one resync
	waitFor(t, "the victim sees the change", func() bool { return sees(victim, origin, want) })
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
