package alloc

import (
	"cmp"
	"context"
	"fmt"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/farmem/farmem/rdma"
)

// MaxBatch is the most spans one ReadBatch or WriteBatch takes; a longer
// batch is refused with ErrLimit. Split a longer one into several calls.
const MaxBatch = 1024

// Span is one entry of a batch: the len(Buf) bytes at offset Off of the
// segment, read into Buf by ReadBatch or written from Buf by WriteBatch.
// A plain value; the caller owns Buf, which the call uses only until it
// returns.
type Span struct {
	// Off is the byte offset in the segment.
	Off int64
	// Buf is the destination of a read and the source of a write.
	Buf []byte
}

// ReadBatch fills every span's Buf from the segment at its Off, all in one
// call: on the rdma tier the reads travel to the home together (one train
// of frames on tcp; on verbs their work requests posted back to back and
// the completion queue polled once) and their answers are awaited once;
// on the load/store tiers they are plain copies; a shared attachment
// reads them one after the other through its page cache.
//
// The whole batch is checked before any of it is done: a closed segment
// (ErrClosed), more than MaxBatch spans (ErrLimit), or any span that does
// not lie wholly within the segment (ErrOutOfRange; there is no short read
// at the end as ReadAt has) refuses the batch and reads nothing, the error
// naming the first bad span. An empty batch, and spans with an empty Buf,
// read nothing and succeed. Spans may overlap each other in the segment;
// their Bufs must not overlap each other.
//
// A nil error means every span was read. Otherwise the contents of the
// Bufs are unspecified: a home that stops answering mid-batch fails the
// call with ErrUnavailable after the client's WithOpTimeout (or with
// ErrSegmentLost when the pool reports it lost, or ctx's error when ctx
// ends first), never a hang. Latency emulation on the segment's tier is
// applied once per batch: the injected latency plus the batch's bytes over
// the bandwidth. Safe for concurrent use, as ReadAt.
func (s *Segment) ReadBatch(ctx context.Context, spans []Span) error {
	if err := s.checkBatch("read", spans); err != nil || len(spans) == 0 {
		return err
	}
	return s.batch(ctx, spans, backend.readBatch)
}

// WriteBatch stores every span's Buf in the segment at its Off, all in one
// call, as ReadBatch reads them: the checks, limits and emulation are
// ReadBatch's, and besides, spans of a WriteBatch must not overlap each
// other in the segment (ErrInvalid, naming the two spans): which one's
// bytes would land last is not defined on every tier.
//
// A nil error means every span was written. Otherwise each span was
// written whole or not at all (on the rdma tier each frame of a span is
// applied exactly once, as with WriteAt), but which ones were is not
// reported: write the batch again, or read the spans to find out. The error
// is ErrIndeterminate when the home may have applied a span it could not
// confirm. Safe for concurrent use, as WriteAt.
func (s *Segment) WriteBatch(ctx context.Context, spans []Span) error {
	if err := s.checkBatch("write", spans); err != nil || len(spans) == 0 {
		return err
	}
	if err := s.checkOverlap(spans); err != nil {
		return err
	}
	return s.batch(ctx, spans, backend.writeBatch)
}

// batch runs a checked batch on the pinned backend, and again on the new
// one when the segment changed tier under it (the spans refused were not
// applied; those done before are done again, with the same bytes).
func (s *Segment) batch(ctx context.Context, spans []Span, do func(backend, context.Context, []Span) error) error {
	for {
		be, err := s.use()
		if err != nil {
			return err
		}
		err = do(be, ctx, spans)
		s.done()
		if err == nil || !s.again(err) {
			return err
		}
	}
}

// checkBatch makes the checks of a whole batch before any of it is done.
func (s *Segment) checkBatch(what string, spans []Span) error {
	if s.closedNow() {
		return s.errClosed()
	}
	if len(spans) > MaxBatch {
		return fmt.Errorf("%s batch of %d spans on segment %d: at most MaxBatch (%d) spans per call; split the batch: %w", what, len(spans), s.info.Id, MaxBatch, ErrLimit)
	}
	for i, sp := range spans {
		if sp.Off < 0 || sp.Off > s.size || int64(len(sp.Buf)) > s.size-sp.Off {
			return fmt.Errorf("%s batch span %d: %d bytes at %d of segment %d (size %d); nothing of the batch was done: %w", what, i, len(sp.Buf), sp.Off, s.info.Id, s.size, ErrOutOfRange)
		}
	}
	return nil
}

// checkOverlap refuses a write batch whose spans overlap in the segment.
func (s *Segment) checkOverlap(spans []Span) error {
	var small [64]int // a batch of up to 64 spans sorts without allocating
	order := small[:0]
	for i, sp := range spans {
		if len(sp.Buf) > 0 {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(spans[a].Off, spans[b].Off) })
	for k := 1; k < len(order); k++ {
		a, b := spans[order[k-1]], spans[order[k]]
		if a.Off+int64(len(a.Buf)) > b.Off {
			return fmt.Errorf("write batch spans %d ([%d, %d)) and %d ([%d, %d)) of segment %d overlap; write them in separate calls: %w",
				order[k-1], a.Off, a.Off+int64(len(a.Buf)), order[k], b.Off, b.Off+int64(len(b.Buf)), s.info.Id, ErrInvalid)
		}
	}
	return nil
}

// batchBytes is how many bytes a batch moves.
func batchBytes(spans []Span) int {
	n := 0
	for _, sp := range spans {
		n += len(sp.Buf)
	}
	return n
}

// Load/store tiers: a batch is its copies. The guarded backend guards the
// whole loop once rather than each copy.

func (m *mapped) readBatch(ctx context.Context, spans []Span) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, sp := range spans {
		copy(sp.Buf, m.mem[sp.Off:])
	}
	return nil
}

func (m *mapped) writeBatch(ctx context.Context, spans []Span) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for _, sp := range spans {
		copy(m.mem[sp.Off:], sp.Buf)
	}
	return nil
}

func (g *guarded) readBatch(ctx context.Context, spans []Span) (err error) {
	if err := g.check(); err != nil {
		return err
	}
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	return g.mapped.readBatch(ctx, spans)
}

func (g *guarded) writeBatch(ctx context.Context, spans []Span) (err error) {
	if err := g.check(); err != nil {
		return err
	}
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	return g.mapped.writeBatch(ctx, spans)
}

// readBatch posts every span's read at once through rdma.Conn.Do (one
// train of frames on tcp; on verbs the work requests back to back, one
// completion poll); a span larger than a frame is split by the transport.
func (r *remote) readBatch(ctx context.Context, spans []Span) error {
	l := opLists.Get().(*opList)
	defer l.put()
	for _, sp := range spans {
		if len(sp.Buf) > 0 {
			l.ops = append(l.ops, rdma.Op{Kind: rdma.OpRead, Offset: sp.Off, Buf: sp.Buf})
		}
	}
	return r.runAll(ctx, l)
}

func (r *remote) writeBatch(ctx context.Context, spans []Span) error {
	l := opLists.Get().(*opList)
	defer l.put()
	for _, sp := range spans {
		l.ops = slices.AppendSeq(l.ops, writeFrames(sp.Off, sp.Buf))
	}
	return r.runAll(ctx, l)
}

// opList is the ops of one remote batch and the list of them that run
// takes, reused through opLists: a batch on the data path leaves no
// garbage behind. run keeps no reference to an op once it returns.
type opList struct {
	ops  []rdma.Op
	ptrs []*rdma.Op
}

var opLists = sync.Pool{New: func() any { return new(opList) }}

// maxPooledOps bounds the ops of a list that put keeps: a rare large
// batch's memory goes back to the collector rather than staying pooled.
const maxPooledOps = 256

// put clears l (its ops name the caller's buffers) and returns it to
// opLists.
func (l *opList) put() {
	if cap(l.ops) > maxPooledOps {
		return
	}
	clear(l.ops)
	clear(l.ptrs)
	l.ops, l.ptrs = l.ops[:0], l.ptrs[:0]
	opLists.Put(l)
}

// runAll runs l's ops together.
func (r *remote) runAll(ctx context.Context, l *opList) error {
	if len(l.ops) == 0 {
		return nil
	}
	for i := range l.ops {
		l.ptrs = append(l.ptrs, &l.ops[i])
	}
	return r.run(ctx, l.ptrs)
}

// A shared attachment reads and writes a batch span by span: each goes
// through the page cache that the coherence protocol keeps, which already
// fetches a page once for every span on it.

func (b sharedBackend) readBatch(ctx context.Context, spans []Span) error {
	return eachSpan(ctx, spans, b.ReadAt)
}

func (b sharedBackend) writeBatch(ctx context.Context, spans []Span) error {
	return eachSpan(ctx, spans, b.WriteAt)
}

// eachSpan calls do for each span in order until one fails or ctx ends.
func eachSpan(ctx context.Context, spans []Span, do func([]byte, int64) (int, error)) error {
	for i, sp := range spans {
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := do(sp.Buf, sp.Off); err != nil {
			return fmt.Errorf("batch span %d: %w", i, err)
		}
	}
	return nil
}

// An emulated batch takes the injected latency once, plus its bytes over
// the bandwidth: the cost of one call that moves them all.

func (e *emulated) readBatch(ctx context.Context, spans []Span) error {
	defer e.in.Wait(time.Now(), batchBytes(spans))
	return e.next.readBatch(ctx, spans)
}

func (e *emulated) writeBatch(ctx context.Context, spans []Span) error {
	defer e.in.Wait(time.Now(), batchBytes(spans))
	return e.next.writeBatch(ctx, spans)
}
