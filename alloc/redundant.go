package alloc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/reedsolomon"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// redundant is the backend of an rdma segment with several homes: full
// copies (Replicas) or shards (ErasureCoded), as the daemon describes them
// in the segment's homes.
//
// Copies: writes and atomics go to the primary, whose data plane applies
// them and forwards their effect to the other copies before it answers;
// reads go to the primary, and to the next copy when a home fails (its
// connection breaks, it does not answer within WithFailoverTimeout, or it
// refuses the segment). A write whose primary fails is retried at the
// primary the daemon names next with the same exactly-once ticket: every
// home sees this client's one failover session (Client.failover), and the
// new primary holds the old one's answers to it, so the retry is answered,
// not applied again. A home that refuses an op (not yet writable there,
// fenced) applied nothing and caches no answer, so the op keeps its ticket
// for its next attempt.
//
// Shards: logical offset o is in chunk c = o/C (C = shard_chunk), data
// shard c%k, at c/k*C + o%C of that shard's segment. A ReadAt or WriteAt
// is cut at chunk boundaries, and the pieces of each shard go to its home
// in one batch, the shards' batches in parallel. A data home applies a
// write and updates the parity shards itself. A piece whose home fails is
// read from k other shards at the same shard offsets and decoded
// (Reed–Solomon: the byte columns are independent, so any sub-range
// decodes alone), checked against one more shard when one is up, so that
// a write half applied across the stripe is read again, not decoded
// (decode).
type redundant struct {
	c     *Client
	info  *poolv1.Segment // as opened: id, size, redundancy, chunk
	coded bool
	k, m  int
	chunk int64
	enc   reedsolomon.Encoder // coded only; safe for concurrent use

	// view is the homes as the daemon last described them; refresh
	// replaces it when they change.
	view atomic.Pointer[homeView]
	// refreshMu makes refreshes one at a time: the failing operations of a
	// home all wait for one Stat.
	refreshMu sync.Mutex
	// lost and deadline are remote's (see there).
	lost     atomic.Pointer[lostCtx]
	deadline atomic.Pointer[deadlineCtx]
	// failover is the per-attempt bound's shared context (see attemptCtx).
	failover atomic.Pointer[deadlineCtx]
}

// homeView is the segment's homes at one time. Immutable.
type homeView struct {
	info    *poolv1.Segment
	homes   []*home
	primary int // copies: the home the daemon names as the segment's
}

// home is one copy or shard of the segment. Immutable but for its cached
// connection.
type home struct {
	plane *plane
	ok    bool // HOME_STATE_OK: read and written; otherwise skipped
	route atomic.Pointer[route]
	// down is when (unix ns) a home that just failed is tried first again:
	// until then reads go to the others first. Zero: it did not fail.
	down atomic.Int64
}

// up reports whether h holds its copy or shard and did not fail lately.
func (h *home) up() bool {
	if !h.ok {
		return false
	}
	d := h.down.Load()
	return d == 0 || time.Now().UnixNano() >= d
}

// order is the indexes of v's homes that hold their copy or shard, but
// skip, to try in turn: those up, from the primary on, then those that
// failed lately.
func (v *homeView) order(skip int) []int {
	var up, down []int
	for n := range v.homes {
		i := (v.primary + n) % len(v.homes)
		switch h := v.homes[i]; {
		case i == skip || !h.ok:
		case h.up():
			up = append(up, i)
		default:
			down = append(down, i)
		}
	}
	return append(up, down...)
}

var _ backend = (*redundant)(nil)

// newRedundant is the backend of a segment the daemon placed with several
// homes.
func newRedundant(c *Client, info *poolv1.Segment) (*redundant, error) {
	r := &redundant{c: c, info: info}
	spec := redundancyFromProto(info.Redundancy).spec
	if spec.Coded() {
		r.coded, r.k, r.m, r.chunk = true, spec.Data, spec.Parity, info.ShardChunk
		if r.chunk <= 0 || len(info.Homes) != r.k+r.m || info.Size%(int64(r.k)*r.chunk) != 0 {
			return nil, fmt.Errorf("segment %d: the daemon describes %s with %d homes, chunk %d and size %d, which do not fit together; upgrade the daemon: %w",
				info.Id, spec, len(info.Homes), r.chunk, info.Size, ErrNotSupported)
		}
		enc, err := reedsolomon.New(r.k, r.m)
		if err != nil {
			return nil, fmt.Errorf("segment %d: %s: %w (%w)", info.Id, spec, err, ErrNotSupported)
		}
		r.enc = enc
	}
	v, err := r.newView(info)
	if err != nil {
		return nil, err
	}
	r.view.Store(v)
	r.lost.Store(newLostCtx())
	return r, nil
}

// newView is the homes info describes.
func (r *redundant) newView(info *poolv1.Segment) (*homeView, error) {
	v := &homeView{info: info}
	for i, h := range info.Homes {
		p, err := r.c.homePlane(h.Node, h.HomeId, h.Epoch, h.Key, h.DataCredential,
			&poolv1.Segment{Id: info.Id, DataAddr: h.DataAddr, DataTls: h.DataTls, DataTlsCa: h.DataTlsCa, DataServerName: h.DataServerName})
		if errors.Is(err, errNoHome) {
			return nil, fmt.Errorf("segment %d: the daemon gave no data-plane address or key for its home %d (%s): %w", info.Id, i, h.Node, ErrAccessDenied)
		}
		if err != nil {
			return nil, err
		}
		v.homes = append(v.homes, &home{plane: p, ok: h.State == poolv1.HomeState_HOME_STATE_OK})
		if h.Node == info.Node && h.HomeId == info.HomeId {
			v.primary = i // the single-home fields name the primary
		}
	}
	return v, nil
}

// sameHomes reports whether a and b describe the same homes in the same
// states.
func sameHomes(a, b *homeView) bool {
	return a.primary == b.primary && slices.EqualFunc(a.homes, b.homes, func(x, y *home) bool {
		return x.ok == y.ok && x.plane.addr == y.plane.addr && x.plane.region == y.plane.region && string(x.plane.cred) == string(y.plane.cred)
	})
}

// refresh asks the daemon for the segment's homes now and adopts them when
// they changed; a caller that saw the view seen skips the Stat when
// another refresh replaced it meanwhile. A segment the daemon reports lost
// fails its calls with ErrSegmentLost from then on.
func (r *redundant) refresh(ctx context.Context, seen *homeView) {
	r.refreshMu.Lock()
	defer r.refreshMu.Unlock()
	if seen != nil && r.view.Load() != seen {
		return
	}
	info, err := r.c.stat(ctx, &poolv1.StatRequest{Id: r.info.Id})
	if err != nil {
		return
	}
	if info.State == poolv1.SegmentState_SEGMENT_STATE_LOST || info.RedundancyState == poolv1.RedundancyState_REDUNDANCY_STATE_LOST {
		r.setLost(true)
	}
	old := r.view.Load()
	nv, err := r.newView(info)
	if err != nil || len(nv.homes) != len(old.homes) {
		return
	}
	if sameHomes(old, nv) {
		nv.homes = old.homes // keep the cached connections
	}
	r.view.Store(nv)
}

// setLost is remote's setLost for the whole segment: the daemon reports
// more homes lost than its redundancy covers.
func (r *redundant) setLost(lost bool) {
	markLost(r.c, &r.lost, lost, func() error {
		return fmt.Errorf("segment %d lost more homes than %s survives: %w", r.info.Id, redundancyFromProto(r.info.Redundancy), errs.ErrSegmentLost)
	})
}

// connect returns the connection to h that presents the failover session.
func (r *redundant) connect(ctx context.Context, h *home) (*route, error) {
	gen := r.c.dataGen.Load()
	if rt := h.route.Load(); rt != nil && rt.gen == gen {
		return rt, nil
	}
	cred := h.plane.cred
	if len(cred) == 0 {
		cred = r.c.sess.DataCredential()
	}
	conn, sess, err := r.c.dataConn(ctx, connKey{addr: h.plane.addr, failover: true}, cred, h.plane.tls)
	if err != nil {
		return nil, err
	}
	rt := &route{addr: h.plane.addr, gen: gen, conn: conn, sess: sess}
	h.route.Store(rt)
	return rt, nil
}

// answered reports whether err is the answer to the operation rather than
// a failure of the home it ran at: out of range, unaligned, unsupported,
// indeterminate (the op may have run; never retried), the client closed,
// or a write or atomic the daemon cannot make on a shard whose home is
// lost or does not answer. Anything else (an I/O error, a timeout, a home that refuses the
// segment: moved, fenced, lost there) sends the operation to another home.
func answered(err error) bool {
	for _, a := range []error{ErrOutOfRange, ErrUnaligned, ErrNotSupported, ErrIndeterminate, ErrClosed, errShardLost, errShardAway} {
		if errors.Is(err, a) {
			return true
		}
	}
	return false
}

// attemptCtx is the context of one attempt at one home: it ends
// WithFailoverTimeout after it starts (plus at most a slice of it; shared
// like opScope's) or when ctx ends.
func (r *redundant) attemptCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if ctx == r.deadline.Load().ctxOrNil() {
		return sharedDeadline(&r.failover, r.lost.Load(), r.c.opts.failover), func() {}
	}
	return context.WithTimeout(ctx, r.c.opts.failover)
}

// ctxOrNil is d's context, nil for no d.
func (d *deadlineCtx) ctxOrNil() context.Context {
	if d == nil {
		return nil
	}
	return d.ctx
}

// attempt runs the ops of *pending at h once (ops that wait for a ticket
// go in later rounds on the same connection), leaving in *pending those
// not done. A broken connection is dropped for the next attempt to redial.
func (r *redundant) attempt(ctx context.Context, h *home, pending *[]*rdma.Op) error {
	actx, cancel := r.attemptCtx(ctx)
	defer cancel()
	for _, op := range *pending {
		op.Region = h.plane.region
	}
	rt, err := r.connect(actx, h)
	if err != nil {
		h.down.Store(time.Now().Add(r.c.opts.failover).UnixNano())
		return err
	}
	for {
		ready, err := tickets(actx, r.info.Id, *pending, rt.sess)
		if err != nil {
			return err
		}
		err = post(actx, rt.conn, ready)
		wasMoved := moved(ready)
		*pending = unfinished(*pending)
		switch {
		case err == nil && len(*pending) > 0:
			continue // the ops that waited for a ticket
		case err != nil && !final(err) && !wasMoved && actx.Err() == nil:
			r.c.dropDataConn(connKey{addr: rt.addr, failover: true}, rt.conn)
		case err == nil && wasMoved:
			err = rdma.ErrMoved
		}
		switch {
		case err != nil && !answered(err) && ctx.Err() == nil:
			h.down.Store(time.Now().Add(r.c.opts.failover).UnixNano())
		case err == nil && h.down.Load() != 0:
			h.down.Store(0)
		}
		return err
	}
}

// run runs ops with try, one round of them on a view of the homes, until
// a round does them all or is answered (see answered), the segment is
// reported lost, caller ends, or the operation timeout passes. Between
// rounds it asks the daemon for the homes now and, when they did not
// change, waits (20 ms, doubling to 500 ms). The ops' tickets go back to
// the session at the end, whatever became of them: a write retried in a
// later round, also at another home, posts the same ticket again.
func (r *redundant) run(caller context.Context, ops []*rdma.Op, try func(ctx context.Context, v *homeView, pending *[]*rdma.Op) error) error {
	if err := caller.Err(); err != nil {
		return fmt.Errorf("segment %d: %w", r.info.Id, err)
	}
	ctx, end := opScope(caller, &r.deadline, r.lost.Load(), r.c.opts.opTimeout)
	defer end()
	defer releaseTickets(ops)
	pending := ops
	backoff := 20 * time.Millisecond
	var reach error // the last round's failure while ctx ran
	for {
		v := r.view.Load()
		err := try(ctx, v, &pending)
		if err == nil || answered(err) {
			return err
		}
		if ctx.Err() == nil {
			reach = err
			// New homes are tried at once, the same ones after the wait:
			// each Stat gives a new view, and a refusal the daemon repeats
			// (ErrLimit while a home move finishes) would be asked again
			// without a pause.
			r.refresh(ctx, v)
			if cur := r.view.Load(); cur != v && !sameHomes(cur, v) {
				continue
			}
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, 500*time.Millisecond)
		}
		if ctx.Err() != nil {
			return r.timedOut(caller, ctx, pending, err, reach)
		}
	}
}

// timedOut is the error of ops that ctx ended before they were done, err
// the last failure, reach the last round's failure while ctx ran (nil:
// none), which an error for the caller's context keeps beside its end.
// One that ran out the operation timeout matches errs.ErrTooFewHomes
// (once: a failure to decode matches it already).
func (r *redundant) timedOut(caller, ctx context.Context, pending []*rdma.Op, err, reach error) error {
	if cause := context.Cause(ctx); errors.Is(cause, ErrSegmentLost) || errors.Is(cause, ErrLeaseExpired) || errors.Is(cause, ErrClosed) {
		return fmt.Errorf("segment %d: %w", r.info.Id, cause)
	}
	why := fmt.Sprintf("its homes did not complete it within %s", r.c.opts.opTimeout)
	if caller.Err() != nil {
		why, err = "the caller's context ended", caller.Err()
		if reach != nil {
			err = fmt.Errorf("%w; the last try failed: %w", err, reach)
		}
	}
	for _, op := range pending {
		if op.Once != nil && op.Once.Posted() {
			return fmt.Errorf("segment %d: %s at %d sent, but %s after: %w (%w)", r.info.Id, op.Kind, op.Offset, why, ErrIndeterminate, err)
		}
	}
	if caller.Err() != nil || errors.Is(err, errs.ErrTooFewHomes) {
		return fmt.Errorf("segment %d: %s: %w", r.info.Id, why, err)
	}
	return fmt.Errorf("segment %d: %s: %w (%w)", r.info.Id, why, err, errs.ErrTooFewHomes)
}

// atPrimary is a round of writes or atomics on copies: at the primary.
func (r *redundant) atPrimary(ctx context.Context, v *homeView, pending *[]*rdma.Op) error {
	return r.attempt(ctx, v.homes[v.primary], pending)
}

// atAny is a round of reads on copies: at the primary, then at each other
// home that holds its copy (see order), until one does them all.
func (r *redundant) atAny(ctx context.Context, v *homeView, pending *[]*rdma.Op) error {
	if h := v.homes[v.primary]; h.up() { // the common case, without order's slice
		if err := r.attempt(ctx, h, pending); err == nil || answered(err) || ctx.Err() != nil {
			return err
		}
	}
	err := fmt.Errorf("segment %d: every home of the segment is lost: %w", r.info.Id, errs.ErrTooFewHomes)
	for _, i := range v.order(-1) {
		if err = r.attempt(ctx, v.homes[i], pending); err == nil || answered(err) || ctx.Err() != nil {
			return err
		}
	}
	return err
}

// do runs ops on copies: reads at any home, the rest at the primary.
func (r *redundant) do(ctx context.Context, ops []*rdma.Op) error {
	try := r.atPrimary
	if !slices.ContainsFunc(ops, func(op *rdma.Op) bool { return op.Kind != rdma.OpRead }) {
		try = r.atAny
	}
	return r.run(ctx, ops, try)
}

// ptrs is a pointer to each of ops.
func ptrs(ops []rdma.Op) []*rdma.Op {
	out := make([]*rdma.Op, len(ops))
	for i := range ops {
		out[i] = &ops[i]
	}
	return out
}

// spanOps are the reads or the writes (one per frame) of spans.
func spanOps(spans []Span, write bool) []rdma.Op {
	var ops []rdma.Op
	for _, sp := range spans {
		switch {
		case len(sp.Buf) == 0:
		case write:
			ops = slices.AppendSeq(ops, writeFrames(sp.Off, sp.Buf))
		default:
			ops = append(ops, rdma.Op{Kind: rdma.OpRead, Offset: sp.Off, Buf: sp.Buf})
		}
	}
	return ops
}

// access reads or writes spans: on copies as one batch, on shards per shard.
func (r *redundant) access(ctx context.Context, spans []Span, write bool) error {
	if r.coded {
		return r.codedAccess(ctx, spans, write)
	}
	ops := spanOps(spans, write)
	if len(ops) == 0 {
		return nil
	}
	return r.do(ctx, ptrs(ops))
}

func (r *redundant) readAt(p []byte, off int64) (int, error) {
	if err := r.access(context.Background(), []Span{{Off: off, Buf: p}}, false); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (r *redundant) writeAt(p []byte, off int64) (int, error) {
	if err := r.access(context.Background(), []Span{{Off: off, Buf: p}}, true); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (r *redundant) readBatch(ctx context.Context, spans []Span) error {
	return r.access(ctx, spans, false)
}

func (r *redundant) writeBatch(ctx context.Context, spans []Span) error {
	return r.access(ctx, spans, true)
}

// atomic runs one atomic: at the primary of copies, at the word's data
// home of shards.
func (r *redundant) atomic(op rdma.Op) (rdma.Op, error) {
	s := singles.Get().(*single)
	s.op = op
	s.list[0] = &s.op
	try := r.atPrimary
	if r.coded {
		var shard int
		shard, s.op.Offset = r.locate(op.Offset)
		try = r.atShard(shard)
	}
	err := r.run(context.Background(), s.list[:], try)
	done := s.op
	s.op = rdma.Op{}
	singles.Put(s)
	done.Offset = op.Offset
	return done, err
}

func (r *redundant) load64(off int64) (uint64, error) {
	op, err := r.atomic(rdma.Op{Kind: rdma.OpFetchAdd, Offset: off})
	return op.Prev, err
}

// store64 swaps v in against the value it last saw until the swap holds,
// as remote's does.
func (r *redundant) store64(off int64, v uint64) error {
	cur, err := r.load64(off)
	for err == nil {
		var op rdma.Op
		op, err = r.atomic(rdma.Op{Kind: rdma.OpCompareAndSwap, Offset: off, Old: cur, New: v})
		if op.Swapped {
			return err
		}
		cur = op.Prev
	}
	return err
}

func (r *redundant) compareAndSwap64(off int64, old, new uint64) (bool, error) {
	op, err := r.atomic(rdma.Op{Kind: rdma.OpCompareAndSwap, Offset: off, Old: old, New: new})
	return op.Swapped, err
}

func (r *redundant) add64(off int64, delta uint64) (uint64, error) {
	op, err := r.atomic(rdma.Op{Kind: rdma.OpFetchAdd, Offset: off, Delta: delta})
	return op.Prev + delta, err
}

// prefetch does nothing: read-ahead is for segments of one home.
func (r *redundant) prefetch(off, n int64) {}

func (r *redundant) bytes() []byte { return nil }

// retire fails the calls still retrying with ErrClosed.
func (r *redundant) retire(context.Context) error {
	r.c.mu.Lock()
	l := r.lost.Load()
	r.c.mu.Unlock()
	l.cancel(fmt.Errorf("segment %d: %w", r.info.Id, ErrClosed))
	return nil
}
