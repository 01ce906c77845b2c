package cluster

import (
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"
)

func TestCapacityUpdateRoundTrip(t *testing.T) {
	for _, u := range []capUpdate{
		{name: "n", boot: 1, seq: 1},
		{name: "node-17", boot: math.MaxUint64, seq: math.MaxUint64, free: []int64{0, 1 << 30, math.MaxInt64}},
	} {
		b := u.encode()
		got, ok := decodeCapacity(b)
		require.True(t, ok)
		require.Equal(t, u, got)
		require.LessOrEqual(t, len(b), 1+8+1+len(u.name)+10+1+3*9)
	}
	good := capUpdate{name: "x", boot: 2, seq: 3, free: []int64{4}}.encode()
	for _, b := range [][]byte{
		nil,
		{msgCapacity},
		good[:len(good)-1],                  // truncated
		capUpdate{boot: 2, seq: 3}.encode(), // no name
		append(good[:len(good)-2:len(good)-2], MaxTiers+1, 1), // too many tiers
		encodeLeave("x", 2),                                     // another kind
		append([]byte{msgCapacity}, make([]byte, 8)...),         // boot only
		append(append([]byte{}, good[:9]...), 0xff, 0xff, 0x01), // name length beyond the limit
	} {
		_, ok := decodeCapacity(b)
		require.False(t, ok, "%x", b)
	}
	realistic := capUpdate{name: "poold-rack12-host07", boot: 0xdeadbeefcafef00d, seq: 123456,
		free: []int64{60 << 30, 15 << 30, 100 << 30}}.encode()
	raw, err := encodeMeta(testMeta("poold-rack12-host07"), stamp{boot: 1})
	require.NoError(t, err)
	require.Less(t, 2*len(realistic), len(raw), "a capacity update is a fraction of a Meta (%d vs %d bytes, before the alive message's own fields)", len(realistic), len(raw))
}

func TestFreeOnly(t *testing.T) {
	a := testMeta("n")
	b := a.Clone()
	b.Tiers[1].Free = 0
	require.True(t, freeOnly(a, b))
	for _, edit := range []func(*Meta){
		func(m *Meta) { m.Draining = true },
		func(m *Meta) { m.Tiers[0].Capacity++ },
		func(m *Meta) { m.Tiers[0].Name = "tape" },
		func(m *Meta) { m.Tiers = m.Tiers[:2] },
		func(m *Meta) { m.GRPCAddr = "other:1" },
		func(m *Meta) { m.DataAddr = "" },
		func(m *Meta) { m.Proto++ },
		func(m *Meta) { m.Zone = "rack-2" },
	} {
		c := b.Clone()
		edit(&c)
		require.False(t, freeOnly(a, c), "%+v", c)
	}
	// Every field but the tiers, including those Meta gains later: a zone
	// change once went out as a capacity update, which does not carry it.
	mt := reflect.TypeFor[Meta]()
	for i := range mt.NumField() {
		f := mt.Field(i)
		if f.Name == "Tiers" {
			continue
		}
		c := b.Clone()
		v := reflect.ValueOf(&c).Elem().Field(i)
		switch v.Kind() {
		case reflect.Bool:
			v.SetBool(!v.Bool())
		case reflect.String:
			v.SetString(v.String() + "x")
		case reflect.Int, reflect.Int64, reflect.Int32:
			v.SetInt(v.Int() + 1)
		case reflect.Uint, reflect.Uint64, reflect.Uint32:
			v.SetUint(v.Uint() + 1)
		default:
			t.Fatalf("Meta.%s is a %v: teach this test to change it", f.Name, v.Kind())
		}
		require.False(t, freeOnly(a, c), "a change of Meta.%s alone counted as free bytes only", f.Name)
	}
}

// TestCapacityUpdatesApplyInOrder plays the orders in which a receiver can
// get a node's Metas and capacity updates: an update applies over an older
// Meta only, survives a Meta that is older still, and waits for the Meta it
// follows.
func TestCapacityUpdatesApplyInOrder(t *testing.T) {
	c := bareCluster("me")
	clock := time.Unix(1000, 0)
	c.now = func() time.Time { return clock }
	c.bcast = newBroadcastQueue(func() int { return 1 }, 1, time.Second)
	events, unsub := c.Subscribe()
	defer unsub()
	d := &delegate{c}
	meta := func(capSeq uint64, rdmaCap int64) []byte {
		m := testMeta("x")
		m.Tiers[2].Capacity = rdmaCap
		m.Tiers[2].Free = rdmaCap / 2
		b, err := encodeMeta(m, stamp{boot: 7, capSeq: capSeq})
		require.NoError(t, err)
		return b
	}
	rdmaFree := func() int64 {
		m, ok := c.Member("x")
		require.True(t, ok)
		return m.Meta.Tiers[2].Free
	}
	update := func(seq uint64, rdma int64) []byte {
		return capUpdate{name: "x", boot: 7, seq: seq, free: []int64{60 << 30, 15 << 30, rdma}}.encode()
	}
	noEvent := func() {
		t.Helper()
		select {
		case e := <-events:
			t.Fatalf("unexpected event %v", e.Kind)
		default:
		}
	}

	d.NotifyJoin(&memberlist.Node{Name: "x", Meta: meta(0, 100)})
	require.Equal(t, EventJoin, (<-events).Kind)
	require.Equal(t, int64(50), rdmaFree())

	metaAt := func() time.Time {
		m, ok := c.Member("x")
		require.True(t, ok)
		return m.MetaAt
	}
	require.Equal(t, time.Unix(1000, 0), metaAt())

	// News applies, is an event and is passed on; MetaAt says when.
	clock = clock.Add(time.Second)
	d.NotifyMsg(update(1, 40))
	e := <-events
	require.Equal(t, EventUpdate, e.Kind)
	require.Equal(t, int64(40), e.Member.Meta.Tiers[2].Free)
	require.Equal(t, time.Unix(1001, 0), e.Member.MetaAt)
	require.Equal(t, [][]byte{update(1, 40)}, d.GetBroadcasts(0, 1400))

	// Repeats, older updates and other boots change nothing, MetaAt
	// included.
	clock = clock.Add(time.Second)
	d.NotifyMsg(update(1, 30))
	d.NotifyMsg(capUpdate{name: "x", boot: 8, seq: 9, free: []int64{1, 1, 1}}.encode())
	d.NotifyMsg(capUpdate{name: "nobody", boot: 7, seq: 9, free: []int64{1, 1, 1}}.encode())
	noEvent()
	require.Equal(t, int64(40), rdmaFree())
	require.Equal(t, time.Unix(1001, 0), metaAt())
	require.Empty(t, d.GetBroadcasts(0, 1400))

	// An update that overtook the Meta it follows (seq 2, capacity 200):
	// it is capped at the old capacity until that Meta arrives, and then
	// still applies over it.
	d.NotifyMsg(update(3, 150))
	require.Equal(t, int64(100), (<-events).Member.Meta.Tiers[2].Free, "capped at the capacity known")
	clock = clock.Add(time.Second)
	d.NotifyUpdate(&memberlist.Node{Name: "x", Meta: meta(2, 200)})
	e = <-events
	require.Equal(t, int64(200), e.Member.Meta.Tiers[2].Capacity)
	require.Equal(t, clock, e.Member.MetaAt, "a new Meta moves MetaAt")
	require.Equal(t, int64(150), e.Member.Meta.Tiers[2].Free, "update 3 is newer than the Meta of seq 2")

	// push/pull carries the newest update.
	require.Equal(t, append(encodeLeaveSet(nil, nil), append([]byte{1}, update(3, 150)[1:]...)...), c.pushState())

	// A Meta that includes the update replaces it.
	d.NotifyUpdate(&memberlist.Node{Name: "x", Meta: meta(3, 200)})
	require.Equal(t, int64(100), (<-events).Member.Meta.Tiers[2].Free)
	d.NotifyMsg(update(3, 150))
	noEvent()
	require.Equal(t, append(encodeLeaveSet(nil, nil), 0), c.pushState())

	// An update from push/pull applies like a gossiped one, without being
	// passed on.
	d.GetBroadcasts(0, 1400)
	d.MergeRemoteState(pushStateWith(update(4, 10)), false)
	require.Equal(t, int64(10), (<-events).Member.Meta.Tiers[2].Free)
	require.Empty(t, d.GetBroadcasts(0, 1400))

	// A dead node's updates are ignored.
	d.NotifyLeave(&memberlist.Node{Name: "x"})
	<-events
	d.NotifyMsg(update(5, 5))
	noEvent()
}

// pushStateWith is an empty leave set followed by a capacity set of the
// given encoded updates.
func pushStateWith(updates ...[]byte) []byte {
	b := append(encodeLeaveSet(nil, nil), byte(len(updates)))
	for _, u := range updates {
		b = append(b, u[1:]...)
	}
	return b
}

// TestFreeBytesGossipAsCapacityUpdates: a SetMeta that changes only free
// bytes reaches every node without a new memberlist alive message (the
// node's incarnation stays), and a full SetMeta after it keeps the newest
// free bytes.
func TestFreeBytesGossipAsCapacityUpdates(t *testing.T) {
	cs := startMemCluster(t, memnet.New(0), 5)
	// raw is what n0 last got from memberlist for n3: its Meta as the
	// last alive message carried it.
	raw := func() []byte {
		cs[0].mu.Lock()
		defer cs[0].mu.Unlock()
		return cs[0].members["n3"].raw
	}
	before := raw()
	for i := range int64(20) {
		require.NoError(t, cs[3].SetMeta(func(m *Meta) { m.Tiers[2].Free = 90<<30 - i<<20 }))
	}
	want := int64(90<<30 - 19<<20)
	require.Equal(t, want, cs[3].Self().Meta.Tiers[2].Free, "Self reflects SetMeta when it returns")
	waitFor(t, "every node sees n3's last free bytes", func() bool {
		for _, c := range cs {
			if m, ok := c.Member("n3"); !ok || m.Meta.Tiers[2].Free != want {
				return false
			}
		}
		return true
	})
	require.Equal(t, before, raw(), "no alive message: n0 holds the Meta it had")

	require.NoError(t, cs[3].SetMeta(func(m *Meta) { m.Draining = true }))
	waitFor(t, "every node sees n3 draining with its last free bytes", func() bool {
		for _, c := range cs {
			if m, ok := c.Member("n3"); !ok || !m.Meta.Draining || m.Meta.Tiers[2].Free != want {
				return false
			}
		}
		return true
	})
	require.NotEqual(t, before, raw(), "a full update is an alive message")
}
