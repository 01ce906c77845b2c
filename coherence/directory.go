package coherence

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"time"
)

// PageState is a page's state at the home.
type PageState uint8

// The home's page states.
const (
	// Invalid: no sharer holds the page; the home's memory is current.
	Invalid PageState = iota
	// Shared: one or more sharers hold read-only copies under read leases;
	// the home's memory is current.
	Shared
	// Modified: one sharer owns the page and may have changed it; the home's
	// memory is current only as of the owner's last write-back.
	Modified
)

// String returns the state's name.
func (s PageState) String() string {
	switch s {
	case Invalid:
		return "Invalid"
	case Shared:
		return "Shared"
	case Modified:
		return "Modified"
	}
	return fmt.Sprintf("PageState(%d)", uint8(s))
}

// holder is one sharer's grant as the home sees it.
type holder struct {
	gen    uint64
	expiry time.Time // the home's view; the sharer's own is earlier
	// seq is the request the grant answered and since when the home took
	// it (after the directory started): a resend of that request, whose
	// grant was lost or crossed it, is granted counting the hold from then.
	seq   uint64
	since time.Duration
}

// heldBy is a holder and its sharer.
type heldBy struct {
	id SharerID
	holder
}

// holderSet is a page's holders, sorted by sharer id. A page has a few at
// most, and a slice costs the home a fraction of a map per page held.
type holderSet []heldBy

func (hs holderSet) find(id SharerID) (int, bool) {
	return slices.BinarySearchFunc(hs, id, func(e heldBy, id SharerID) int { return cmp.Compare(e.id, id) })
}

// get returns id's holder.
func (hs holderSet) get(id SharerID) (holder, bool) {
	if i, ok := hs.find(id); ok {
		return hs[i].holder, true
	}
	return holder{}, false
}

// put sets id's holder.
func (hs *holderSet) put(id SharerID, h holder) {
	i, ok := hs.find(id)
	if ok {
		(*hs)[i].holder = h
		return
	}
	*hs = slices.Insert(*hs, i, heldBy{id, h})
}

// del removes id's holder, if any.
func (hs *holderSet) del(id SharerID) {
	if i, ok := hs.find(id); ok {
		*hs = slices.Delete(*hs, i, i+1)
	}
}

// ids returns the sharer ids, sorted.
func (hs holderSet) ids() []SharerID {
	out := make([]SharerID, len(hs))
	for i, e := range hs {
		out[i] = e.id
	}
	return out
}

// waitee is a sharer a transaction waits for: its ack or its lease's end.
type waitee struct {
	invID    uint64
	gen      uint64
	expiry   time.Time
	lastSent time.Time
}

// txn is the one request a page is working on: invalidations sent, acks
// awaited.
type txn struct {
	excl    bool
	who     SharerID
	seq     uint64
	since   time.Time // when the home took the request (first, for a resend of a granted one)
	waiting map[SharerID]*waitee
	expired bool // some waitee's lease ran out instead of acking
}

// page is the directory entry of one page.
type page struct {
	owner   SharerID // non-zero: Modified, and holders is {owner}
	holders holderSet
	lastWB  uint64 // the owner's last applied WriteBack
	txn     *txn
}

func (p *page) state() PageState {
	switch {
	case p.owner != 0:
		return Modified
	case len(p.holders) > 0:
		return Shared
	}
	return Invalid
}

// Stats counts what a directory did. A plain value.
type Stats struct {
	// Grants counts shared and exclusive grants sent.
	Grants uint64
	// Invalidations counts Invalidate messages sent (resends included).
	Invalidations uint64
	// WriteBacks counts modified pages stored at the home (WriteBack or
	// InvAck with data).
	WriteBacks uint64
	// LeaseWaits counts requests that had to wait for a sharer's lease to
	// run out because it did not acknowledge an invalidation.
	LeaseWaits uint64
	// LostOwners counts owners whose lease ran out before they wrote back:
	// the page reverted to its last written-back contents.
	LostOwners uint64
	// StaleWriteBacks counts write-backs refused because the writer no
	// longer owned the page.
	StaleWriteBacks uint64
}

// Directory is the home's side of the protocol for one segment: per page,
// who holds it shared (with read-lease expiries) and who holds it modified.
// It is a pure state machine: time comes in as arguments, messages go out as
// return values, and the segment's memory is a byte slice it reads grants
// from and stores write-backs into.
//
// A Directory keeps state only for pages some sharer holds or asks for: a
// page no one holds costs nothing, and time advances over the pages that
// wait for sharers, not over the segment, so a directory for a large
// segment of which little is shared costs little memory and time.
//
// A Directory is not safe for concurrent use; Home serializes it.
type Directory struct {
	cfg     Config
	mem     []byte
	n       int       // pages in mem
	pages   pageTable // pages with a holder, an owner or a transaction
	txns    pageTable // pages with a transaction under way
	inc     uint64
	gen     uint64
	inv     uint64
	started time.Time
	stats   Stats
	lost    map[uint64]SharerID // grants whose owner was given up on, by generation
}

// NewDirectory returns the directory of a segment whose memory is mem,
// started at now with incarnation inc (non-zero, different on every start).
// A trailing partial page is a page too.
func NewDirectory(cfg Config, mem []byte, inc uint64, now time.Time) (*Directory, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if inc == 0 {
		return nil, fmt.Errorf("coherence: incarnation 0: %w; pass a random non-zero value", ErrInvalid)
	}
	n := (len(mem) + cfg.PageSize - 1) / cfg.PageSize
	return &Directory{cfg: cfg, mem: mem, n: n, pages: newPageTable(), txns: newPageTable(), inc: inc, started: now}, nil
}

// Incarnation returns the directory's incarnation.
func (d *Directory) Incarnation() uint64 { return d.inc }

// Stats returns the counters.
func (d *Directory) Stats() Stats { return d.stats }

// Pages returns the number of pages.
func (d *Directory) Pages() int { return d.n }

// page returns page pg's state, starting it if the page had none.
func (d *Directory) page(pg uint32) *page {
	p := d.pages.m[pg]
	if p == nil {
		p = &page{}
		d.pages.set(pg, p)
	}
	return p
}

// settle forgets page pg's state once it has none left: no holder, no
// owner, no transaction. (The owner's last write-back sequence goes with
// it: it matters only while the page has an owner.)
func (d *Directory) settle(pg uint32, p *page) {
	if p.txn == nil {
		delete(d.txns.m, pg)
		if p.owner == 0 && len(p.holders) == 0 {
			delete(d.pages.m, pg)
		}
	} else {
		d.txns.set(pg, p)
	}
}

// pageTable is pages by number. A Go map keeps the room of its largest
// size, and walking it (the sweep, Tick, Sharers) costs what that room
// does, so the table is made anew once it holds less than a quarter of
// what it held at most (shrink): a segment that sharers once held whole
// does not keep its home's memory and Ticks at that size for the
// directory's life.
type pageTable struct {
	m    map[uint32]*page
	peak int // the most entries m held since it was made
}

func newPageTable() pageTable { return pageTable{m: map[uint32]*page{}} }

// set puts p in as page pg.
func (t *pageTable) set(pg uint32, p *page) {
	t.m[pg] = p
	t.peak = max(t.peak, len(t.m))
}

// shrink makes the table anew when it holds less than a quarter of its
// peak (past 1024).
func (t *pageTable) shrink() {
	if t.peak > 1024 && len(t.m) < t.peak/4 {
		fresh := make(map[uint32]*page, len(t.m)) // not maps.Clone, which may keep the room
		maps.Copy(fresh, t.m)
		t.m, t.peak = fresh, len(fresh)
	}
}

// State returns page pg's state, its owner (Modified) and its holders,
// sorted.
func (d *Directory) State(pg uint32) (PageState, SharerID, []SharerID) {
	p := d.pages.m[pg]
	if p == nil {
		return Invalid, 0, nil
	}
	return p.state(), p.owner, p.holders.ids()
}

// pageData returns page pg of the memory.
func (d *Directory) pageData(pg uint32) []byte {
	off := int(pg) * d.cfg.PageSize
	return d.mem[off:min(off+d.cfg.PageSize, len(d.mem))]
}

func (d *Directory) reply(to SharerID, k Kind, pg uint32) Message {
	return Message{Kind: k, From: to, Incarnation: d.inc, Page: pg}
}

// answer is the reply of kind k to request m: it echoes m's numbers.
func (d *Directory) answer(m Message, k Kind) Message {
	return Message{Kind: k, From: m.From, Incarnation: d.inc, Page: m.Page, Seq: m.Seq, Gen: m.Gen, InvID: m.InvID, WBSeq: m.WBSeq}
}

// Handle processes request m from sharer m.From at time now. It returns
// the reply to send to m.From and the messages to push to other sharers
// (each addressed by its From).
func (d *Directory) Handle(now time.Time, m Message) (Message, []Message) {
	switch m.Kind {
	case ReadReq, WriteReq, InvAck, WriteBack, Release:
	default:
		r := d.answer(m, Refused)
		r.Code = CodeBadKind
		return r, nil
	}
	if int(m.Page) >= d.n {
		r := d.answer(m, Refused)
		r.Code = CodeBadPage
		return r, nil
	}
	if m.PageSize != uint32(d.cfg.PageSize) && (m.Kind == ReadReq || m.Kind == WriteReq) {
		r := d.answer(m, Refused)
		r.Code = CodePageSize
		r.PageSize = uint32(d.cfg.PageSize)
		return r, nil
	}
	var out []Message
	if m.Incarnation != 0 && m.Incarnation != d.inc {
		// A sharer of a previous incarnation: none of its grants exist here.
		// Its requests are answered (it learns the new incarnation and
		// fails); its write-backs are refused.
		if m.Kind == WriteBack {
			d.stats.StaleWriteBacks++
			return d.answer(m, Stale), nil
		}
		if m.Kind != ReadReq && m.Kind != WriteReq {
			return d.answer(m, OK), nil
		}
	}
	p := d.page(m.Page)
	defer d.settle(m.Page, p)
	switch m.Kind {
	case ReadReq, WriteReq:
		return d.request(now, p, m)
	case InvAck:
		if m.HasData && d.lost[m.Gen] == m.From {
			// The owner's lease ran out before this data arrived: the page
			// moved on without it.
			d.stats.StaleWriteBacks++
			return d.answer(m, Stale), nil
		}
		out = d.ack(now, p, m)
		return d.answer(m, OK), out
	case WriteBack:
		return d.writeBack(now, p, m)
	default: // Release
		if h, ok := p.holders.get(m.From); ok {
			if p.owner == m.From || h.gen > m.Gen {
				return d.answer(m, OK), nil // an old Release; the holder's grant is newer
			}
			p.holders.del(m.From)
		}
		out = d.acked(now, p, m.Page, m.From)
		return d.answer(m, OK), out
	}
}

// request handles ReadReq and WriteReq.
func (d *Directory) request(now time.Time, p *page, m Message) (Message, []Message) {
	pg := m.Page
	if now.Before(d.started.Add(d.cfg.Grace)) {
		r := d.answer(m, Busy)
		r.Lease = d.started.Add(d.cfg.Grace).Sub(now)
		return r, nil
	}
	if t := p.txn; t != nil {
		if t.who == m.From && t.seq == m.Seq {
			return d.answer(m, Wait), nil
		}
		r := d.answer(m, Busy)
		r.Lease = d.cfg.Lease / 100
		return r, nil
	}
	d.expire(now, p)
	excl := m.Kind == WriteReq
	since := now
	h, holds := p.holders.get(m.From)
	if holds && h.seq == m.Seq {
		// A resend of the request this holder was granted: the sharer
		// never got that grant (lost, or crossing this resend) and counts
		// the lease from before the home first took the request.
		since = d.started.Add(h.since)
	}
	if p.owner == m.From { // an owner is a holder
		// The owner asks again: its grant was lost in transit (it never
		// wrote, so the home's copy is current) or this is a duplicate it
		// will ignore. Grant again, same generation.
		h.expiry = maxTime(h.expiry, now.Add(d.cfg.Lease))
		p.holders.put(m.From, h)
		return d.grant(m.From, pg, m.Seq, h.gen, true, now.Sub(since)), nil
	}
	t := &txn{excl: excl, who: m.From, seq: m.Seq, since: since, waiting: map[SharerID]*waitee{}}
	for _, e := range p.holders { // sorted by id: runs are reproducible
		id, h := e.id, e.holder
		if id == m.From || (!excl && p.owner != id) {
			continue
		}
		d.inv++
		t.waiting[id] = &waitee{invID: d.inv, gen: h.gen, expiry: h.expiry}
	}
	if len(t.waiting) == 0 {
		return d.complete(now, p, pg, t), nil
	}
	p.txn = t
	var out []Message
	for _, id := range slices.Sorted(maps.Keys(t.waiting)) {
		out = append(out, d.invalidate(now, pg, id, t.waiting[id], !excl))
	}
	return d.answer(m, Wait), sortByTo(out)
}

func (d *Directory) invalidate(now time.Time, pg uint32, to SharerID, w *waitee, downgrade bool) Message {
	w.lastSent = now
	d.stats.Invalidations++
	m := d.reply(to, Invalidate, pg)
	m.Gen, m.InvID, m.Downgrade = w.gen, w.invID, downgrade
	return m
}

// complete grants t's request; the page has no conflicting holder left.
func (d *Directory) complete(now time.Time, p *page, pg uint32, t *txn) Message {
	p.txn = nil
	if t.expired {
		d.stats.LeaseWaits++
	}
	d.gen++
	if t.excl {
		p.holders = p.holders[:0]
		p.owner = t.who
		p.lastWB = 0
	}
	p.holders.put(t.who, holder{gen: d.gen, expiry: now.Add(d.cfg.Lease), seq: t.seq, since: t.since.Sub(d.started)})
	return d.grant(t.who, pg, t.seq, d.gen, t.excl, now.Sub(t.since))
}

// grant is the Grant of page pg to sharer to, for its request seq, which
// the home held for held. Its Lease counts from when the sharer first sent
// the request (the sharer cannot know when the home granted): the lease
// plus held, which is never past the home's lease, since the request
// arrived after it was sent. A grant that waited most of a lease for
// invalidations so still comes with a whole lease to use.
func (d *Directory) grant(to SharerID, pg uint32, seq, gen uint64, excl bool, held time.Duration) Message {
	d.stats.Grants++
	m := d.reply(to, Grant, pg)
	m.Seq, m.Gen, m.Lease, m.Exclusive = seq, gen, d.cfg.Lease+max(held, 0), excl
	m.Data = slices.Clone(d.pageData(pg))
	return m
}

// expire drops holders whose lease ran out; an owner's unwritten data is
// lost with it.
func (d *Directory) expire(now time.Time, p *page) {
	p.holders = slices.DeleteFunc(p.holders, func(e heldBy) bool {
		if now.Before(e.expiry) {
			return false
		}
		if p.owner == e.id {
			p.owner = 0
			d.lostOwner(e.id, e.gen)
		}
		return true
	})
}

// maxLost bounds the lost grants a directory remembers.
const maxLost = 1024

// lostOwner records that the owner id of grant gen was given up on (its
// lease ran out): its unwritten data is lost, and an InvAck that still
// brings that data is answered Stale so the sharer reports the loss.
func (d *Directory) lostOwner(id SharerID, gen uint64) {
	d.stats.LostOwners++
	if d.lost == nil {
		d.lost = map[uint64]SharerID{}
	}
	if len(d.lost) >= maxLost {
		clear(d.lost) // a sharer that late has long failed its Sync
	}
	d.lost[gen] = id
}

// ack handles InvAck.
func (d *Directory) ack(now time.Time, p *page, m Message) []Message {
	t := p.txn
	if t == nil {
		return nil
	}
	w, ok := t.waiting[m.From]
	if !ok || w.invID != m.InvID {
		return nil // a duplicate, or an ack of an invalidation given up on
	}
	if p.owner == m.From && !m.HasData {
		// The ack of a resent invalidation that overtook the ack with the
		// data: wait for that one (or for the owner's lease to run out).
		return nil
	}
	if m.HasData && p.owner == m.From {
		copy(d.pageData(m.Page), m.Data)
		d.stats.WriteBacks++
	}
	if p.owner == m.From {
		p.owner = 0
	}
	if t.excl {
		p.holders.del(m.From)
	} // a downgraded owner stays a sharer with its lease
	return d.acked(now, p, m.Page, m.From)
}

// acked removes from from the waiters of p's transaction, completing it
// when none is left.
func (d *Directory) acked(now time.Time, p *page, pg uint32, from SharerID) []Message {
	t := p.txn
	if t == nil {
		return nil
	}
	if _, ok := t.waiting[from]; !ok {
		return nil
	}
	delete(t.waiting, from)
	if len(t.waiting) > 0 {
		return nil
	}
	return []Message{d.complete(now, p, pg, t)}
}

// writeBack handles WriteBack.
func (d *Directory) writeBack(now time.Time, p *page, m Message) (Message, []Message) {
	h, ok := p.holders.get(m.From)
	if p.owner != m.From || !ok || h.gen != m.Gen {
		d.stats.StaleWriteBacks++
		return d.answer(m, Stale), nil
	}
	if m.WBSeq > p.lastWB {
		copy(d.pageData(m.Page), m.Data)
		p.lastWB = m.WBSeq
		d.stats.WriteBacks++
	}
	r := d.answer(m, OK)
	var out []Message
	switch m.Mode {
	case KeepModified:
		if t := p.txn; t == nil || t.waiting[m.From] == nil {
			h.expiry = maxTime(h.expiry, now.Add(d.cfg.Lease))
			p.holders.put(m.From, h)
			r.Lease = d.cfg.Lease
		}
	case KeepShared:
		p.owner = 0
		if t := p.txn; t != nil && !t.excl {
			out = d.acked(now, p, m.Page, m.From)
		}
	default:
		p.owner = 0
		p.holders.del(m.From)
		out = d.acked(now, p, m.Page, m.From)
	}
	return r, out
}

// Tick advances time: transactions stop waiting for sharers whose leases
// ran out (and complete when no one is left), and invalidations unanswered
// for resend are sent again. It returns the messages to push.
func (d *Directory) Tick(now time.Time, resend time.Duration) []Message {
	var out []Message
	var pgs []uint32
	if len(d.txns.m) > 0 {
		pgs = slices.Sorted(maps.Keys(d.txns.m)) // in page order: runs are reproducible
	}
	for _, pg := range pgs {
		p := d.txns.m[pg]
		t := p.txn
		for _, id := range slices.Sorted(maps.Keys(t.waiting)) {
			w := t.waiting[id]
			switch {
			case !now.Before(w.expiry):
				delete(t.waiting, id)
				t.expired = true
				if h, ok := p.holders.get(id); ok && h.gen == w.gen {
					p.holders.del(id)
				}
				if p.owner == id {
					p.owner = 0
					d.lostOwner(id, w.gen)
				}
			case now.Sub(w.lastSent) >= resend:
				out = append(out, d.invalidate(now, pg, id, w, !t.excl))
			}
		}
		if len(t.waiting) == 0 {
			out = append(out, d.complete(now, p, pg, t))
		}
		d.settle(pg, p)
	}
	d.sweep(now)
	return out
}

// sweepPerTick bounds the pages one Tick looks at for state that only
// expired leases keep: at a Tick every twentieth of a lease, 2 Mi pages
// held once are forgotten within about 26 leases.
const sweepPerTick = 4096

// sweep forgets, among up to sweepPerTick pages (a different part of the
// directory each time: map order), those whose every holder's lease ran
// out and that have no owner and no transaction, as a request for the page
// would (expire): what sharers once held and stopped renewing does not
// stay in memory. An owner is left to the lazy expiry, which tells its
// loss (lostOwner) when the page is next asked for.
func (d *Directory) sweep(now time.Time) {
	seen := 0
	for pg, p := range d.pages.m {
		if seen++; seen > sweepPerTick {
			break
		}
		if p.owner != 0 || p.txn != nil {
			continue
		}
		d.expire(now, p)
		d.settle(pg, p)
	}
	d.pages.shrink()
	d.txns.shrink()
}

// Sharers returns the sharers holding at least one page under an unexpired
// lease at now, sorted.
func (d *Directory) Sharers(now time.Time) []SharerID {
	set := map[SharerID]bool{}
	for _, p := range d.pages.m {
		for _, e := range p.holders {
			if now.Before(e.expiry) {
				set[e.id] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// Check verifies the directory's invariants at now: at most one modified
// holder per page and no other holder beside it; every transaction's
// requester is not among its waiters. It returns the first violation.
func (d *Directory) Check() error {
	for pg, p := range d.txns.m {
		if d.pages.m[pg] != p || p.txn == nil {
			return fmt.Errorf("page %d: listed among the transactions, but its state has none", pg)
		}
	}
	for _, i := range slices.Sorted(maps.Keys(d.pages.m)) {
		p := d.pages.m[i]
		if (p.txn != nil) != (d.txns.m[i] != nil) {
			return fmt.Errorf("page %d: a transaction %v, listed among the transactions %v", i, p.txn != nil, d.txns.m[i] != nil)
		}
		if p.owner != 0 {
			if _, ok := p.holders.get(p.owner); !ok || len(p.holders) != 1 {
				return fmt.Errorf("page %d: modified by %d but holders are %v", i, p.owner, p.holders.ids())
			}
		}
		if t := p.txn; t != nil {
			if _, ok := t.waiting[t.who]; ok {
				return fmt.Errorf("page %d: the requester %d waits for itself", i, t.who)
			}
			if len(t.waiting) == 0 {
				return fmt.Errorf("page %d: a transaction for %d waits for no one", i, t.who)
			}
		}
	}
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func sortByTo(ms []Message) []Message {
	slices.SortFunc(ms, func(a, b Message) int {
		switch {
		case a.From < b.From:
			return -1
		case a.From > b.From:
			return 1
		}
		return 0
	})
	return ms
}
