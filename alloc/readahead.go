package alloc

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/farmem/farmem/rdma"
)

// readahead is the backend of an rdma segment this client holds alone
// (see Segment.Prefetch): remote's, with pieces of the segment read ahead
// into buffers of the client's, by Prefetch and by a detector that
// follows one sequential or strided stream of ReadAt calls. A ReadAt that
// held pieces cover is served from them; every other call goes to remote.
// The client's own writes and atomics drop the pieces they touch, before
// and after they run, so a read that follows a write never sees bytes
// read ahead before it.
type readahead struct {
	r     *remote
	stats *prefetchCounters
	// ctx ends the background reads when the segment retires.
	ctx    context.Context
	cancel context.CancelFunc

	// held counts the fills, for the writes that find none to drop
	// without taking mu. Changed under mu.
	nfills atomic.Int32

	mu    sync.Mutex
	fills []*fill // held or on their way, oldest first
	held  int64   // bytes of fills
	st    stream
	// hot is the fill the last ReadAt was served from: while a stream
	// reads on inside it, its window was read ahead already and follow has
	// nothing to do but observe.
	hot *fill
	// spare holds buffers of raPiece bytes from dropped fills, for the
	// next ones: a stream would otherwise allocate (and zero) its whole
	// length once more.
	spare [][]byte
}

// The read-ahead's sizes.
const (
	raStart    = 256 << 10 // a stream's first window
	raMax      = 4 << 20   // the largest window
	raHeld     = 16 << 20  // the most bytes held per segment
	raPiece    = 1 << 20   // the largest piece one background read fetches
	raMinPiece = 64 << 10  // the smallest piece of a sequential stream
	raStrides  = 64        // the most accesses of a strided stream read ahead
	raSpare    = 4         // the most spare buffers kept
)

// fill is one piece of the segment read ahead: len(buf) bytes at off.
// Its fields are guarded by readahead.mu; buf's bytes are written by the
// background read and read by ReadAt only after fl.done, and a fill
// dropped after its read finished gives buf back to the spares.
type fill struct {
	off    int64
	buf    []byte
	fl     *flight
	served int64 // bytes ReadAt returned from it
	gone   bool  // dropped: a reader that waited for it goes to the home
	used   bool  // a ReadAt was served from it
}

func (f *fill) end() int64 { return f.off + int64(len(f.buf)) }

// flight is one background read of one or more fills.
type flight struct {
	done chan struct{}
	err  error // set before done is closed
}

func (fl *flight) finished() bool {
	select {
	case <-fl.done:
		return true
	default:
		return false
	}
}

// stream is the detector's state: the last access and the pattern that
// the accesses before it followed.
type stream struct {
	last, end int64 // the last access: [last, end)
	delta     int64 // the last access's offset minus the one's before
	seq       bool  // the pattern: sequential, else a stride of delta
	run       int   // accesses in a row that followed the pattern
	window    int64 // bytes to hold ahead of the stream; 0: no stream
	next      int64 // where the stream's next piece starts
}

var _ backend = (*readahead)(nil)

func newReadahead(r *remote, stats *prefetchCounters) *readahead {
	ctx, cancel := context.WithCancel(context.Background())
	return &readahead{r: r, stats: stats, ctx: ctx, cancel: cancel}
}

// observe feeds the access [off, off+n) to the detector and reports
// whether it continues a stream that should be read ahead. A sequential
// pattern is two accesses in a row that each start where the last ended;
// a stride, two in a row at the same nonzero distance from the last (so a
// stream reads ahead from its third, respectively fourth, access). An
// access that follows neither ends the stream.
func (st *stream) observe(off, n int64) bool {
	delta := off - st.last
	switch {
	case off == st.end:
		if !st.seq {
			st.seq, st.run, st.window = true, 0, 0
		}
		st.run++
	case delta != 0 && delta == st.delta:
		if st.seq {
			st.seq, st.run, st.window = false, 0, 0
		}
		st.run++
	default:
		st.run, st.window = 0, 0
	}
	st.last, st.end, st.delta = off, off+n, delta
	return st.run >= 2
}

// follow runs the detector on the access [off, off+n) and, while it
// continues a stream, drops the pieces the stream has passed and starts
// reading the window ahead of it. A stream of accesses larger than a piece
// is not read ahead: each of them already moves as much as a piece would.
// Called with mu held.
func (ra *readahead) follow(off, n int64) {
	st := &ra.st
	if !st.observe(off, n) || n > raPiece {
		return
	}
	if h := ra.hot; h != nil && !h.gone && st.window > 0 && h.off <= off && off+n <= h.end() {
		return
	}
	if st.window == 0 {
		st.window = raStart
		st.next = st.end
		if !st.seq {
			st.next = off + st.delta
		}
		ra.stats.streams.Add(1)
	}
	forward := st.seq || st.delta > 0
	for i := 0; i < len(ra.fills); i++ {
		if f := ra.fills[i]; forward && f.end() <= off || !forward && f.off >= off+n {
			ra.drop(i)
			i--
		}
	}
	if st.seq {
		ra.aheadSeq()
	} else {
		ra.aheadStride(n)
	}
}

// aheadSeq starts reading the sequential stream's window, in pieces of a
// quarter of it (64 KiB to 1 MiB), skipping what is held already.
func (ra *readahead) aheadSeq() {
	st := &ra.st
	st.next = max(st.next, st.end)
	limit := min(st.end+st.window, ra.r.info.Size)
	piece := min(max(st.window/4, raMinPiece), raPiece)
	for st.next < limit {
		if f := ra.find(st.next); f != nil {
			st.next = f.end()
			continue
		}
		m := min(piece, ra.r.info.Size-st.next)
		ra.start([]int64{st.next}, m)
		st.next += m
	}
}

// aheadStride starts reading the strided stream's next accesses, as many
// as fit its window (at most raStrides), each of n bytes, in one batch
// once half of those read ahead are used.
func (ra *readahead) aheadStride(n int64) {
	st := &ra.st
	if k := (st.next - st.last) / st.delta; k < 1 || (st.next-st.last)%st.delta != 0 {
		st.next = st.last + st.delta
	}
	ahead := min(max(st.window/n, 1), raStrides)
	if (st.next-st.last)/st.delta > ahead/2+1 {
		return
	}
	var offs []int64
	for ; (st.next-st.last)/st.delta <= ahead; st.next += st.delta {
		if st.next < 0 || st.next+n > ra.r.info.Size {
			break
		}
		if f := ra.find(st.next); f == nil || f.end() < st.next+n {
			offs = append(offs, st.next)
		}
	}
	if len(offs) > 0 {
		ra.start(offs, n)
	}
}

// find is the held piece that holds the byte at off, nil if none.
func (ra *readahead) find(off int64) *fill {
	for _, f := range ra.fills {
		if f.off <= off && off < f.end() {
			return f
		}
	}
	return nil
}

// start reads n bytes at each of offs in the background, as one batch,
// and holds them, dropping the oldest pieces beyond raHeld. Called with mu
// held.
func (ra *readahead) start(offs []int64, n int64) {
	if ra.ctx.Err() != nil {
		return
	}
	fl := &flight{done: make(chan struct{})}
	fs := make([]*fill, len(offs))
	for i, off := range offs {
		fs[i] = &fill{off: off, buf: ra.buffer(n), fl: fl}
	}
	ra.fills = append(ra.fills, fs...)
	ra.nfills.Add(int32(len(fs)))
	ra.held += n * int64(len(offs))
	ra.stats.fetched.Add(n * int64(len(offs)))
	for ra.held > raHeld {
		ra.drop(0)
	}
	go ra.fetch(fl, fs)
}

// fetch is start's background read.
func (ra *readahead) fetch(fl *flight, fs []*fill) {
	l := opLists.Get().(*opList)
	for _, f := range fs {
		l.ops = append(l.ops, rdma.Op{Kind: rdma.OpRead, Offset: f.off, Buf: f.buf})
	}
	fl.err = ra.r.runAll(ra.ctx, l)
	l.put()
	close(fl.done)
}

// buffer is a buffer of n bytes for a fill: a spare when n is raPiece.
// Called with mu held.
func (ra *readahead) buffer(n int64) []byte {
	if k := len(ra.spare); n == raPiece && k > 0 {
		b := ra.spare[k-1]
		ra.spare = ra.spare[:k-1]
		return b
	}
	return make([]byte, n)
}

// recycle keeps the buffer of a fill that is gone and whose read has
// finished as a spare (a fill dropped while its read runs leaves its
// buffer to the garbage collector). Called with mu held.
func (ra *readahead) recycle(f *fill) {
	if len(f.buf) == raPiece && len(ra.spare) < raSpare && ra.ctx.Err() == nil {
		ra.spare = append(ra.spare, f.buf)
	}
	f.buf = nil
}

// drop forgets fills[i], counting its bytes no ReadAt returned as
// wasted. Called with mu held.
func (ra *readahead) drop(i int) {
	f := ra.fills[i]
	f.gone = true
	ra.held -= int64(len(f.buf))
	ra.stats.wasted.Add(int64(len(f.buf)) - min(f.served, int64(len(f.buf))))
	ra.fills = append(ra.fills[:i], ra.fills[i+1:]...)
	ra.nfills.Add(-1)
	if f.fl.finished() {
		ra.recycle(f)
	}
}

// invalidate drops the pieces that overlap [off, off+n), which this
// client is about to write or has written, and has the stream read its
// window again from where it is. With no pieces held it takes no lock: a
// piece started after the check reads the home after it, and the check
// after the write catches one started before.
func (ra *readahead) invalidate(off, n int64) {
	if ra.nfills.Load() == 0 {
		return
	}
	ra.mu.Lock()
	defer ra.mu.Unlock()
	dropped := false
	for i := 0; i < len(ra.fills); i++ {
		if f := ra.fills[i]; f.off < off+n && off < f.end() {
			ra.drop(i)
			i--
			dropped = true
		}
	}
	if dropped {
		ra.st.next = ra.st.last // aheadSeq and aheadStride restart at the stream
	}
}

// cover appends to into the held pieces that together hold [off, off+n),
// in order; nil if they do not (or it would take more than cap(into)).
func (ra *readahead) cover(off, n int64, into []*fill) []*fill {
	for pos := off; pos < off+n; {
		f := ra.find(pos)
		if f == nil || len(into) == cap(into) {
			return nil
		}
		into = append(into, f)
		pos = f.end()
	}
	return into
}

// readAt serves p from held pieces when they cover it (waiting for those
// still on their way), else reads it from the home. While nothing is held,
// a call that finds another holding mu reads from the home unobserved:
// goroutines reading one segment at once are no single stream, and none
// of them should wait for another's bookkeeping.
func (ra *readahead) readAt(p []byte, off int64) (int, error) {
	if l := ra.r.lost.Load(); l.ctx.Err() != nil {
		// Lost, reclaimed or closed: what is held is not served.
		return 0, context.Cause(l.ctx) // each names the segment
	}
	n := int64(len(p))
	if !ra.mu.TryLock() {
		if ra.nfills.Load() == 0 {
			ra.stats.misses.Add(1)
			return ra.r.readAt(p, off)
		}
		ra.mu.Lock()
	}
	var buf [8]*fill
	pieces := ra.cover(off, n, buf[:0])
	ra.follow(off, n)
	for _, f := range pieces {
		if !f.fl.finished() {
			ra.mu.Unlock()
			<-f.fl.done
			ra.mu.Lock()
		}
	}
	if ra.serve(pieces, p, off) {
		ra.mu.Unlock()
		ra.stats.hits.Add(1)
		ra.stats.hitBytes.Add(n)
		return len(p), nil
	}
	ra.mu.Unlock()
	ra.stats.misses.Add(1)
	return ra.r.readAt(p, off)
}

// serve copies [off, off+len(p)) from pieces, finished and still held,
// into p; false (and nothing copied) when one of them was dropped or its
// read failed (such a piece is dropped, to be read again). A stream that
// reaches a piece for the first time doubles its window. Called with mu
// held.
func (ra *readahead) serve(pieces []*fill, p []byte, off int64) bool {
	if len(pieces) == 0 {
		return false
	}
	ok := true
	for _, f := range pieces {
		if !f.gone && f.fl.err != nil {
			ra.drop(slices.Index(ra.fills, f))
		}
		ok = ok && !f.gone
	}
	if !ok {
		return false
	}
	done := 0
	for _, f := range pieces {
		k := copy(p[done:], f.buf[off+int64(done)-f.off:])
		done += k
		f.served += int64(k)
		ra.hot = f
		if !f.used {
			f.used = true
			if ra.st.window > 0 {
				ra.st.window = min(ra.st.window*2, raMax)
			}
		}
	}
	return true
}

// prefetch reads [off, off+n) ahead, up to raHeld bytes of it, in pieces
// of at most raPiece, skipping what is held already.
func (ra *readahead) prefetch(off, n int64) {
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for end := off + min(n, raHeld); off < end; {
		if f := ra.find(off); f != nil {
			off = f.end()
			continue
		}
		m := min(raPiece, end-off)
		ra.start([]int64{off}, m)
		off += m
	}
}

// The client's own writes and atomics drop the pieces they touch before
// they run (so no read after them finds bytes read before) and after (a
// piece read ahead while they ran may hold the old bytes).

func (ra *readahead) writeAt(p []byte, off int64) (int, error) {
	ra.invalidate(off, int64(len(p)))
	defer ra.invalidate(off, int64(len(p)))
	return ra.r.writeAt(p, off)
}

func (ra *readahead) writeBatch(ctx context.Context, spans []Span) error {
	ra.invalidateSpans(spans)
	defer ra.invalidateSpans(spans)
	return ra.r.writeBatch(ctx, spans)
}

func (ra *readahead) invalidateSpans(spans []Span) {
	for _, sp := range spans {
		ra.invalidate(sp.Off, int64(len(sp.Buf)))
	}
}

// word drops the pieces holding the 8-byte word at off, for an atomic.
func (ra *readahead) word(off int64) func() {
	ra.invalidate(off, 8)
	return func() { ra.invalidate(off, 8) }
}

func (ra *readahead) store64(off int64, v uint64) error {
	defer ra.word(off)()
	return ra.r.store64(off, v)
}

func (ra *readahead) compareAndSwap64(off int64, old, new uint64) (bool, error) {
	defer ra.word(off)()
	return ra.r.compareAndSwap64(off, old, new)
}

func (ra *readahead) add64(off int64, delta uint64) (uint64, error) {
	defer ra.word(off)()
	return ra.r.add64(off, delta)
}

// load64 and readBatch go to the home: an atomic load must see the home's
// word, and a batch is the caller's own schedule of reads.
func (ra *readahead) load64(off int64) (uint64, error) { return ra.r.load64(off) }

func (ra *readahead) readBatch(ctx context.Context, spans []Span) error {
	return ra.r.readBatch(ctx, spans)
}

func (ra *readahead) bytes() []byte { return nil }

// retire ends the background reads, drops what is held, and retires the
// remote.
func (ra *readahead) retire(ctx context.Context) error {
	ra.cancel()
	ra.mu.Lock()
	for len(ra.fills) > 0 {
		ra.drop(0)
	}
	ra.mu.Unlock()
	return ra.r.retire(ctx)
}
