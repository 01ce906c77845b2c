package coherence

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHomeHeldRequest: a WriteReq that waits for invalidations is answered
// with its Grant once the InvAcks, riding the sharers' polls, are in; past
// the hold it is answered Wait and the grant is pushed to the writer's
// poll instead.
func TestHomeHeldRequest(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PageSize = 512
	mem := make([]byte, 512)
	h, err := NewHome(cfg, mem, nil)
	require.NoError(t, err)
	defer h.Close()
	ctx := t.Context()
	read := func(id SharerID, seq uint64) {
		rep := h.Handle(Message{Kind: ReadReq, From: id, PageSize: 512, Seq: seq})
		require.Equal(t, Grant, rep.Kind, "%s", rep)
	}
	read(1, 1)
	read(2, 1)

	// Held: both sharers acknowledge while the writer's request waits.
	got := make(chan Message, 1)
	go func() { got <- h.HandleHeld(ctx, Message{Kind: WriteReq, From: 3, PageSize: 512, Seq: 1}, time.Minute) }()
	for _, id := range []SharerID{1, 2} {
		invs := h.Poll(ctx, id, time.Second, nil)
		require.Len(t, invs, 1)
		require.Equal(t, Invalidate, invs[0].Kind)
		ack := Message{Kind: InvAck, From: id, Incarnation: invs[0].Incarnation, Page: 0, InvID: invs[0].InvID}
		require.Empty(t, h.Poll(ctx, id, 0, []Message{ack}))
	}
	rep := <-got
	require.Equal(t, Grant, rep.Kind, "%s", rep)
	require.True(t, rep.Exclusive)
	require.EqualValues(t, 1, rep.Seq)
	require.Empty(t, h.Poll(ctx, 3, 0, nil), "the grant came in the reply, not through the poll")

	// Not held past the hold: Wait, then the grant is pushed.
	rep = h.HandleHeld(ctx, Message{Kind: WriteReq, From: 1, PageSize: 512, Seq: 2}, time.Millisecond)
	require.Equal(t, Wait, rep.Kind, "%s", rep)
	invs := h.Poll(ctx, 3, time.Second, nil)
	require.Len(t, invs, 1)
	ack := Message{Kind: InvAck, From: 3, Incarnation: invs[0].Incarnation, InvID: invs[0].InvID, HasData: true, Data: []byte("x")}
	require.Empty(t, h.Poll(ctx, 3, 0, []Message{ack}))
	pushed := h.Poll(ctx, 1, time.Second, nil)
	require.Len(t, pushed, 1)
	require.Equal(t, Grant, pushed[0].Kind, "%s", pushed[0])
	require.EqualValues(t, 2, pushed[0].Seq)
	require.Equal(t, byte('x'), pushed[0].Data[0], "the owner's data came back with its ack")
	require.NoError(t, h.Check())
}

// TestLateOwnerDataIsStale: an owner whose lease ran out before its
// InvAck (with its data) arrived is told Stale, so it reports the loss;
// the page moved on with the home's copy.
func TestLateOwnerDataIsStale(t *testing.T) {
	d, cfg, t0 := directory512(t, 512)
	g, _ := d.Handle(t0, Message{Kind: WriteReq, From: 1, PageSize: 512, Seq: 1})
	require.Equal(t, Grant, g.Kind)
	w, invs := d.Handle(t0, Message{Kind: WriteReq, From: 2, PageSize: 512, Seq: 1})
	require.Equal(t, Wait, w.Kind)
	require.Len(t, invs, 1)
	later := t0.Add(cfg.Lease)
	out := d.Tick(later, cfg.Lease/10)
	require.Len(t, out, 1)
	require.Equal(t, Grant, out[0].Kind, "the writer is granted once the owner's lease ran out")
	rep, _ := d.Handle(later, Message{Kind: InvAck, From: 1, Incarnation: 7, Gen: invs[0].Gen, InvID: invs[0].InvID, HasData: true, Data: []byte("late")})
	require.Equal(t, Stale, rep.Kind, "%s", rep)
	require.NotEqual(t, "late", string(d.pageData(0)[:4]))
	require.EqualValues(t, 1, d.Stats().LostOwners)
}

// TestGrantCountsTheHold: a request the home held while it invalidated
// others is granted a lease counted from when the sharer sent it, so its
// Lease adds how long the home held it; the home's own lease starts at the
// grant. One granted at once gets the lease.
func TestGrantCountsTheHold(t *testing.T) {
	d, cfg, t0 := directory512(t, 512)
	g, _ := d.Handle(t0, Message{Kind: WriteReq, From: 1, PageSize: 512, Seq: 1})
	require.Equal(t, Grant, g.Kind)
	require.Equal(t, cfg.Lease, g.Lease, "granted at once")
	w, invs := d.Handle(t0, Message{Kind: WriteReq, From: 2, PageSize: 512, Seq: 1})
	require.Equal(t, Wait, w.Kind)
	require.Len(t, invs, 1)
	held := cfg.Lease * 3 / 4
	_, out := d.Handle(t0.Add(held), Message{Kind: InvAck, From: 1, Incarnation: 7, Gen: invs[0].Gen, InvID: invs[0].InvID, HasData: true, Data: []byte("data")})
	require.Len(t, out, 1)
	require.Equal(t, Grant, out[0].Kind, "%s", out[0])
	require.Equal(t, cfg.Lease+held, out[0].Lease, "the lease plus the hold")
	h, ok := d.page(0).holders.get(2)
	require.True(t, ok)
	require.Equal(t, t0.Add(held).Add(cfg.Lease), h.expiry, "the home's lease runs from the grant: never before the sharer's")
}

// TestResendCountsTheHold: a sharer resends a held request until it is
// answered, so its resend can reach the home after the grant was pushed
// (or the pushed grant is lost): the home answers it again counting the
// hold from when it first took the request, and the sharer, which takes
// whichever grant comes first, keeps a whole lease from the grant and no
// more than the home's. So for a WriteReq (its owner asks again) and a
// ReadReq (a holder asks again).
func TestResendCountsTheHold(t *testing.T) {
	for _, excl := range []bool{true, false} {
		d, cfg, t0 := directory512(t, 512)
		g, _ := d.Handle(t0, Message{Kind: WriteReq, From: 1, PageSize: 512, Seq: 1})
		require.Equal(t, Grant, g.Kind)
		c, err := NewCache(cfg, 2, 512)
		require.NoError(t, err)
		req, err := c.Request(t0, 0, excl)
		require.NoError(t, err)
		w, invs := d.Handle(t0, req)
		require.Equal(t, Wait, w.Kind)
		require.NoError(t, c.Reply(t0, t0, req, w))
		held := cfg.Lease * 3 / 4
		granted := t0.Add(held)
		_, out := d.Handle(granted, Message{Kind: InvAck, From: 1, Incarnation: 7, Gen: invs[0].Gen, InvID: invs[0].InvID, HasData: true, Data: []byte("x")})
		require.Len(t, out, 1)
		require.Equal(t, cfg.Lease+held, out[0].Lease) // pushed; the resend below crosses it
		re, err := c.Request(granted, 0, excl)
		require.NoError(t, err)
		require.Equal(t, req.Seq, re.Seq, "the same request, sent again")
		at := granted.Add(time.Millisecond)
		g2, _ := d.Handle(at, re)
		require.Equal(t, Grant, g2.Kind, "excl %v: %s", excl, g2)
		require.Equal(t, cfg.Lease+held+time.Millisecond, g2.Lease, "excl %v: the hold counts from when the home first took the request", excl)
		require.NoError(t, c.Reply(at, granted, re, g2))
		_, err = c.Push(at, out[0]) // the pushed grant: the request is answered already
		require.NoError(t, err)
		h, ok := d.page(0).holders.get(2)
		require.True(t, ok)
		require.Equal(t, granted.Add(cfg.Lease), c.Expiry(0).Add(-time.Millisecond), "excl %v: a whole lease after the grant", excl)
		require.False(t, c.Expiry(0).After(h.expiry), "excl %v: never past the home's lease (%s > %s)", excl, c.Expiry(0), h.expiry)

		// A new request of the same sharer counts from its own sending.
		if excl {
			c.Cancel(0)
			nr, err := c.Request(at.Add(time.Millisecond), 0, true)
			require.NoError(t, err)
			require.NotEqual(t, req.Seq, nr.Seq)
			g3, _ := d.Handle(at.Add(2*time.Millisecond), nr)
			require.Equal(t, Grant, g3.Kind)
			require.Equal(t, cfg.Lease, g3.Lease, "a new request was not held")
		}
	}
}

// TestDirectoryKeepsOnlyHeldPages: a directory over 64 MiB of 512-byte
// pages keeps state for the pages sharers hold and for nothing else: none
// at the start, one per page held, and none again once the holders
// release them or their leases run out (forgotten by Tick's sweep); an
// owner whose lease ran out is kept until the page is asked for, which
// tells its loss.
func TestDirectoryKeepsOnlyHeldPages(t *testing.T) {
	d, cfg, t0 := directory512(t, 64<<20)
	require.Equal(t, 131072, d.Pages())
	require.Empty(t, d.pages.m)
	for pg := range uint32(3) {
		g, _ := d.Handle(t0, Message{Kind: ReadReq, From: 1, PageSize: 512, Page: pg * 1000, Seq: uint64(pg) + 1})
		require.Equal(t, Grant, g.Kind)
	}
	g, _ := d.Handle(t0, Message{Kind: WriteReq, From: 2, PageSize: 512, Page: 131071, Seq: 1})
	require.Equal(t, Grant, g.Kind)
	require.Len(t, d.pages.m, 4)
	rep, _ := d.Handle(t0, Message{Kind: Release, From: 1, Incarnation: 7, Page: 0, Gen: 1})
	require.Equal(t, OK, rep.Kind)
	require.Len(t, d.pages.m, 3, "a released page is forgotten")
	st, owner, _ := d.State(131071)
	require.Equal(t, Modified, st)
	require.EqualValues(t, 2, owner)

	require.Empty(t, d.Tick(t0.Add(cfg.Lease/2), cfg.Lease/10))
	require.Len(t, d.pages.m, 3, "leases not run out yet")
	later := t0.Add(cfg.Lease)
	require.Empty(t, d.Tick(later, cfg.Lease/10))
	require.Len(t, d.pages.m, 1, "the shared pages whose leases ran out are swept; the owner stays")
	require.Zero(t, d.Stats().LostOwners)
	g, _ = d.Handle(later, Message{Kind: ReadReq, From: 3, PageSize: 512, Page: 131071, Seq: 1})
	require.Equal(t, Grant, g.Kind)
	require.EqualValues(t, 1, d.Stats().LostOwners, "asked for, the page tells the lost owner")
	require.NoError(t, d.Check())
}

// TestDirectoryForgetsWholeSegment: a sharer reads every page of 64 MiB
// of 512-byte pages once and goes away; Ticks forget the pages within
// about a lease and make the directory's map anew, so the room the pages
// took does not stay; what is held again is kept.
func TestDirectoryForgetsWholeSegment(t *testing.T) {
	d, cfg, t0 := directory512(t, 64<<20)
	holdAll(t, d, t0)
	require.Len(t, d.pages.m, d.Pages())
	later := t0.Add(cfg.Lease)
	for tick := 0; len(d.pages.m) > 0; tick++ {
		require.Less(t, tick, d.Pages()/sweepPerTick+2, "forgotten %d of %d pages", d.Pages()-len(d.pages.m), d.Pages())
		d.Tick(later, cfg.Lease/10)
	}
	require.Zero(t, d.pages.peak, "the map was made anew")
	g, _ := d.Handle(later, Message{Kind: ReadReq, From: 2, PageSize: 512, Page: 9, Seq: 1})
	require.Equal(t, Grant, g.Kind)
	require.Len(t, d.pages.m, 1)
	require.NoError(t, d.Check())
}

// holdAll has sharer 1 read every page of d at t0.
func holdAll(tb testing.TB, d *Directory, t0 time.Time) {
	for pg := range uint32(d.Pages()) {
		g, _ := d.Handle(t0, Message{Kind: ReadReq, From: 1, PageSize: 512, Page: pg, Seq: uint64(pg) + 1})
		require.Equal(tb, Grant, g.Kind)
	}
}

// BenchmarkTickLargeDirectory times a Tick of a directory over 1 GiB of
// 512-byte pages (2 Mi pages) of which one is held: what each directory
// costs its home every twentieth of a lease. In "held-once" a sharer held
// every page before its leases ran out and the Ticks forgot them.
func BenchmarkTickLargeDirectory(b *testing.B) {
	for _, once := range []bool{false, true} {
		name := "fresh"
		if once {
			name = "held-once"
		}
		b.Run(name, func(b *testing.B) {
			d, cfg, t0 := directory512(b, 1<<30)
			if once {
				holdAll(b, d, t0)
				t0 = t0.Add(cfg.Lease)
				for len(d.pages.m) > 0 {
					d.Tick(t0, cfg.Lease/10)
				}
			}
			g, _ := d.Handle(t0, Message{Kind: ReadReq, From: 2, PageSize: 512, Page: 5, Seq: 1})
			require.Equal(b, Grant, g.Kind)
			for b.Loop() {
				d.Tick(t0, cfg.Lease/10)
			}
		})
	}
}

// directory512 is a directory of incarnation 7 over size bytes of 512-byte
// pages, started at the returned time.
func directory512(tb testing.TB, size int) (*Directory, Config, time.Time) {
	cfg := DefaultConfig()
	cfg.PageSize = 512
	t0 := time.Unix(1000, 0)
	d, err := NewDirectory(cfg, make([]byte, size), 7, t0)
	require.NoError(tb, err)
	return d, cfg, t0
}
