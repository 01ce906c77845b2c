package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/stretchr/testify/require"
)

func TestFiveNodesSeeEachOtherWithMeta(t *testing.T) {
	cs := startMemCluster(t, memnet.New(0), 5)
	for _, c := range cs {
		ms := c.Members()
		require.Len(t, ms, 5)
		for i, m := range ms {
			require.Equal(t, fmt.Sprintf("n%d", i), m.Name, "Members is sorted by name")
			require.Equal(t, StateAlive, m.State)
			require.NoError(t, m.MetaErr)
			require.Equal(t, testMeta(m.Name), m.Meta)
			require.NotZero(t, m.Boot)
			require.False(t, m.Leaving)
			require.NotEmpty(t, m.Addr)
		}
		self := c.Self()
		require.Equal(t, c.name, self.Name)
		require.Equal(t, c.boot, self.Boot)
	}
	s := cs[0].Stats()
	require.Equal(t, 5, s.Alive)
	require.Zero(t, s.Dead+s.Left+s.Suspect+s.BadMeta)
	require.NotZero(t, s.StreamBytesReceived, "n0 served four joins over streams")
	// Joins travel over streams; the first gossip packets follow on the
	// probe and gossip timers, so wait for them rather than race them.
	waitFor(t, "n0 has sent and received gossip packets", func() bool {
		s := cs[0].Stats()
		return s.PacketBytesSent > 0 && s.PacketBytesReceived > 0
	})
}

func TestSetMetaPropagates(t *testing.T) {
	cs := startMemCluster(t, memnet.New(0), 5)
	events, unsub := cs[0].Subscribe()
	defer unsub()

	require.NoError(t, cs[3].SetMeta(func(m *Meta) {
		m.Draining = true
		m.Tiers[2].Free = 7 << 30
	}))
	want := testMeta("n3")
	want.Draining = true
	want.Tiers[2].Free = 7 << 30
	require.Equal(t, want, cs[3].Self().Meta, "Self reflects SetMeta when it returns")

	waitFor(t, "every node sees n3's new meta", func() bool {
		for _, c := range cs {
			m, ok := c.Member("n3")
			if !ok || !m.Meta.Draining || m.Meta.Tiers[2].Free != 7<<30 {
				return false
			}
		}
		return true
	})
	e := nextEvent(t, events, "n3")
	require.Equal(t, EventUpdate, e.Kind)
	require.Equal(t, want, e.Member.Meta)

	// An invalid change is refused and the old Meta stays.
	err := cs[3].SetMeta(func(m *Meta) { m.Tiers[0].Free = -1 })
	require.ErrorIs(t, err, ErrInvalidMeta)
	require.Equal(t, want, cs[3].Self().Meta)

	// Pick on n0's view never chooses the draining node.
	_, err = Pick(cs[0].Members(), "rdma", 1, "n0", nil)
	require.NoError(t, err)
	for range 200 {
		m, err := Pick(cs[0].Members(), "rdma", 1, "n0", nil)
		require.NoError(t, err)
		require.NotEqual(t, "n3", m.Name)
		require.NotEqual(t, "n0", m.Name)
	}
}

func TestShutdownIsDeadAndRestartIsAlive(t *testing.T) {
	n := memnet.New(0)
	cs := startMemCluster(t, n, 5)
	events, unsub := cs[0].Subscribe()
	defer unsub()
	oldBoot := cs[4].Self().Boot

	require.NoError(t, cs[4].Shutdown())
	waitFor(t, "every other node sees n4 dead", func() bool {
		for _, c := range cs[:4] {
			if stateOn(c, "n4") != "dead" {
				return false
			}
		}
		return true
	})
	e := nextEvent(t, events, "n4")
	require.Equal(t, EventDead, e.Kind)
	require.Equal(t, StateDead, e.Member.State)
	require.Equal(t, StateDead, cs[4].Self().State, "a shut down node lists itself dead")
	_, err := Pick(cs[0].Members(), "rdma", 1, "n0", nil)
	require.NoError(t, err)

	// The daemon restarts under the same name (and address).
	again := startMem(t, n, "n4")
	require.NotEqual(t, oldBoot, again.Self().Boot)
	_, err = again.Join(t.Context(), []string{cs[1].Self().Addr})
	require.NoError(t, err)
	waitFor(t, "every node sees the restarted n4 alive with its new boot", func() bool {
		for _, c := range append(cs[:4:4], again) {
			m, ok := c.Member("n4")
			if !ok || m.State != StateAlive || m.Boot != again.Self().Boot {
				return false
			}
		}
		return again.Stats().Alive == 5
	})
	e = nextEvent(t, events, "n4")
	require.Equal(t, EventAlive, e.Kind)
	require.Equal(t, again.Self().Boot, e.Member.Boot)
}

func TestLeaveIsLeft(t *testing.T) {
	cs := startMemCluster(t, memnet.New(0), 5)
	events, unsub := cs[0].Subscribe()
	defer unsub()

	require.NoError(t, cs[2].Leave(10*time.Second))
	require.True(t, cs[2].Self().Leaving)
	require.NoError(t, cs[2].Leave(time.Second), "Leave is idempotent")
	require.ErrorIs(t, cs[2].SetMeta(func(m *Meta) { m.Draining = true }), ErrLeft)
	_, err := cs[2].Join(t.Context(), []string{cs[0].Self().Addr})
	require.ErrorIs(t, err, ErrLeft)
	require.NoError(t, cs[2].Shutdown())
	require.Equal(t, StateLeft, cs[2].Self().State)

	waitFor(t, "every other node sees n2 left", func() bool {
		for i, c := range cs {
			if i != 2 && stateOn(c, "n2") != "left" {
				return false
			}
		}
		return true
	})
	// n0 may hear memberlist's leave before the announcement (then it
	// reports dead, then left); it never ends anywhere but left.
	var kinds []EventKind
	for {
		e := nextEvent(t, events, "n2")
		kinds = append(kinds, e.Kind)
		if e.Kind == EventLeave {
			require.Equal(t, StateLeft, e.Member.State)
			require.True(t, e.Member.Leaving)
			break
		}
		require.Contains(t, []EventKind{EventUpdate, EventDead}, e.Kind, "events so far: %v", kinds)
	}
	require.Equal(t, 1, cs[0].Stats().Left)
}

func TestRestartAfterLeaveIsAlive(t *testing.T) {
	n := memnet.New(0)
	cs := startMemCluster(t, n, 3)
	require.NoError(t, cs[2].Leave(10*time.Second))
	require.NoError(t, cs[2].Shutdown())
	waitFor(t, "n0 sees n2 left", func() bool { return stateOn(cs[0], "n2") == "left" })

	again := startMem(t, n, "n2")
	_, err := again.Join(t.Context(), nil) // no Config.Join: a cluster of its own
	require.NoError(t, err)
	_, err = again.Join(t.Context(), []string{cs[0].Self().Addr})
	require.NoError(t, err)
	waitFor(t, "n0 and n1 see n2 alive and not leaving", func() bool {
		for _, c := range cs[:2] {
			m, ok := c.Member("n2")
			if !ok || m.State != StateAlive || m.Leaving {
				return false
			}
		}
		return true
	})
}

func TestPartitionHealsToAlive(t *testing.T) {
	n := memnet.New(0)
	cs := startMemCluster(t, n, 4)
	events, unsub := cs[0].Subscribe()
	defer unsub()

	n.Cut("n3", "n0", "n1", "n2")
	waitFor(t, "n0 sees n3 dead", func() bool { return stateOn(cs[0], "n3") == "dead" })
	require.Equal(t, EventDead, nextEvent(t, events, "n3").Kind)
	n.Heal()
	// n3 learns it was declared dead (gossip or push/pull) and refutes.
	waitFor(t, "n0 sees n3 alive again", func() bool { return stateOn(cs[0], "n3") == "alive" })
	e := nextEvent(t, events, "n3")
	require.Equal(t, EventAlive, e.Kind)
	require.Equal(t, cs[3].Self().Boot, e.Member.Boot, "same boot: the node did not restart")
}

func TestLifecycleAfterShutdown(t *testing.T) {
	n := memnet.New(0)
	c := startMem(t, n, "solo")
	events, _ := c.Subscribe()
	_, unsub2 := c.Subscribe()

	require.NoError(t, c.Shutdown())
	require.NoError(t, c.Shutdown(), "Shutdown is idempotent")
	_, ok := <-events
	require.False(t, ok, "Shutdown closes subscriptions")
	unsub2() // after Shutdown: no double close

	require.ErrorIs(t, c.SetMeta(func(m *Meta) { m.Draining = true }), ErrClosed)
	require.ErrorIs(t, c.Leave(time.Second), ErrClosed)
	_, err := c.Join(t.Context(), []string{"127.1.0.9:7946"})
	require.ErrorIs(t, err, ErrClosed)
	late, unsub3 := c.Subscribe()
	_, ok = <-late
	require.False(t, ok)
	unsub3()
	require.Len(t, c.Members(), 1)
	require.Equal(t, 0, n.Stats().OpenTransports, "Shutdown shut the transport down")
}

func TestJoinSeeds(t *testing.T) {
	n := memnet.New(0)
	c := startMem(t, n, "a")
	b := startMem(t, n, "b")

	got, err := c.Join(t.Context(), nil)
	require.NoError(t, err)
	require.Zero(t, got, "no seeds: nothing to do")

	got, err = c.Join(t.Context(), []string{c.Self().Addr})
	require.NoError(t, err)
	require.Zero(t, got, "own address is skipped")

	_, err = c.Join(t.Context(), []string{"no-port"})
	require.ErrorIs(t, err, ErrInvalidConfig)

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err = c.Join(ctx, []string{"127.1.9.9:7946", "127.1.9.8:7946"})
	require.ErrorIs(t, err, ErrNoSeed)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Contains(t, err.Error(), "127.1.9.9:7946")

	got, err = c.Join(t.Context(), []string{"127.1.9.9:7946", b.Self().Addr})
	require.NoError(t, err, "one reachable seed is enough")
	require.Equal(t, 1, got)
}

// TestJoinPastSilentSeed: a seed whose host is off lets a dial hang until
// TCP gives up (10 s lan, 30 s wan). Join contacts the seeds of a round at
// once, so a reachable one answers meanwhile, and its ctx bounds the
// round: the silent seed, listed first, costs neither the other seed's
// answer nor a wait for its dial (two minutes here; ctx, far longer than the
// one-second grace after the first answer, would end first).
func TestJoinPastSilentSeed(t *testing.T) {
	n := memnet.New(0)
	c := startMem(t, n, "a")
	b := startMem(t, n, "b")
	const silent = "127.1.9.9:7946"
	n.Silence(silent, 2*time.Minute)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	got, err := c.Join(ctx, []string{silent, b.Self().Addr})
	require.NoError(t, err, "the reachable seed answers while the silent one hangs")
	require.Equal(t, 1, got)
	require.NoError(t, ctx.Err(), "the round ended with the answers, not with ctx")

	ctx, cancel = context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	_, err = c.Join(ctx, []string{silent})
	require.ErrorIs(t, err, ErrNoSeed, "a round of silent seeds ends with ctx, not with their dial")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestJoinStopsAtShutdown(t *testing.T) {
	n := memnet.New(0)
	c := startMem(t, n, "a")
	errc := make(chan error, 1)
	go func() {
		_, err := c.Join(context.Background(), []string{"127.1.9.9:7946"})
		errc <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it fail a round and back off; the test passes either way
	require.NoError(t, c.Shutdown())
	require.ErrorIs(t, <-errc, ErrClosed)
}

func TestNewRefusesAndReleasesTransport(t *testing.T) {
	n := memnet.New(0)
	tooBig := testMeta("x")
	tooBig.GRPCAddr = longHost(240) + ":1"
	tooBig.DataAddr = longHost(240) + ":2"
	for _, tc := range []struct {
		name string
		edit func(*Config)
		meta Meta
		want error
	}{
		{"empty name", func(c *Config) { c.Name = "" }, testMeta("x"), ErrInvalidConfig},
		{"bad profile", func(c *Config) { c.Profile = "fast" }, testMeta("x"), ErrInvalidConfig},
		{"meta too large", func(*Config) {}, tooBig, ErrMetaTooLarge},
		{"meta invalid", func(*Config) {}, Meta{Tiers: []TierFree{{Name: "CXL"}}}, ErrInvalidMeta},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, err := n.NewTransport("x")
			require.NoError(t, err)
			cfg := fastConfig("x")
			cfg.Transport = tr
			tc.edit(&cfg)
			_, err = New(cfg, tc.meta)
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, 0, n.Stats().OpenTransports, "New shuts the transport down on error")
		})
	}
}

func TestConcurrentUse(t *testing.T) {
	cs := startMemCluster(t, memnet.New(0), 3)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for i := range 4 {
		wg.Go(func() {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return
				default:
				}
				c := cs[i%len(cs)]
				err := c.SetMeta(func(m *Meta) { m.Tiers[0].Free = int64(k) })
				if err != nil && !errors.Is(err, ErrUpdateLost) {
					t.Errorf("SetMeta: %v", err)
					return
				}
			}
		})
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ch, unsub := cs[i%len(cs)].Subscribe()
				for _, m := range cs[(i+1)%len(cs)].Members() {
					m.Meta.Tiers = append(m.Meta.Tiers[:0], TierFree{Name: "scribble"}) // copies are ours
				}
				_ = cs[i%len(cs)].Stats()
				select {
				case <-ch:
				default:
				}
				unsub()
			}
		})
	}
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	for _, c := range cs {
		for _, m := range c.Members() {
			require.NoError(t, m.Meta.Validate())
			require.Len(t, m.Meta.Tiers, 3, "handed-out copies never alias the table")
		}
		c.metaMu.Lock()
		want := c.meta
		c.metaMu.Unlock()
		require.Equal(t, want, c.Self().Meta, "the last SetMeta is in effect: no update was lost")
	}
}

func TestSlowSubscriberDropsOldest(t *testing.T) {
	c := &Cluster{members: map[string]*record{}, subs: map[*subscription]struct{}{}, cfg: Config{EventBuffer: 4}, now: time.Now}
	slow, unsubSlow := c.Subscribe()
	fast, unsubFast := c.Subscribe()
	defer unsubFast()
	var got []uint64
	for i := range 10 {
		c.mu.Lock()
		c.publishLocked(EventUpdate, Member{Name: fmt.Sprint("m", i)})
		c.mu.Unlock()
		got = append(got, (<-fast).Seq)
	}
	require.Equal(t, []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, got, "a subscriber that keeps up loses nothing")
	var seqs []uint64
	for range 4 {
		seqs = append(seqs, (<-slow).Seq)
	}
	require.Equal(t, []uint64{7, 8, 9, 10}, seqs, "the newest events survive, the gap in Seq shows the loss")
	require.EqualValues(t, 6, c.dropped.Load())
	unsubSlow()
	unsubSlow()
	_, ok := <-slow
	require.False(t, ok)
}

func TestReapForgetsOldDeadMembers(t *testing.T) {
	now := time.Now()
	c := &Cluster{name: "me", reapAfter: time.Minute, members: map[string]*record{
		"me":     {m: Member{Name: "me", State: StateLeft, Since: now.Add(-time.Hour)}},
		"alive":  {m: Member{Name: "alive", State: StateAlive, Since: now.Add(-time.Hour)}},
		"fresh":  {m: Member{Name: "fresh", State: StateDead, Since: now.Add(-time.Second)}},
		"old":    {m: Member{Name: "old", State: StateDead, Since: now.Add(-2 * time.Minute)}},
		"oldish": {m: Member{Name: "oldish", State: StateLeft, Since: now.Add(-2 * time.Minute)}},
	}}
	c.reapLocked(now)
	var names []string
	for n := range c.members {
		names = append(names, n)
	}
	require.ElementsMatch(t, []string{"me", "alive", "fresh"}, names)
}

func longHost(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = 'h'
	}
	return string(b)
}
