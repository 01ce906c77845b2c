package cluster

import (
	"io"
	"log"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"
)

// rawDelegate gossips fixed metadata bytes, as a node of another program or
// an incompatible farmem version would.
type rawDelegate struct{ meta []byte }

func (d rawDelegate) NodeMeta(int) []byte                  { return d.meta }
func (d rawDelegate) NotifyMsg([]byte)                     {}
func (d rawDelegate) GetBroadcasts(int, int) [][]byte      { return nil }
func (d rawDelegate) LocalState(bool) []byte               { return []byte("not a leave set") }
func (d rawDelegate) MergeRemoteState(b []byte, join bool) {}

func TestPeerWithBadMetaIsListedButNeverPicked(t *testing.T) {
	n := memnet.New(0)
	cs := startMemCluster(t, n, 2)
	tr, err := n.NewTransport("alien")
	require.NoError(t, err)
	mc := memberlist.DefaultLocalConfig()
	mc.Name, mc.Transport, mc.Logger = "alien", tr, log.New(io.Discard, "", 0)
	mc.Delegate = rawDelegate{meta: []byte(`{"role":"something else"}`)}
	alien, err := memberlist.Create(mc)
	require.NoError(t, err)
	defer func() { require.NoError(t, alien.Shutdown()) }()
	_, err = alien.Join([]string{cs[0].Self().Addr})
	require.NoError(t, err)

	waitFor(t, "both nodes list the alien", func() bool {
		_, ok0 := cs[0].Member("alien")
		_, ok1 := cs[1].Member("alien")
		return ok0 && ok1
	})
	m, _ := cs[0].Member("alien")
	require.Equal(t, StateAlive, m.State)
	require.ErrorIs(t, m.MetaErr, ErrBadMeta)
	require.Zero(t, m.Boot)
	require.False(t, m.Usable())
	require.Equal(t, 1, cs[0].Stats().BadMeta)
	for range 100 {
		p, err := Pick(cs[0].Members(), "rdma", 1, "n0", nil)
		require.NoError(t, err)
		require.Equal(t, "n1", p.Name)
	}
}

// bareCluster is a Cluster without memberlist, for the table logic alone.
func bareCluster(name string) *Cluster {
	return &Cluster{name: name, members: map[string]*record{}, subs: map[*subscription]struct{}{},
		cfg: Config{EventBuffer: 16}, now: time.Now, reapAfter: time.Minute}
}

func TestLeaveAnnouncementAfterDeathTurnsDeadIntoLeft(t *testing.T) {
	c := bareCluster("me")
	events, unsub := c.Subscribe()
	defer unsub()
	raw, err := encodeMeta(testMeta("x"), stamp{boot: 77})
	require.NoError(t, err)
	d := &delegate{c}
	d.NotifyJoin(&memberlist.Node{Name: "x", Meta: raw})
	require.Equal(t, EventJoin, (<-events).Kind)
	d.NotifyLeave(&memberlist.Node{Name: "x"})
	e := <-events
	require.Equal(t, EventDead, e.Kind, "no announcement yet: a failure")

	// A stale announcement (another boot) and garbage change nothing.
	d.MergeRemoteState(encodeLeaveSet([]string{"x"}, []uint64{76}), false)
	d.MergeRemoteState([]byte("garbage"), false)
	d.NotifyMsg([]byte{0x7f, 1, 2, 3})
	m, _ := c.Member("x")
	require.Equal(t, StateDead, m.State)

	// The announcement arrives by push/pull after memberlist's leave.
	d.MergeRemoteState(encodeLeaveSet([]string{"nobody", "x"}, []uint64{1, 77}), false)
	e = <-events
	require.Equal(t, EventLeave, e.Kind)
	require.Equal(t, StateLeft, e.Member.State)
	require.True(t, e.Member.Leaving)
	require.Equal(t, append(encodeLeaveSet([]string{"x"}, []uint64{77}), 0), c.pushState(), "and is passed on in this node's push/pull (with an empty capacity set)")

	// Hearing it again is no news.
	d.NotifyMsg(encodeLeave("x", 77))
	select {
	case e := <-events:
		t.Fatalf("unexpected event %v", e.Kind)
	default:
	}
}

func TestLeaveAnnouncementBeforeDeathGivesLeft(t *testing.T) {
	c := bareCluster("me")
	c.bcast = newBroadcastQueue(func() int { return 1 }, 1, time.Second)
	events, unsub := c.Subscribe()
	defer unsub()
	raw, err := encodeMeta(testMeta("x"), stamp{boot: 5})
	require.NoError(t, err)
	d := &delegate{c}
	d.NotifyJoin(&memberlist.Node{Name: "x", Meta: raw})
	<-events

	d.NotifyMsg(encodeLeave("x", 5))
	e := <-events
	require.Equal(t, EventUpdate, e.Kind)
	require.True(t, e.Member.Leaving)
	require.Equal(t, [][]byte{encodeLeave("x", 5)}, d.GetBroadcasts(0, 1400), "news is passed on by gossip")
	d.NotifyLeave(&memberlist.Node{Name: "x"})
	require.Equal(t, EventLeave, (<-events).Kind)

	// The same node restarted (new boot) is alive and not leaving.
	raw2, err := encodeMeta(testMeta("x"), stamp{boot: 6})
	require.NoError(t, err)
	d.NotifyJoin(&memberlist.Node{Name: "x", Meta: raw2})
	e = <-events
	require.Equal(t, EventAlive, e.Kind)
	require.False(t, e.Member.Leaving)
	require.Equal(t, uint64(6), e.Member.Boot)

	// A repeated notification with the same bytes is not an event.
	d.NotifyUpdate(&memberlist.Node{Name: "x", Meta: raw2})
	select {
	case e := <-events:
		t.Fatalf("unexpected event %v", e.Kind)
	default:
	}
}

func TestLeaveNeedsPositiveTimeout(t *testing.T) {
	c := startMem(t, memnet.New(0), "a")
	require.ErrorIs(t, c.Leave(0), ErrInvalidConfig)
	require.NoError(t, c.Leave(time.Second), "alone: nobody to wait for")
	require.Equal(t, StateLeft, c.Self().State)
}

func TestLeaveMessagesRoundTrip(t *testing.T) {
	name, boot, ok := decodeLeave(encodeLeave("node-7", 99))
	require.True(t, ok)
	require.Equal(t, "node-7", name)
	require.Equal(t, uint64(99), boot)
	for _, b := range [][]byte{nil, {msgLeave}, encodeLeave("x", 1)[:10], append(encodeLeave("x", 1), 0)} {
		_, _, ok := decodeLeave(b)
		require.False(t, ok, "%q", b)
	}
	var got []string
	decodePushState(encodeLeaveSet([]string{"a", "bb"}, []uint64{1, 2}), func(n string, b uint64) {
		got = append(got, n)
	}, func(capUpdate) { t.Fatal("no capacity set was encoded") })
	require.Equal(t, []string{"a", "bb"}, got)
	require.Equal(t, []byte{msgLeaveSet, 0}, encodeLeaveSet(nil, nil))
}

// TestNothingMergedAfterShutdown: what memberlist hands a Cluster after
// its Shutdown (a reconnect contact or a join still under way, which
// Shutdown does not wait for) changes nothing: Members keeps the last
// table.
func TestNothingMergedAfterShutdown(t *testing.T) {
	n := memnet.New(0)
	cs := startMemCluster(t, n, 2)
	c := cs[0]
	require.NoError(t, c.Shutdown())
	before := c.Members()
	d := &delegate{c}
	late := &memberlist.Node{Name: "late", Addr: []byte{127, 0, 0, 9}, Port: 7946}
	enc, err := encodeMeta(testMeta("late"), stamp{boot: 7})
	require.NoError(t, err)
	late.Meta = enc
	d.NotifyJoin(late)
	d.NotifyUpdate(late)
	d.NotifyLeave(&memberlist.Node{Name: "n1"})
	d.MergeRemoteState(encodeLeaveSet([]string{"n1"}, []uint64{cs[1].Self().Boot}), false)
	d.NotifyMsg(encodeLeave("n1", cs[1].Self().Boot))
	require.Equal(t, before, c.Members())
}
