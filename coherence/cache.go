package coherence

import (
	"fmt"
	"time"
)

// request is a line's outstanding ReadReq or WriteReq.
type request struct {
	seq       uint64
	excl      bool
	firstSent time.Time // the lease of its grant (which adds the home's hold) counts from here
}

// line is one page as a sharer holds it.
type line struct {
	state  PageState
	gen    uint64
	expiry time.Time // the sharer's view: never later than the home's
	data   []byte
	dirty  bool
	ver    uint64 // bumped by every write
	wbSeq  uint64 // the last WriteBack built for this line
	wbVer  uint64 // ver when it was built
	req    *request
	inv    *Message // an Invalidate that arrived before its grant
	once   bool     // the grant is used by one operation, then inv applies
	flush  bool     // a WriteBack giving up ownership is on its way: read only
	keep   Mode     // what that WriteBack keeps
}

// Cache is the sharer's side of the protocol for one segment: per page its
// state (Invalid, Shared or Modified), generation, lease expiry, data and
// outstanding request. Like Directory it is a pure state machine: time comes
// in as arguments and messages go out as return values.
//
// A Cache is not safe for concurrent use; Sharer serializes it.
type Cache struct {
	cfg   Config
	id    SharerID
	size  int64
	inc   uint64 // the directory's incarnation, learnt from the first answer
	seq   uint64
	lines []line
	err   error // sticky: the segment is lost
}

// NewCache returns the cache of sharer id for a segment of size bytes. id
// must be new to the home (see SharerID): NewSharer draws a random one.
func NewCache(cfg Config, id SharerID, size int64) (*Cache, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if id == 0 || size <= 0 {
		return nil, fmt.Errorf("coherence: cache for sharer %d of a %d-byte segment: %w; use a non-zero id and size", id, size, ErrInvalid)
	}
	n := (size + int64(cfg.PageSize) - 1) / int64(cfg.PageSize)
	return &Cache{cfg: cfg, id: id, size: size, lines: make([]line, n)}, nil
}

// ID returns the sharer id.
func (c *Cache) ID() SharerID { return c.id }

// Err returns the error that ended the cache (ErrSegmentLost), or nil.
func (c *Cache) Err() error { return c.err }

// Pages returns the number of pages.
func (c *Cache) Pages() int { return len(c.lines) }

// State returns the page's state as the sharer holds it at now: an expired
// copy is Invalid.
func (c *Cache) State(now time.Time, pg uint32) PageState {
	l := &c.lines[pg]
	switch {
	case l.state == Invalid || !now.Before(l.expiry) || (l.flush && l.keep == KeepNothing):
		return Invalid
	case l.flush:
		return Shared
	}
	return l.state
}

// Readable returns the page's data if the sharer may read it at now.
// The slice is the cache's own: use it only until the next call.
func (c *Cache) Readable(now time.Time, pg uint32) ([]byte, bool) {
	if c.State(now, pg) == Invalid || c.err != nil {
		return nil, false
	}
	return c.lines[pg].data, true
}

// Writable returns the page's data if the sharer owns it at now; the caller
// may change it and must then call Wrote.
func (c *Cache) Writable(now time.Time, pg uint32) ([]byte, bool) {
	l := &c.lines[pg]
	if c.err != nil || l.state != Modified || l.flush || !now.Before(l.expiry) {
		return nil, false
	}
	return l.data, true
}

// Wrote records that the caller changed the page's data.
func (c *Cache) Wrote(pg uint32) {
	l := &c.lines[pg]
	l.dirty = true
	l.ver++
}

// Request returns the ReadReq or WriteReq to send for the page: a new one,
// or the outstanding one again (same Seq; its kind may differ from excl,
// the caller asks again once it is answered). An owned page whose lease ran
// out before it was written back fails with ErrLeaseExpired: its writes are
// lost, and the page is dropped so the next request starts afresh.
func (c *Cache) Request(now time.Time, pg uint32, excl bool) (Message, error) {
	if c.err != nil {
		return Message{}, c.err
	}
	l := &c.lines[pg]
	if l.state == Modified && !now.Before(l.expiry) {
		dirty := l.dirty
		l.state, l.dirty = Invalid, false
		if dirty {
			return Message{}, fmt.Errorf("coherence: page %d: the ownership lease ran out at %s before its writes were written back; they are lost: %w", pg, l.expiry.Format(time.RFC3339Nano), ErrLeaseExpired)
		}
	}
	if l.req == nil {
		c.seq++
		l.req = &request{seq: c.seq, excl: excl, firstSent: now}
	}
	k := ReadReq
	if l.req.excl {
		k = WriteReq
	}
	return Message{Kind: k, From: c.id, Incarnation: c.inc, PageSize: uint32(c.cfg.PageSize), Page: pg, Seq: l.req.seq}, nil
}

// Pending reports whether the page has an outstanding request.
func (c *Cache) Pending(pg uint32) bool { return c.lines[pg].req != nil }

// Cancel forgets the page's outstanding request (the caller gave up on it;
// a grant that still arrives is ignored, and the home takes it back when
// its lease ends or on the next invalidation).
func (c *Cache) Cancel(pg uint32) { c.lines[pg].req = nil }

// learn checks a home message's incarnation.
func (c *Cache) learn(m *Message) error {
	if c.err != nil {
		return c.err
	}
	if m.Incarnation == 0 {
		return nil
	}
	if c.inc == 0 {
		c.inc = m.Incarnation
		return nil
	}
	if m.Incarnation != c.inc {
		c.err = fmt.Errorf("coherence: the home's directory restarted (incarnation %#x, was %#x): pages this sharer held and writes not yet written back are gone: %w", m.Incarnation, c.inc, ErrSegmentLost)
		for i := range c.lines {
			c.lines[i] = line{}
		}
		return c.err
	}
	return nil
}

// Push applies a message the home pushed (Grant, Invalidate) and returns
// the messages to send back (InvAck).
func (c *Cache) Push(now time.Time, m Message) ([]Message, error) {
	if err := c.learn(&m); err != nil {
		return nil, err
	}
	if int(m.Page) >= len(c.lines) {
		return nil, fmt.Errorf("coherence: %s for page %d of a %d-page segment: %w", m.Kind, m.Page, len(c.lines), ErrProtocol)
	}
	switch m.Kind {
	case Grant:
		c.grant(m)
		return nil, nil
	case Invalidate:
		return c.invalidate(m), nil
	}
	return nil, fmt.Errorf("coherence: unexpected push %s: %w", m, ErrProtocol)
}

// grant installs a Grant that answers the outstanding request.
func (c *Cache) grant(m Message) {
	l := &c.lines[m.Page]
	if l.req == nil || l.req.seq != m.Seq {
		return // a duplicate, or the answer to a request given up on
	}
	st := Shared
	if m.Exclusive {
		st = Modified
	}
	l.state, l.gen, l.expiry = st, m.Gen, l.req.firstSent.Add(m.Lease)
	l.data = append(l.data[:0], m.Data...)
	l.dirty, l.req = false, nil
	l.once = l.inv != nil && l.inv.Gen >= m.Gen
	if !l.once {
		l.inv = nil
	}
}

// invalidate applies an Invalidate.
func (c *Cache) invalidate(m Message) []Message {
	l := &c.lines[m.Page]
	ack := Message{Kind: InvAck, From: c.id, Incarnation: c.inc, Page: m.Page, Gen: m.Gen, InvID: m.InvID}
	switch {
	case l.state != Invalid && l.gen > m.Gen:
		return []Message{ack} // an old duplicate; the home ignores its ack
	case l.state != Invalid && l.gen == m.Gen:
		if l.once {
			return nil // Done applies it after the one operation
		}
		return []Message{c.drop(l, m, ack)}
	}
	if l.state == Shared {
		l.state = Invalid // an older copy
	}
	if l.req != nil {
		if l.inv == nil || l.inv.Gen < m.Gen || l.inv.InvID < m.InvID {
			cp := m
			l.inv = &cp
		}
		return nil // the grant it invalidates is on its way
	}
	return []Message{ack}
}

// drop gives up the line as Invalidate m asks and fills in its ack.
func (c *Cache) drop(l *line, m Message, ack Message) Message {
	// An owner's ack carries its data; so does the ack of a resent
	// downgrade, since the first ack (with the data) may still be in flight
	// and the home waits for one with data.
	if l.state == Modified || (m.Downgrade && l.gen == m.Gen) {
		ack.HasData = true
		ack.Data = append([]byte(nil), l.data...)
	}
	if m.Downgrade {
		l.state = Shared
	} else {
		l.state = Invalid
	}
	l.dirty, l.flush = false, false
	return ack
}

// Done is called after each operation on a page; when the page's grant
// arrived already invalidated it applies that invalidation now and returns
// its ack.
func (c *Cache) Done(pg uint32) []Message {
	l := &c.lines[pg]
	if !l.once || l.inv == nil {
		l.once = false
		return nil
	}
	m := *l.inv
	l.once, l.inv = false, nil
	ack := Message{Kind: InvAck, From: c.id, Incarnation: c.inc, Page: pg, Gen: m.Gen, InvID: m.InvID}
	return []Message{c.drop(l, m, ack)}
}

// Reply applies the home's answer to request req, which was first sent at
// sentAt. It returns the messages to send (none today) and an error when
// the answer means data was lost (Stale) or the segment is (ErrSegmentLost).
func (c *Cache) Reply(now, sentAt time.Time, req, rep Message) error {
	if err := c.learn(&rep); err != nil {
		return err
	}
	if int(rep.Page) >= len(c.lines) || rep.Page != req.Page {
		return fmt.Errorf("coherence: reply %s to %s: %w", rep, req, ErrProtocol)
	}
	l := &c.lines[req.Page]
	switch rep.Kind {
	case Grant:
		c.grant(rep)
	case Wait:
		// The request stays outstanding: its grant is pushed.
	case Busy:
		// The home did not take the request: the next one is new, and its
		// lease counts from when it is sent.
		if l.req != nil && l.req.seq == req.Seq {
			l.req = nil
		}
	case OK:
		if req.Kind != WriteBack || l.state != Modified || l.gen != req.Gen {
			return nil
		}
		if req.WBSeq == l.wbSeq && l.ver == l.wbVer {
			l.dirty = false
		}
		switch req.Mode {
		case KeepModified:
			if rep.Lease > 0 && !l.flush {
				l.expiry = maxTime(l.expiry, sentAt.Add(rep.Lease))
			}
		case KeepShared:
			l.state, l.flush = Shared, false
		default:
			l.state, l.flush = Invalid, false
		}
	case Stale:
		if req.Kind != WriteBack || l.state != Modified || l.gen != req.Gen {
			return nil // the page was handed over since (its data with it)
		}
		l.state, l.dirty, l.flush = Invalid, false, false
		return fmt.Errorf("coherence: page %d: the home refused its write-back because the ownership lease ran out; writes since the last Sync are lost: %w", req.Page, ErrLeaseExpired)
	case Refused:
		if rep.Code == CodeClosed {
			c.err = fmt.Errorf("coherence: the home closed the segment's directory (freed, or its daemon stopping): %w", ErrSegmentLost)
			return c.err
		}
		return fmt.Errorf("coherence: the home refused %s with code %d (page size %d at the home): %w", req, rep.Code, rep.PageSize, ErrProtocol)
	default:
		return fmt.Errorf("coherence: reply %s to %s: %w", rep, req, ErrProtocol)
	}
	return nil
}

// WriteBack returns the WriteBack of an owned page with mode, and whether
// the page is owned. The message carries a copy of the data. A mode that
// gives up ownership makes the page read-only at once (writes after the
// copy was taken would be lost); it stays owned until the home answers.
func (c *Cache) WriteBack(pg uint32, mode Mode) (Message, bool) {
	l := &c.lines[pg]
	if l.state != Modified || c.err != nil {
		return Message{}, false
	}
	if mode != KeepModified {
		l.flush, l.keep = true, mode
	}
	l.wbSeq++
	l.wbVer = l.ver
	return Message{Kind: WriteBack, From: c.id, Incarnation: c.inc, Page: pg, Gen: l.gen, WBSeq: l.wbSeq, Mode: mode,
		Data: append([]byte(nil), l.data...)}, true
}

// Release drops a shared copy and returns the Release to send, if the page
// was held shared.
func (c *Cache) Release(pg uint32) (Message, bool) {
	l := &c.lines[pg]
	if l.state != Shared || c.err != nil {
		return Message{}, false
	}
	l.state = Invalid
	return Message{Kind: Release, From: c.id, Incarnation: c.inc, Page: pg, Gen: l.gen}, true
}

// Owned returns the pages held modified, and whether each is dirty.
func (c *Cache) Owned() (pages []uint32, dirty []bool) {
	for i := range c.lines {
		if c.lines[i].state == Modified {
			pages = append(pages, uint32(i))
			dirty = append(dirty, c.lines[i].dirty)
		}
	}
	return pages, dirty
}

// Expiry returns the page's lease expiry (zero when Invalid).
func (c *Cache) Expiry(pg uint32) time.Time {
	if c.lines[pg].state == Invalid {
		return time.Time{}
	}
	return c.lines[pg].expiry
}

// Gen returns the generation of the page's copy.
func (c *Cache) Gen(pg uint32) uint64 { return c.lines[pg].gen }
