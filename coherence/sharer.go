package coherence

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/internal/errs"
)

// Link carries a sharer's messages to its segment's home. Call sends one
// request and returns its reply; Poll delivers acks (InvAcks, whose
// replies carry nothing) and returns the messages the home pushed to
// sharer id, waiting up to wait for one (see Home.Poll). An error matching
// ErrSegmentLost is final (the home is gone); any other error is retried.
// Implementations are safe for concurrent use; Poll is called by one
// goroutine at a time.
type Link interface {
	Call(ctx context.Context, m Message) (Message, error)
	Poll(ctx context.Context, id SharerID, wait time.Duration, acks []Message) ([]Message, error)
}

// SharerStats counts what a sharer did. A plain value.
type SharerStats struct {
	// Hits counts page accesses served from the cached copy.
	Hits uint64
	// Misses counts page accesses that had to ask the home.
	Misses uint64
	// Requests counts ReadReq and WriteReq sent (resends included).
	Requests uint64
	// Invalidations counts Invalidate messages received.
	Invalidations uint64
	// WriteBacks counts WriteBack messages sent.
	WriteBacks uint64
	// LeaseWaits counts times the sharer waited for a pushed grant.
	LeaseWaits uint64
}

// Sharer is one attachment of a shared segment: a Cache kept coherent with
// the home's Directory over a Link. It reads pages it holds under an
// unexpired lease from its own copy, asks the home for the others, answers
// invalidations from a background poll, renews the leases of pages it owns
// and writes their data back before those leases run out.
//
// Sharer is safe for concurrent use. Its methods copy into and out of the
// caller's buffers and retain none.
type Sharer struct {
	cfg   Config
	clock Clock
	link  Link
	size  int64

	mu       sync.RWMutex // RLock: a cached read (the fast path); Lock: everything else
	cache    *Cache
	fast     []atomic.Int64  // per page: fastWord(deadline, fastRead or fastWrite), 0 for none
	base     time.Time       // the clock's reading the fast words' deadlines count from
	sysClock bool            // clock is SystemClock: the fast path reads time.Since(base)
	hot      map[uint32]bool // pages whose fast word may be set
	lastReq  []time.Time     // per page: when its request was last sent
	renewing map[uint32]bool // owned pages whose renewal (a write-back) is on its way
	changed  chan struct{}   // closed (and replaced) whenever a grant arrives
	lostErr  error           // data lost in the background, reported by Sync
	handing  inflight        // InvAcks carrying data on their way: Sync waits for them

	hits, misses, requests, invs, wbs, waits atomic.Uint64
	opTimeout                                atomic.Int64 // see SetOpTimeout

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool
}

// NewSharer attaches a sharer with a fresh random id to a segment of size
// bytes reached over link. It starts two goroutines (the poll and the lease
// keeper) that Close stops. clock nil means SystemClock.
func NewSharer(cfg Config, size int64, link Link, clock Clock) (*Sharer, error) {
	if clock == nil {
		clock = SystemClock{}
	}
	var id SharerID
	var b [8]byte
	for id == 0 {
		rand.Read(b[:])
		id = SharerID(binary.LittleEndian.Uint64(b[:]))
	}
	c, err := NewCache(cfg, id, size)
	if err != nil {
		return nil, err
	}
	s := &Sharer{cfg: cfg, clock: clock, link: link, size: size, cache: c,
		lastReq: make([]time.Time, c.Pages()), changed: make(chan struct{}),
		fast: make([]atomic.Int64, c.Pages()), hot: map[uint32]bool{}, renewing: map[uint32]bool{}}
	s.base = clock.Now()
	_, s.sysClock = clock.(SystemClock)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(2)
	go s.pollLoop()
	go s.keepLoop()
	return s, nil
}

// SetOpTimeout bounds each operation whose ctx has no deadline once it has
// to ask the home (a cached access is not bounded by it).
// Default: 0, no bound.
func (s *Sharer) SetOpTimeout(d time.Duration) { s.opTimeout.Store(int64(d)) }

// ID returns the sharer's id.
func (s *Sharer) ID() SharerID { return s.cache.ID() }

// Size returns the segment's size in bytes.
func (s *Sharer) Size() int64 { return s.size }

// Stats returns the sharer's counters.
func (s *Sharer) Stats() SharerStats {
	return SharerStats{Hits: s.hits.Load(), Misses: s.misses.Load(), Requests: s.requests.Load(),
		Invalidations: s.invs.Load(), WriteBacks: s.wbs.Load(), LeaseWaits: s.waits.Load()}
}

// ReadAt reads len(p) bytes at off, page by page; each page's part is read
// atomically (linearizable per page). A read past the end returns io.EOF
// with the bytes before it.
func (s *Sharer) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 || off > s.size {
		return 0, fmt.Errorf("coherence: read at %d of a %d-byte shared segment: %w", off, s.size, ErrOutOfRange)
	}
	n := int(min(int64(len(p)), s.size-off))
	done := 0
	for done < n {
		pg, po := s.split(off + int64(done))
		k := min(n-done, s.cfg.PageSize-po)
		err := s.access(ctx, pg, false, func(data []byte) bool {
			copy(p[done:done+k], data[po:])
			return false
		})
		if err != nil {
			return done, err
		}
		done += k
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes p at off, page by page, each page's part atomically
// (linearizable per page; a write spanning pages is not atomic as a whole).
// A write past the end writes nothing and fails with ErrOutOfRange.
func (s *Sharer) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	if off < 0 || off > s.size || int64(len(p)) > s.size-off {
		return 0, fmt.Errorf("coherence: write of %d bytes at %d of a %d-byte shared segment: %w", len(p), off, s.size, ErrOutOfRange)
	}
	done := 0
	for done < len(p) {
		pg, po := s.split(off + int64(done))
		k := min(len(p)-done, s.cfg.PageSize-po)
		err := s.access(ctx, pg, true, func(data []byte) bool {
			copy(data[po:], p[done:done+k])
			return true
		})
		if err != nil {
			return done, err
		}
		done += k
	}
	return len(p), nil
}

func (s *Sharer) split(off int64) (uint32, int) {
	return uint32(off / int64(s.cfg.PageSize)), int(off % int64(s.cfg.PageSize))
}

// word checks an atomic's offset and returns its page and offset in it.
func (s *Sharer) word(off int64) (uint32, int, error) {
	if off%8 != 0 {
		return 0, 0, fmt.Errorf("coherence: 64-bit atomic at offset %d: %w", off, ErrUnaligned)
	}
	if off < 0 || off > s.size-8 {
		return 0, 0, fmt.Errorf("coherence: 64-bit atomic at %d of a %d-byte shared segment: %w", off, s.size, ErrOutOfRange)
	}
	pg, po := s.split(off)
	return pg, po, nil
}

// CompareAndSwap64 replaces the little-endian word at off (a multiple of 8)
// with new if it equals old, under exclusive ownership of its page, and
// reports whether it did.
func (s *Sharer) CompareAndSwap64(ctx context.Context, off int64, old, new uint64) (bool, error) {
	pg, po, err := s.word(off)
	if err != nil {
		return false, err
	}
	var swapped bool
	err = s.access(ctx, pg, true, func(data []byte) bool {
		if binary.LittleEndian.Uint64(data[po:]) == old {
			binary.LittleEndian.PutUint64(data[po:], new)
			swapped = true
		}
		return swapped
	})
	return swapped, err
}

// FetchAdd64 adds delta to the little-endian word at off (a multiple of 8)
// under exclusive ownership of its page and returns the previous value.
func (s *Sharer) FetchAdd64(ctx context.Context, off int64, delta uint64) (uint64, error) {
	pg, po, err := s.word(off)
	if err != nil {
		return 0, err
	}
	var prev uint64
	err = s.access(ctx, pg, true, func(data []byte) bool {
		prev = binary.LittleEndian.Uint64(data[po:])
		binary.LittleEndian.PutUint64(data[po:], prev+delta)
		return true
	})
	return prev, err
}

// Load64 reads the little-endian word at off (a multiple of 8).
func (s *Sharer) Load64(ctx context.Context, off int64) (uint64, error) {
	pg, po, err := s.word(off)
	if err != nil {
		return 0, err
	}
	var v uint64
	err = s.access(ctx, pg, false, func(data []byte) bool {
		v = binary.LittleEndian.Uint64(data[po:])
		return false
	})
	return v, err
}

// access runs fn on page pg's data once the sharer holds it readable (or,
// with excl, owned); fn reports whether it changed the data.
func (s *Sharer) access(ctx context.Context, pg uint32, excl bool, fn func([]byte) bool) error {
	if s.tryFast(pg, excl, fn) {
		s.hits.Add(1)
		return nil
	}
	backoff := time.Duration(0)
	missed := false
	for {
		if s.closed.Load() {
			return fmt.Errorf("coherence: shared segment: %w", ErrClosed)
		}
		s.mu.Lock()
		now := s.clock.Now()
		var data []byte
		var ok bool
		if excl {
			data, ok = s.cache.Writable(now, pg)
		} else {
			data, ok = s.cache.Readable(now, pg)
		}
		if ok {
			if fn(data) {
				s.cache.Wrote(pg)
			}
			acks := s.cache.Done(pg)
			s.handing.add(acks)
			s.settle(now, pg)
			s.mu.Unlock()
			if missed {
				s.misses.Add(1)
			} else {
				s.hits.Add(1)
			}
			s.sendAll(acks)
			return nil
		}
		if !missed {
			missed = true
			if _, ok := ctx.Deadline(); !ok && s.opTimeout.Load() > 0 {
				s.mu.Unlock()
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, time.Duration(s.opTimeout.Load()))
				defer cancel()
				continue
			}
		}
		// Ask the home unless another caller asked for this page just now.
		resend := s.cfg.Lease / 8
		ask := !s.cache.Pending(pg) || now.Sub(s.lastReq[pg]) >= resend
		req, err := s.cache.Request(now, pg, excl)
		if errors.Is(err, ErrLeaseExpired) {
			// Sync reports it too: a loss found by an operation on the
			// page, even while a Sync runs, is not missed by the next Sync.
			s.lostErr = errors.Join(s.lostErr, err)
		}
		s.settle(now, pg)
		wake := s.changed
		if err == nil && ask {
			s.lastReq[pg] = now
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		if !ask {
			if err := s.wait(ctx, wake, resend); err != nil {
				return err
			}
			continue
		}
		s.requests.Add(1)
		sentAt := now
		rep, err := s.call(ctx, req)
		if err != nil {
			s.lose(err)
			return err
		}
		s.mu.Lock()
		err = s.cache.Reply(s.clock.Now(), sentAt, req, rep)
		s.settleAll(s.clock.Now())
		if rep.Kind == Grant {
			s.wakeAll() // callers waiting for the same page
		}
		s.mu.Unlock()
		if err != nil {
			return err
		}
		switch rep.Kind {
		case Wait:
			s.waits.Add(1)
			if err := s.wait(ctx, wake, resend); err != nil {
				return err
			}
		case Busy:
			backoff = min(max(2*backoff, 50*time.Microsecond), max(rep.Lease, time.Millisecond), 20*time.Millisecond)
			if err := s.sleep(ctx, backoff); err != nil {
				return err
			}
		}
	}
}

// wait blocks until a grant arrives, d passes or ctx ends.
func (s *Sharer) wait(ctx context.Context, wake <-chan struct{}, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-wake:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("coherence: waiting for the home's grant: %w", ctx.Err())
	case <-s.ctx.Done():
		return fmt.Errorf("coherence: shared segment: %w", ErrClosed)
	}
}

func (s *Sharer) sleep(ctx context.Context, d time.Duration) error {
	return s.wait(ctx, nil, d)
}

// call sends one request, retrying transport failures until ctx ends.
func (s *Sharer) call(ctx context.Context, m Message) (Message, error) {
	backoff := time.Millisecond
	for {
		rep, err := s.link.Call(ctx, m)
		if err == nil {
			return rep, nil
		}
		if errors.Is(err, ErrSegmentLost) {
			return Message{}, err
		}
		var serr error
		if ctx.Err() == nil {
			serr = s.sleep(ctx, backoff)
		}
		if ctx.Err() != nil { // also when it ended during the backoff
			return Message{}, fmt.Errorf("coherence: %s for page %d: the home did not answer: %w (%w)", m.Kind, m.Page, err, errs.ErrHomeUnreachable)
		}
		if serr != nil {
			return Message{}, serr
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// lose records err when it says the segment is lost for good: every page
// is dropped and every later call, Sync and Close report it.
func (s *Sharer) lose(err error) {
	if !errors.Is(err, ErrSegmentLost) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cache.err == nil {
		s.cache.err = err
	}
	s.settleAll(s.clock.Now())
}

// sendAll delivers acks in the background, each retried until answered or
// its usefulness (one lease) has passed.
func (s *Sharer) sendAll(msgs []Message) {
	if len(msgs) == 0 {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.deliver(msgs)
	}()
}

// deliver sends each ack, retried until answered or its usefulness (one
// lease) has passed. An ack that carries an owner's data is a write-back:
// when the home refuses it (Stale: the owner's lease had run out) or it
// cannot be delivered, the data is lost and the next Sync says so.
func (s *Sharer) deliver(msgs []Message) {
	for _, m := range msgs {
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Lease)
		rep, err := s.call(ctx, m)
		cancel()
		if !m.HasData {
			continue
		}
		if err == nil && rep.Kind == Stale {
			err = fmt.Errorf("coherence: page %d: the home refused the data handed over on invalidation because the ownership lease had run out; writes since the last Sync are lost: %w", m.Page, ErrLeaseExpired)
		} else if err != nil && !errors.Is(err, ErrSegmentLost) {
			err = fmt.Errorf("coherence: page %d: the data handed over on invalidation did not reach the home (%w); writes since the last Sync are lost: %w", m.Page, err, ErrLeaseExpired)
		}
		if err != nil {
			s.mu.Lock()
			s.lostErr = errors.Join(s.lostErr, err)
			s.mu.Unlock()
		}
		s.handing.done()
	}
}

// inflight counts the InvAcks with data that have not been answered, so
// that Sync can wait for them: until the home has a page's data, the
// writes in it are neither in this cache nor at the home.
type inflight struct {
	mu   sync.Mutex
	n    int
	zero chan struct{} // closed when n drops to 0
}

// add counts the acks in msgs that carry data.
func (f *inflight) add(msgs []Message) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range msgs {
		if m.HasData {
			if f.n == 0 {
				f.zero = make(chan struct{})
			}
			f.n++
		}
	}
}

// done counts one answered.
func (f *inflight) done() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n--; f.n == 0 {
		close(f.zero)
	}
}

// wait waits until none is in flight or ctx ends.
func (f *inflight) wait(ctx context.Context) error {
	f.mu.Lock()
	if f.n == 0 {
		f.mu.Unlock()
		return nil
	}
	zero := f.zero
	f.mu.Unlock()
	select {
	case <-zero:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("coherence: sync: data handed over on invalidation is still on its way to the home: %w (%w)", ctx.Err(), errs.ErrHomeUnreachable)
	}
}

// wakeAll wakes the callers waiting for a grant. Callers hold mu.
func (s *Sharer) wakeAll() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// pollLoop receives the home's pushes: invalidations (answered at once)
// and grants that had to wait.
func (s *Sharer) pollLoop() {
	defer s.wg.Done()
	backoff := time.Millisecond
	var acks []Message // the InvAcks the next poll carries
	for s.ctx.Err() == nil {
		msgs, err := s.link.Poll(s.ctx, s.ID(), s.cfg.Lease/4, acks)
		if err != nil {
			// The acks go again with the next poll; the home resends its
			// invalidations anyway, and a duplicate ack is recognised.
			if errors.Is(err, ErrSegmentLost) {
				s.lose(err)
				return
			}
			if s.sleep(s.ctx, backoff) != nil {
				return
			}
			backoff = min(2*backoff, 100*time.Millisecond)
			continue
		}
		backoff = time.Millisecond
		acks = acks[:0]
		var handOver []Message // acks with data: write-backs, sent as calls
		granted := false
		s.mu.Lock()
		now := s.clock.Now()
		for _, m := range msgs {
			if m.Kind == Invalidate {
				s.invs.Add(1)
			}
			granted = granted || m.Kind == Grant
			out, _ := s.cache.Push(now, m)
			for _, a := range out {
				if a.HasData {
					handOver = append(handOver, a)
				} else {
					acks = append(acks, a)
				}
			}
			if int(m.Page) < len(s.fast) {
				s.settle(now, m.Page)
			}
		}
		if s.cache.Err() != nil {
			s.settleAll(now)
		}
		if granted {
			s.wakeAll()
		}
		s.handing.add(handOver)
		s.mu.Unlock()
		// An owner's data goes out as a call of its own, answered at once,
		// so that Sync knows when the home has it; acks without data ride
		// the next poll.
		s.deliver(handOver)
	}
}

// keepLoop ticks the keeper every sixteenth of a lease until Close.
func (s *Sharer) keepLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Lease / 16)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.keep()
	}
}

// keep is one tick of the keeper: it clears the fast flags of pages whose
// leases are about to run out, and renews the leases of owned pages
// (writing their data back) a half lease before they run out. The renewals
// run in a goroutine of their own, one per page at a time, each retried
// for up to a lease (a late renewal still keeps a page nobody else asked
// for): a home that does not answer (a partition) must not hold up the
// tick, since the fast path honours leases only as long as the ticks go on.
func (s *Sharer) keep() {
	s.mu.Lock()
	now := s.clock.Now()
	s.settleAll(now)
	pages, _ := s.cache.Owned()
	var due []uint32
	for _, pg := range pages {
		if e := s.cache.Expiry(pg); now.Before(e) && e.Sub(now) < s.cfg.Lease/2 && !s.renewing[pg] {
			s.renewing[pg] = true
			due = append(due, pg)
		}
	}
	s.mu.Unlock()
	if len(due) == 0 {
		return
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Lease)
		err := s.writeBack(ctx, due, KeepModified, false)
		// A renewal the home did not answer in time (or cut short by
		// Close) loses nothing by itself: the page's next operation or
		// Sync finds its lease run out and reports the writes lost then.
		record := err != nil && (ctx.Err() == nil || errors.Is(err, ErrLeaseExpired))
		cancel()
		s.mu.Lock()
		for _, pg := range due {
			delete(s.renewing, pg)
		}
		if record {
			s.lostErr = errors.Join(s.lostErr, err)
		}
		s.mu.Unlock()
	}()
}

// writeBack sends a WriteBack of each owned page in pages (only the dirty
// ones when dirtyOnly) and applies the replies.
func (s *Sharer) writeBack(ctx context.Context, pages []uint32, mode Mode, dirtyOnly bool) error {
	var errs []error
	for _, pg := range pages {
		s.mu.Lock()
		owned, dirty := s.cache.Owned()
		want := false
		for i, o := range owned {
			if o == pg && (dirty[i] || !dirtyOnly) {
				want = true
			}
		}
		var m Message
		if want {
			m, want = s.cache.WriteBack(pg, mode)
			s.settle(s.clock.Now(), pg)
		}
		s.mu.Unlock()
		if !want {
			continue
		}
		s.wbs.Add(1)
		sentAt := s.clock.Now()
		rep, err := s.call(ctx, m)
		if err == nil {
			s.mu.Lock()
			err = s.cache.Reply(s.clock.Now(), sentAt, m, rep)
			s.settleAll(s.clock.Now())
			s.mu.Unlock()
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Sync writes every page this sharer modified back to the home and waits
// until the data of pages handed over on invalidation has reached it. When
// it returns nil, the writes that returned before it was called survive the
// sharer's death. It also reports every loss of writes found since the last
// Sync (ErrLeaseExpired), in the background or by an operation (which
// reported it too), and a lost segment (ErrSegmentLost).
func (s *Sharer) Sync(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("coherence: shared segment: %w", ErrClosed)
	}
	s.mu.Lock()
	pages, _ := s.cache.Owned()
	s.mu.Unlock()
	werr := s.writeBack(ctx, pages, KeepModified, true)
	herr := s.handing.wait(ctx)
	s.mu.Lock()
	lost := s.lostErr
	s.lostErr = nil
	cerr := s.cache.Err()
	s.mu.Unlock()
	return errors.Join(cerr, lost, werr, herr)
}

// Close writes owned pages back, releases shared copies and stops the
// background goroutines. Idempotent; ctx bounds the write-backs. On a
// lost segment (its home restarted or dropped it) it only stops and
// returns the ErrSegmentLost: writes not yet written back are gone.
func (s *Sharer) Close(ctx context.Context) error {
	if s.closed.Swap(true) {
		return nil
	}
	s.mu.Lock()
	pages, _ := s.cache.Owned()
	var rels []Message
	for pg := range s.cache.Pages() {
		if m, ok := s.cache.Release(uint32(pg)); ok {
			rels = append(rels, m)
		}
	}
	s.settleAll(s.clock.Now())
	lost, cerr := s.lostErr, s.cache.Err()
	s.mu.Unlock()
	if cerr != nil { // the home is gone: nothing to hand back
		s.cancel()
		s.wg.Wait()
		return errors.Join(lost, cerr)
	}
	err := s.writeBack(ctx, pages, KeepNothing, false)
	for _, m := range rels {
		s.link.Call(ctx, m) // best effort: the lease ends anyway
	}
	s.cancel()
	s.wg.Wait()
	return errors.Join(lost, err)
}

// Abandon stops the sharer without writing anything back, as if its
// process died: its owned pages' unwritten data is lost and the home
// reclaims its pages when their leases end. For tests and crash drills.
func (s *Sharer) Abandon() {
	s.closed.Store(true)
	s.cancel()
	s.wg.Wait()
}

// The fast path. A page's fast word says the sharer may read it (fastRead)
// or also write it (fastWrite) until a deadline, a quarter lease before
// the page's lease runs out: it is set when the page is granted and
// cleared, under mu, when the page changes state, and by the keeper, which
// ticks every sixteenth of a lease. A cached access costs a read lock, one
// reading of the monotonic clock against the deadline (time.Since, some
// 20 ns) and the copy. The clock is read on every access because the keeper
// alone cannot honour a lease: a process that stood still (descheduled for
// seconds on a loaded host, a paused VM, SIGSTOP) resumes its readers as
// soon as its keeper, and one of them read a copy whose lease had ended
// while the home granted the page to a writer (TestFastPathAfterStall).
// The keeper's tick never waits for the network: renewals run beside it.
const (
	fastNone  uint32 = 0
	fastRead  uint32 = 1
	fastWrite uint32 = 2
)

// fastWord packs a fast level and the deadline (nanoseconds after the
// sharer's base) before which the fast path may use it.
func fastWord(until int64, level uint32) int64 { return until<<2 | int64(level) }

// fastLevel is the level of fast word w.
func fastLevel(w int64) uint32 { return uint32(w & 3) }

// sinceBase is the sharer's clock now, in nanoseconds after base. With the
// system clock that is a monotonic reading alone (time.Since), without
// the wall clock time.Now reads too.
func (s *Sharer) sinceBase() int64 {
	if s.sysClock {
		return int64(time.Since(s.base))
	}
	return int64(s.clock.Now().Sub(s.base))
}

// tryFast runs fn on page pg if its fast word allows the access now.
func (s *Sharer) tryFast(pg uint32, excl bool, fn func([]byte) bool) bool {
	need := fastRead
	if excl {
		need = fastWrite
	}
	if fastLevel(s.fast[pg].Load()) < need || s.closed.Load() {
		return false
	}
	if excl {
		s.mu.Lock()
		defer s.mu.Unlock()
	} else {
		s.mu.RLock()
		defer s.mu.RUnlock()
	}
	if w := s.fast[pg].Load(); fastLevel(w) < need || s.sinceBase() >= w>>2 {
		return false
	}
	if fn(s.cache.lines[pg].data) && excl {
		s.cache.Wrote(pg)
	}
	return true
}

// settle recomputes page pg's fast word at now. Callers hold mu.
func (s *Sharer) settle(now time.Time, pg uint32) {
	f := fastNone
	l := &s.cache.lines[pg]
	until := l.expiry.Add(-s.cfg.Lease / 4)
	if s.cache.err == nil && !l.once && now.Before(until) {
		switch s.cache.State(now, pg) {
		case Modified:
			f = fastWrite
		case Shared:
			f = fastRead
		}
	}
	if f != fastNone {
		s.fast[pg].Store(fastWord(int64(until.Sub(s.base)), f))
		s.hot[pg] = true
	} else {
		s.fast[pg].Store(0)
		delete(s.hot, pg)
	}
}

// settleAll recomputes the fast flags of every page that may have one.
// Callers hold mu.
func (s *Sharer) settleAll(now time.Time) {
	for pg := range s.hot {
		s.settle(now, pg)
	}
}
