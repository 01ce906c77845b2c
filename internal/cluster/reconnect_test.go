package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/cluster/memnet"
)

// TestPartitionHealsWithoutSeeds: two halves that declared each other dead
// and then forgot each other (GossipToTheDeadTime) meet again once the
// network heals, with nobody joining anybody: each node contacts the
// members it saw die. memberlist alone never would: it neither probes nor
// pushes its state to a dead member, and after GossipToTheDeadTime it does
// not gossip to one either.
func TestPartitionHealsWithoutSeeds(t *testing.T) {
	n := memnet.New(0)
	cs := make([]*Cluster, 4)
	for i := range cs {
		cs[i] = startMemTuned(t, n, fmt.Sprintf("n%d", i), func(cfg *Config) { cfg.GossipToTheDeadTime = time.Second })
	}
	for _, c := range cs[1:] {
		_, err := c.Join(t.Context(), []string{cs[0].Self().Addr})
		require.NoError(t, err)
	}
	waitAllAlive(t, cs)

	n.Cut("n0", "n2", "n3")
	n.Cut("n1", "n2", "n3")
	waitFor(t, "each half lists the other dead", func() bool {
		for _, c := range cs {
			if c.Stats().Alive != 2 {
				return false
			}
		}
		return true
	})
	// Past GossipToTheDeadTime and the reap: the halves no longer list
	// each other at all.
	waitFor(t, "each half forgot the other", func() bool {
		return stateOn(cs[0], "n2") == "absent" && stateOn(cs[2], "n0") == "absent"
	})
	n.Heal()
	waitAllAlive(t, cs)
	var contacted uint64
	for _, c := range cs {
		contacted += c.Stats().Reconnected
	}
	require.NotZero(t, contacted, "some node contacted a member it saw die")
}

// TestFailedMembersKept: a member declared dead is contacted again on a
// doubling schedule, up to reconnectMax; one that comes back or leaves is
// not; reconnectFor after its death it is forgotten.
func TestFailedMembersKept(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	c := &Cluster{name: "self", log: slog.New(slog.DiscardHandler), members: map[string]*record{}, now: func() time.Time { return now }}
	dead := &record{m: Member{Name: "a", Addr: "10.0.0.1:7946", State: StateAlive}}
	c.members["a"] = dead
	c.onGone("a")
	require.Contains(t, c.failed, "a")
	_, _, ok := c.dueFailed(now)
	require.False(t, ok, "not due at once")
	var gaps []time.Duration
	last := now
	for at := now; at.Before(now.Add(10 * time.Minute)); at = at.Add(100 * time.Millisecond) {
		if name, addr, ok := c.dueFailed(at); ok {
			require.Equal(t, "a", name)
			require.Equal(t, "10.0.0.1:7946", addr)
			gaps = append(gaps, at.Sub(last))
			last = at
		}
	}
	require.GreaterOrEqual(t, len(gaps), 5)
	require.InDelta(t, reconnectFirst.Seconds(), gaps[0].Seconds(), reconnectFirst.Seconds()/2+0.1)
	for i, g := range gaps[1:] {
		want := min(reconnectFirst<<(i+1), reconnectMax)
		require.InDelta(t, want.Seconds(), g.Seconds(), want.Seconds()/2+0.1, "contact %d", i+2)
	}
	_, _, ok = c.dueFailed(now.Add(reconnectFor + time.Minute))
	require.False(t, ok)
	require.NotContains(t, c.failed, "a", "forgotten after reconnectFor")

	// Back alive: no longer contacted. Left: never contacted.
	c.onGone("a")
	require.NotContains(t, c.failed, "a", "dead already: nothing changed")
	c.onAlive("a", "10.0.0.1:7946", nil)
	c.onGone("a")
	require.Contains(t, c.failed, "a")
	c.onAlive("a", "10.0.0.1:7946", nil)
	require.NotContains(t, c.failed, "a")
	c.members["a"].m.Leaving = true
	c.onGone("a")
	require.Equal(t, StateLeft, c.members["a"].m.State)
	require.NotContains(t, c.failed, "a")
}

// TestLabelSeparatesClusters: a node joins only nodes with its own label
// (none is a label of its own), also when it contacts a failed member's
// address that another cluster's node now holds; nodes of one label talk
// as without one. A label is at most 255 bytes.
func TestLabelSeparatesClusters(t *testing.T) {
	n := memnet.New(0)
	label := func(l string) func(*Config) { return func(cfg *Config) { cfg.Label = l } }
	a := startMemTuned(t, n, "a", label("farm-1"))
	b := startMemTuned(t, n, "b", label("farm-1"))
	other := startMemTuned(t, n, "other", label("farm-2"))
	bare := startMemTuned(t, n, "bare", nil)
	_, err := b.Join(t.Context(), []string{a.Self().Addr})
	require.NoError(t, err)
	waitAllAlive(t, []*Cluster{a, b})
	for _, c := range []*Cluster{other, bare} {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_, err := c.Join(ctx, []string{a.Self().Addr})
		cancel()
		require.ErrorIs(t, err, ErrNoSeed, "%s joins no node labelled farm-1", c.name)
	}
	_, err = a.ml.Join([]string{other.Self().Addr, bare.Self().Addr})
	require.Error(t, err, "nor does a node labelled farm-1 reach them (a reconnect contact is such a Join)")
	time.Sleep(500 * time.Millisecond) // gossip rounds in which a wrongly admitted node would show
	for _, c := range []*Cluster{a, b} {
		require.Len(t, c.Members(), 2, "%s lists only its cluster", c.name)
	}
	for _, c := range []*Cluster{other, bare} {
		require.Len(t, c.Members(), 1, "%s lists only itself", c.name)
	}
	require.Equal(t, 2+len("farm-1"), labelOverhead("farm-1"))

	_, err = New(Config{Name: "x", Label: strings.Repeat("l", 256)}, testMeta("x"))
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "Label is 256 bytes")
}

// TestLabelDropsPackets: a node labelled farm-1 drops gossip packets that
// carry no label or another one. A third party sends a, over the packet
// transport, a dead message about b (the highest incarnation, from a node
// a has never heard of): unlabelled and labelled farm-2 it changes
// nothing; the same message labelled farm-1 has a declare b dead, which
// shows the message is one a would act on.
func TestLabelDropsPackets(t *testing.T) {
	n := memnet.New(0)
	label := func(cfg *Config) { cfg.Label = "farm-1" }
	a := startMemTuned(t, n, "a", label)
	b := startMemTuned(t, n, "b", label)
	_, err := b.Join(t.Context(), []string{a.Self().Addr})
	require.NoError(t, err)
	waitAllAlive(t, []*Cluster{a, b})
	mallory, err := n.NewTransport("mallory")
	require.NoError(t, err)
	defer mallory.Shutdown()

	// memberlist's deadMsg (type 5) with its msgpack body, as memberlist
	// encodes it: a map of the struct's field names.
	dead := []byte{5, 0x83,
		0xab, 'I', 'n', 'c', 'a', 'r', 'n', 'a', 't', 'i', 'o', 'n', 0xce, 0xff, 0xff, 0xff, 0xff,
		0xa4, 'N', 'o', 'd', 'e', 0xa1, 'b',
		0xa4, 'F', 'r', 'o', 'm', 0xa7, 'm', 'a', 'l', 'l', 'o', 'r', 'y'}
	labelled := func(l string) []byte { // memberlist's hasLabelMsg header
		return append(append([]byte{244, byte(len(l))}, l...), dead...)
	}
	bAt := func() memberlist.NodeStateType {
		for _, m := range a.Members() {
			if m.Name == "b" {
				return m.State
			}
		}
		return memberlist.StateLeft
	}
	for _, p := range [][]byte{dead, labelled("farm-2")} {
		for range 10 {
			_, err := mallory.WriteTo(p, a.Self().Addr)
			require.NoError(t, err)
		}
	}
	time.Sleep(300 * time.Millisecond) // a acts on a packet at once; give it a margin
	require.Equal(t, memberlist.StateAlive, bAt(), "a packet without farm-1's label changes nothing")

	_, err = mallory.WriteTo(labelled("farm-1"), a.Self().Addr)
	require.NoError(t, err)
	waitFor(t, "a declares b dead on the labelled message", func() bool { return bAt() == memberlist.StateDead })
}
