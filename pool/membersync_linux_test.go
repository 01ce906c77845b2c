package pool

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
)

// TestDroppedReturnResynced: a daemon that falls behind its membership
// events loses the oldest (the cluster drops them rather than slow
// gossip); when the one it lost is a home's return after a partition, the
// gap in the events makes it judge every member again, and the segments
// there are restored instead of staying lost until the node's next change.
func TestDroppedReturnResynced(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second, timing: fastDetection})
	origin, home, other := sc.hosts[0], sc.hosts[1], sc.hosts[2]
	origin.cfg.ExportSize, other.cfg.ExportSize = 0, 0 // the segment goes to home
	gossipOn := origin.cfg.sim.cluster
	origin.cfg.sim.cluster = func(cc *cluster.Config) error {
		if err := gossipOn(cc); err != nil {
			return err
		}
		cc.EventBuffer = 1 // every event the daemon has not taken yet is dropped by the next
		return nil
	}
	var hold atomic.Pointer[chan struct{}]
	marking := make(chan struct{}, 1)
	origin.cfg.sim.judging = func(node string, up bool) {
		if node != home.name || up {
			return
		}
		if release := hold.Load(); release != nil {
			select {
			case marking <- struct{}{}:
			default:
			}
			<-*release
		}
	}
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	o := origin.daemon().pool
	seg, err := o.Alloc(t.Context(), caller{}, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, Persist: true})
	require.NoError(t, err)
	require.Equal(t, home.name, seg.Home)

	// The home's death is being judged (and holds the daemon's events)
	// while the partition heals and the home's return is dropped.
	release := make(chan struct{})
	hold.Store(&release)
	epoch := o.peers.epoch(home.name)
	sc.partition([]*simHost{home}, []*simHost{origin, other})
	select {
	case <-marking:
	case <-time.After(30 * time.Second):
		t.Fatal("the origin has not judged the home dead 30 s into the partition")
	}
	sc.net.Heal()
	require.Eventually(t, func() bool {
		m, ok := o.cl.Member(home.name)
		return ok && m.State == cluster.StateAlive
	}, 30*time.Second, 20*time.Millisecond, "the origin's gossip lists the home alive again")
	dropped := o.cl.Stats().EventsDropped
	od := other.daemon().pool
	for i := 0; o.cl.Stats().EventsDropped == dropped; i++ {
		require.Less(t, i, 100, "no event of the origin's dropped after the home's return")
		// A capacity change of the other host: one more event.
		r, err := od.Alloc(context.Background(), caller{}, allocRequest{Size: 256 << 10, Tier: poolv1.Tier_TIER_CXL, Persist: true})
		require.NoError(t, err)
		time.Sleep(300 * time.Millisecond)
		require.NoError(t, od.Free(caller{}, r.ID, ""))
	}
	hold.Store(nil)
	close(release)

	// Judged twice since the hold: the death (which marked the segment
	// lost), then the return.
	require.Eventually(t, func() bool {
		r, err := o.Stat(seg.ID)
		return err == nil && !r.Lost && o.peers.epoch(home.name) >= epoch+2
	}, 20*time.Second, 20*time.Millisecond, "the segment is restored: its home returned, and the event that said so was dropped")
}

// TestRestartRejoinsRememberedMembers: a poold started without seeds (the
// cluster's first, as h0000 here, whose only seed is itself) and
// restarted before its peers notice it went knows no member: they still
// list it alive and never contact it to join, so it would wait for one of
// them to pick it for a push/pull (30 s or more). It contacts the members
// its store remembers instead, and sees them at once.
func TestRestartRejoinsRememberedMembers(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: time.Second, timing: fastDetection})
	first := sc.hosts[0]
	require.Len(t, first.cfg.Join, 1, "the first host's only seed is itself")
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	var peers []string
	for _, h := range sc.hosts[1:] {
		peers = append(peers, h.cfg.Gossip)
	}
	require.Eventually(t, func() bool {
		addrs, err := first.daemon().pool.st.knownMembers()
		return err == nil && len(addrs) == 2 && addrs[0] == min(peers[0], peers[1]) && addrs[1] == max(peers[0], peers[1])
	}, 10*time.Second, 20*time.Millisecond, "the store remembers both peers")

	sc.crash(first)
	sc.net.Heal()
	require.NoError(t, sc.start(first))
	took, err := sc.waitConverged(10 * time.Second)
	require.NoError(t, err, "the restarted first host sees its peers again")
	t.Logf("every host lists every other alive %v after the restart", took)
}

// TestSilentSeedHoldsNoAnnouncement: a seed whose host is powered off
// does not refuse a connection, it lets the dial run to the gossip's TCP
// timeout (10 s in the lan profile, 30 s in wan). Contacting it again must
// not hold up the rest of what the daemon does on its gossip tick: here,
// telling its peers that its free memory changed.
func TestSilentSeedHoldsNoAnnouncement(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: time.Second, timing: fastDetection})
	h, peer := sc.hosts[2], sc.hosts[0]
	const gone = "127.1.9.9:7946" // nobody there: refused at once until Silence
	h.cfg.Join = append(slices.Clone(h.cfg.Join), gone)
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	// The first join has run its round (the gone seed refused at once);
	// from now on a dial to it hangs as one to a powered-off host does.
	require.Eventually(t, func() bool { return h.daemon().joined.Load() }, 10*time.Second, 20*time.Millisecond)
	sc.net.Silence(gone, 30*time.Second) // the wan profile's TCP timeout
	time.Sleep(3 * time.Second)          // rejoinSeeds runs every 2 s: a dial to gone is under way

	free := func() int64 {
		m, ok := peer.daemon().pool.cl.Member(h.name)
		if !ok {
			return -1
		}
		for _, ti := range m.Meta.Tiers {
			if ti.Name == "cxl" {
				return ti.Free
			}
		}
		return -1
	}
	before := free()
	_, err = h.daemon().pool.Alloc(t.Context(), caller{}, allocRequest{Size: 2 << 20, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return free() == before-2<<20 }, 15*time.Second, 20*time.Millisecond,
		"the peer learns the daemon's new free cxl memory while a dial to a silent seed hangs (%d bytes before)", before)
}

// TestRememberedOnlyWhenSeedsFail: the members a store remembers are a
// fallback for seeds that do not answer. A poold whose seeds answer never
// contacts them: moved to another cluster with its old data directory (or
// remembering an address another cluster took since), it would otherwise
// merge the two, since gossip merges whatever views it is handed.
func TestRememberedOnlyWhenSeedsFail(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: time.Second, timing: fastDetection})
	h := sc.hosts[2]
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)

	// A stranger: a lone gossip node of another cluster on the same network.
	tr, err := sc.net.NewTransport("stranger")
	require.NoError(t, err)
	cc := cluster.DefaultConfig()
	cc.Name, cc.Transport, cc.NoCompression = "stranger", tr, true
	stranger, err := cluster.New(cc, cluster.Meta{Proto: protoVersion, GRPCAddr: "127.0.0.1:1", DataAddr: "127.0.0.1:2"})
	require.NoError(t, err)
	t.Cleanup(func() { stranger.Shutdown() })

	sc.crash(h)
	st, err := openStore(h.cfg.DataDir, false)
	require.NoError(t, err)
	require.NoError(t, st.setKnownMembers([]string{stranger.Self().Addr}))
	require.NoError(t, st.close())
	sc.net.Heal()
	require.NoError(t, sc.start(h))
	_, err = sc.waitConverged(30 * time.Second)
	require.NoError(t, err, "the restarted host joins its seeds")
	time.Sleep(time.Second) // a contact of the stranger would have merged by now
	require.Len(t, stranger.Members(), 1, "the stranger's cluster stays apart")
	_, ok := h.daemon().pool.cl.Member("stranger")
	require.False(t, ok, "the restarted host never contacted the remembered stranger")
}
