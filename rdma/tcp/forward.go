package tcp

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/reedsolomon"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// Forwarding: a segment's copies (replicas) or parity shards (erasure
// coding) are kept up to date by the data plane of the home that applies
// its writes. Every mutating op on a forwarding segment is applied and
// handed to the targets' connections under the segment's forwarding lock,
// so every target gets the ops in the order they were applied; the client
// is answered once every live target acknowledged, by a goroutine that
// waits for the acknowledgements outside the lock. An op alone on its
// client's connection (nothing else read or awaiting its answer there)
// is awaited by the connection's own goroutine, which then answers it
// like any other op: no goroutine hand-off, which on a small host costs
// a thread wake-up per op. Otherwise a forwarding worker waits, so the
// connection's later requests go on meanwhile (their answers may
// overtake).

// ForwardMode says what a forwarding segment sends its targets. A plain
// value.
type ForwardMode uint8

const (
	// ForwardCopy sends every target the bytes an op left in the
	// segment: a WRITE the same bytes, a CAS or FADD the word's new value,
	// an XOR the range's new bytes. The targets are full copies.
	ForwardCopy ForwardMode = iota
	// ForwardParity sends parity target j the j-th Reed-Solomon parity of
	// the change (old XOR new bytes) of data shard Shard, as an XOR at the
	// same offset: the targets are the stripe's parity shards.
	ForwardParity
)

// String names the mode: "copy" or "parity".
func (m ForwardMode) String() string {
	switch m {
	case ForwardCopy:
		return "copy"
	case ForwardParity:
		return "parity"
	}
	return fmt.Sprintf("ForwardMode(%d)", uint8(m))
}

// ForwardTarget is one copy or parity shard a segment forwards to. A plain
// value; the Conn is the caller's and safe for concurrent use.
type ForwardTarget struct {
	// Conn reaches the target's data plane; it must be a *Client (the
	// target's CPU has to see forwarded ops: XOR, and the reply cache of
	// exactly-once across failover). Ops to it are exactly-once tickets of
	// the Client's session. Nil: a lost target, skipped (its index still
	// counts for parity).
	Conn rdma.Conn
	// Region addresses the target's segment.
	Region rdma.Region
}

// Forwarding says how a segment forwards its mutating ops (Server.Forward).
// A plain value: Forward reads it once and keeps what it needs, so the
// caller may reuse it; the Conns stay the caller's, who closes them once
// no forwarding uses them (see Forward). OnFail may be called concurrently
// for different targets.
type Forwarding struct {
	// Mode is ForwardCopy or ForwardParity.
	Mode ForwardMode
	// Shard is this segment's data shard index, DataShards and
	// ParityShards the code's k and m (reedsolomon.New(k, m)); ForwardParity
	// only.
	Shard, DataShards, ParityShards int
	// Targets are the copies (ForwardCopy) or the parity shards 0..m-1
	// (ForwardParity, exactly ParityShards of them).
	Targets []ForwardTarget
	// OnFail is called (from a goroutine of the server, at most once per
	// target and Forward call) when a target fails a forwarded op after
	// retries; the target is then skipped and the client's op still
	// answered OK if every other target acknowledged. The op is answered
	// only after OnFail returns, so a hook that records the loss before it
	// returns keeps every acknowledged op on every target still counted as
	// live. A hook that returns an error could not record it: that op and
	// every later one, which the target misses, are answered INDETERMINATE
	// (applied here, not acknowledged) until Forward is called again. May
	// be nil.
	OnFail func(target int, err error) error
}

// maxShards bounds k+m: past 256 shards reedsolomon switches to a codec
// without EncodeIdx.
const maxShards = 256

// forwarder is a segment's forwarding, as Server.Forward set it.
// Immutable but for its targets' state.
type forwarder struct {
	seg     uint64
	mode    ForwardMode
	shard   int
	enc     reedsolomon.Encoder // ForwardParity
	targets []*fwdTarget
	onFail  func(int, error) error
	timeout time.Duration
	log     func(msg string, args ...any)
	// inflight counts the ops forwarded and not yet answered; Added
	// under the export's fwdMu while the forwarder is current.
	inflight sync.WaitGroup
}

// Forward sets how segment seg forwards its mutating ops (see Forwarding);
// nil stops forwarding. Ops applied after Forward returns follow the new
// setting; one applying while Forward runs follows the old one or the
// new, so set forwarding before the segment takes writes, or while it is
// sealed (Seal). Forward returns once every op forwarded under the
// previous setting was answered (its targets acknowledged or failed; a
// target that stops answering is failed within the bound that
// ServerConfig.ForwardTimeout states): from then on every op the segment
// applied under it is on its live targets, and their Clients may be
// closed if no other forwarding uses them. Closing a Client while ops
// forwarded over it are in flight fails them: its target is reported to
// OnFail. Safe for concurrent use.
func (s *Server) Forward(seg uint64, f *Forwarding) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: forward segment %d: %w", seg, rdma.ErrNotExported)
	}
	var fw *forwarder
	if f != nil {
		var err error
		if fw, err = s.newForwarder(seg, f); err != nil {
			return err
		}
	}
	e.fwdMu.Lock()
	old, stopped := e.fwd.Swap(fw), e.stopped
	e.stopped = nil
	e.fwdMu.Unlock()
	old.retire()
	stopped.retire()
	return nil
}

// StopForward stops segment seg's forwarding as Forward(seg, nil) does,
// but returns at once: wait, which the caller must call, returns once
// every op forwarded under it was answered (Forward's guarantee). The
// caller may so release what orders its forwarding changes before it
// waits, up to ForwardTimeout on a target that stopped answering; a
// Forward of seg meanwhile waits for the stopped one's ops too. Safe for
// concurrent use.
func (s *Server) StopForward(seg uint64) (wait func(), err error) {
	e := s.lookup(seg)
	if e == nil {
		return nil, fmt.Errorf("rdma/tcp: stop forwarding segment %d: %w", seg, rdma.ErrNotExported)
	}
	e.fwdMu.Lock()
	if old := e.fwd.Swap(nil); old != nil {
		// An earlier stopped one was waited for by the Forward that
		// set old.
		e.stopped = old
	}
	stopped := e.stopped
	e.fwdMu.Unlock()
	return stopped.retire, nil
}

// retire waits until every op forwarded under fw was answered and halts
// its targets' watches; nil does nothing. Called again, it returns at
// once.
func (fw *forwarder) retire() {
	if fw == nil {
		return
	}
	fw.inflight.Wait()
	for _, t := range fw.targets {
		t.halt()
	}
}

// fwdMinRate is the slowest rate, in bytes a second, at which a target
// is expected to take forwarded bytes: a target is declared silent only
// once it has answered nothing for ForwardTimeout plus the forwarded bytes
// awaiting its answers at this rate (the rate the pool's moves assume).
const fwdMinRate = 4 << 20

// fwdChecks is how many times per ForwardTimeout a busy target's watch
// checks whether it answered.
const fwdChecks = 16

// begin counts an op of n payload bytes as waiting on t (for a session
// slot, a connection slot or its answer) and starts t's watch if it was
// idle; end, called once the op finished, stops counting it.
func (t *fwdTarget) begin(n int) {
	t.busy.Add(1)
	t.cl.fwdBytes.Add(int64(n))
	if !t.armed.Load() && t.armed.CompareAndSwap(false, true) {
		t.watchFrom(time.Now())
	}
}

func (t *fwdTarget) end(n int) {
	t.cl.fwdBytes.Add(-int64(n))
	t.busy.Add(-1)
}

// watchFrom (re)starts t's watch, counting silence from now; the caller
// holds t.armed.
func (t *fwdTarget) watchFrom(now time.Time) {
	t.watchMu.Lock()
	t.heard, t.quiet = t.cl.answers(), now
	t.watchMu.Unlock()
	t.timer.Reset(t.f.timeout / fwdChecks)
}

// watch runs every ForwardTimeout/fwdChecks while ops wait on t: it ends
// t.ctx, failing every op waiting on t, once t's peer has answered nothing
// (no response on any connection of its Client) for ForwardTimeout plus
// the forwarded bytes awaiting the peer's answers at fwdMinRate. The
// deadline measures silence, not total time: a peer that keeps answering
// is waited for however long the ops queued before an op take, and one
// that stops is declared failed within that silence plus two checks.
func (t *fwdTarget) watch() {
	if t.busy.Load() == 0 {
		t.armed.Store(false)
		// An op that began after the load above saw armed set and
		// left the watch to us.
		if t.busy.Load() == 0 || !t.armed.CompareAndSwap(false, true) {
			return
		}
		t.watchFrom(time.Now())
		return
	}
	now := time.Now()
	allow := t.f.timeout + time.Duration(t.cl.fwdBytes.Load()*int64(time.Second)/fwdMinRate)
	t.watchMu.Lock()
	if n := t.cl.answers(); n != t.heard {
		t.heard, t.quiet = n, now
	}
	silent := now.Sub(t.quiet)
	t.watchMu.Unlock()
	if silent >= allow {
		t.stop(fmt.Errorf("rdma/tcp: forward target %s answered nothing for %v with ops waiting on it (allowed: ForwardTimeout plus a second per %d MiB awaiting answers): %w", t.cl.addr, silent.Round(time.Millisecond), fwdMinRate>>20, context.DeadlineExceeded))
		return // armed stays set: t is failed for good
	}
	t.timer.Reset(t.f.timeout / fwdChecks)
}

// halt ends t's watch and context once the forwarder is replaced and no op
// waits on t any more.
func (t *fwdTarget) halt() {
	if t.timer != nil {
		t.timer.Stop()
		t.stop(errors.New("rdma/tcp: forwarding replaced"))
	}
}

// newForwarder checks f and builds the forwarder of segment seg.
func (s *Server) newForwarder(seg uint64, f *Forwarding) (*forwarder, error) {
	fw := &forwarder{seg: seg, mode: f.Mode, shard: f.Shard, onFail: f.OnFail, timeout: s.cfg.ForwardTimeout, log: s.log.Warn}
	switch f.Mode {
	case ForwardCopy:
	case ForwardParity:
		if f.DataShards < 1 || f.ParityShards < 1 || f.DataShards+f.ParityShards > maxShards || f.Shard < 0 || f.Shard >= f.DataShards || len(f.Targets) != f.ParityShards {
			return nil, fmt.Errorf("rdma/tcp: forward segment %d: parity of data shard %d in a %d+%d code to %d targets: want 0 <= Shard < DataShards, ParityShards >= 1, at most %d shards in all, and one target per parity shard: %w", seg, f.Shard, f.DataShards, f.ParityShards, len(f.Targets), maxShards, errs.ErrInvalid)
		}
		enc, err := reedsolomon.New(f.DataShards, f.ParityShards)
		if err != nil {
			return nil, fmt.Errorf("rdma/tcp: forward segment %d: a %d+%d Reed-Solomon code: %w: %w", seg, f.DataShards, f.ParityShards, errs.ErrInvalid, err)
		}
		fw.enc = enc
	default:
		return nil, fmt.Errorf("rdma/tcp: forward segment %d: mode %v: use ForwardCopy or ForwardParity: %w", seg, f.Mode, errs.ErrInvalid)
	}
	for i, t := range f.Targets {
		ft := &fwdTarget{f: fw, idx: i, region: t.Region, pending: make(map[*fwdSend]uint64)}
		switch c := t.Conn.(type) {
		case nil:
			ft.dead.Store(true)
		case *Client:
			ft.cl = c
			ft.ctx, ft.stop = context.WithCancelCause(context.Background())
			ft.timer = time.AfterFunc(time.Hour, ft.watch)
			ft.timer.Stop()
		default:
			return nil, &rdma.NotSupportedError{
				Feature: fmt.Sprintf("forwarding segment %d to a %T", seg, t.Conn),
				Reason:  "forward targets must be rdma/tcp Clients (tcp.Dial): the target's CPU must see forwarded ops",
			}
		}
		fw.targets = append(fw.targets, ft)
	}
	return fw, nil
}

// fwdTarget is one target of a forwarder and its ordered link: every op
// for it goes on one connection of its Client (conn), in apply order, and
// after that connection breaks the ops it left unanswered are sent again,
// in order and with RETRY, on the next live connection before any later
// op.
type fwdTarget struct {
	f      *forwarder
	idx    int
	cl     *Client // nil: lost
	region rdma.Region
	dead   atomic.Bool
	// failed runs fail's work once; a Do of its own waits for a verdict
	// under way. unrecorded says OnFail could not record the loss.
	failed     sync.Once
	unrecorded atomic.Bool

	// ctx bounds every wait of an op to t (for a session slot, a
	// connection slot, its answer); watch ends it once t's peer is
	// silent too long. Nil for a target lost from the start.
	ctx   context.Context
	stop  context.CancelCauseFunc
	timer *time.Timer  // runs watch while ops wait on t
	busy  atomic.Int64 // ops between begin and end
	armed atomic.Bool  // the watch runs (or t was declared silent)
	// The peer's answer count at the watch's last check, and since when
	// it has not moved; guarded by watchMu.
	watchMu sync.Mutex
	heard   uint64
	quiet   time.Time

	mu      sync.Mutex // taken under the export's fwdMu when posting
	conn    *cliConn
	pending map[*fwdSend]uint64 // posted and unfinished sends, by post order
	posted  uint64
}

// fwdSend is one forwarded op to one target.
type fwdSend struct {
	t      *fwdTarget
	kind   rdma.OpKind
	off    uint64
	buf    []byte // payload; shared by the sends of one fwdOp, read-only
	origin []byte // origin block, or nil
	ticket *rdma.Ticket
	o      *op // the current attempt; guarded by t.mu
	// sent: an attempt may have reached the target, so the next one is a
	// RETRY; guarded by t.mu. One that never left is sent as new: on a
	// slot whose history the target does not know (one it has run nothing
	// on, of a session it took up on a RESUME hello) a RETRY would be
	// INDETERMINATE.
	sent bool
}

// fwdOp is one client op being forwarded: what the client is answered
// once every send finished.
type fwdOp struct {
	c      *srvConn
	e      *export // pinned as mutating until answered
	f      *forwarder
	id     uint64
	status uint16
	flags  uint8
	value  uint64
	sl     *slot // the client's exactly-once slot, locked until answered; or nil
	seq    uint32
	sends  []*fwdSend
	bufs   []*[]byte // pooled buffers to return
	org    []byte    // the origin block the sends carry, or empty
	// Targets that failed the op, told to OnFail by run (never under the
	// forwarding lock, nor counted in flight: OnFail may call Forward).
	failed []targetErr
	p      *pooledFwdOp // the storage fo came in
}

// fwdInline is how many targets a pooled fwdOp holds the sends of
// without allocating: two parity shards, a few copies.
const fwdInline = 4

// fwdOps holds fwdOps and the storage their slices start in, so that
// forwarding an op to a few targets allocates nothing.
var fwdOps = sync.Pool{New: func() any { return new(pooledFwdOp) }}

// pooledFwdOp is a fwdOp with the backing arrays of its slices.
type pooledFwdOp struct {
	fwdOp
	sendsArr [fwdInline]fwdSend
	sendPtrs [fwdInline]*fwdSend
	bufsArr  [fwdInline + 2]*[]byte
	payloads [fwdInline][]byte
}

// getFwdOp returns a clean fwdOp from fwdOps; free puts it back.
func getFwdOp() *fwdOp {
	p := fwdOps.Get().(*pooledFwdOp)
	p.p = p
	p.sends, p.bufs = p.sendPtrs[:0], p.bufsArr[:0]
	return &p.fwdOp
}

// newSend returns a send of fo's for the caller to set in full: in fo's
// own storage while it lasts (zeroed by free, for the collector), else
// allocated.
func (fo *fwdOp) newSend() *fwdSend {
	if i := len(fo.sends); i < fwdInline {
		return &fo.p.sendsArr[i]
	}
	return new(fwdSend)
}

// free returns fo to fwdOps once it is answered and its sends finished;
// its origin buffer is kept for the next op.
func (fo *fwdOp) free() {
	p := fo.p
	org := fo.org[:0]
	clear(p.sendPtrs[:])
	clear(p.bufsArr[:])
	clear(p.payloads[:])
	clear(p.sendsArr[:])
	p.fwdOp = fwdOp{org: org}
	fwdOps.Put(p)
}

// targetErr is a target that failed and why.
type targetErr struct {
	t   *fwdTarget
	err error
}

// pick returns the connection ops for t go on: the current one, or the
// first live one from the segment's place among the Client's connections
// (segments spread over them). t.mu is held.
func (t *fwdTarget) pick() *cliConn {
	if t.conn != nil && !t.conn.closed.Load() {
		return t.conn
	}
	n := len(t.cl.conns)
	for i := range n {
		if c := t.cl.conns[(int(t.f.seg%uint64(n))+i)%n]; !c.closed.Load() {
			return c
		}
	}
	return nil
}

// post sends s on t's link (a RETRY if an attempt went out before); t.mu
// is held. A broken link is repaired first, so s follows the ops posted
// before it. It returns false when t has no live connection left.
func (t *fwdTarget) post(ctx context.Context, s *fwdSend) bool {
	for {
		if t.conn != nil && t.conn.closed.Load() {
			t.repair(ctx, t.conn)
		}
		c := t.pick()
		if c == nil {
			return false
		}
		t.conn = c
		o := getOp()
		o.kind, o.region, o.off, o.buf = s.kind, t.region, s.off, s.buf
		o.once, o.retry, o.origin, o.conn = s.ticket, s.sent, s.origin, c
		if _, err := c.register(ctx, o, true); err != nil {
			o.release()
			if ctx.Err() != nil {
				return false
			}
			continue // c failed meanwhile: repair it
		}
		c.enqueue(o)
		s.o = o
		if _, ok := t.pending[s]; !ok {
			t.posted++
			t.pending[s] = t.posted
		}
		return true
	}
}

// repair moves t's link off broken, which failed: once every op on it is
// finished (fail returns after its sweep), the sends whose attempt died
// with it are posted again, in their order, with RETRY. t.mu is held.
func (t *fwdTarget) repair(ctx context.Context, broken *cliConn) {
	if t.conn != broken {
		return // repaired already
	}
	broken.fail(fmt.Errorf("rdma/tcp: forwarding link to %s moved off a broken connection: %w", t.cl.addr, rdma.ErrClosed))
	t.conn = nil
	redo := make([]*fwdSend, 0, len(t.pending))
	for s := range t.pending {
		if s.o != nil && s.o.conn == broken && s.o.state.Load() == opDone && errors.Is(s.o.err, rdma.ErrClosed) {
			redo = append(redo, s)
		}
	}
	slices.SortFunc(redo, func(a, b *fwdSend) int { return int(int64(t.pending[a] - t.pending[b])) })
	for _, s := range redo {
		// The failed attempt stays with its waiter, which releases it
		// once it sees s moved on.
		s.sent = s.sent || !s.o.unsent
		s.o = nil
		if !t.post(ctx, s) {
			return
		}
	}
}

// await waits for s's acknowledgement, following it through repairs, and
// reports the error that made the target fail, or nil.
func (s *fwdSend) await(ctx context.Context) error {
	t := s.t
	for {
		t.mu.Lock()
		o := s.o
		t.mu.Unlock()
		if o == nil {
			// Its repost found no live connection.
			return t.finish(s, nil, fmt.Errorf("rdma/tcp: forward to %s: no live connection left: %w", t.cl.addr, rdma.ErrClosed))
		}
		err := o.conn.wait(ctx, o)
		if err == nil {
			err = o.err
		}
		if err == nil || !errors.Is(err, rdma.ErrClosed) || ctx.Err() != nil || t.dead.Load() {
			return t.finish(s, o, err)
		}
		t.mu.Lock()
		if s.o == o {
			t.repair(ctx, o.conn)
		}
		moved := s.o != o
		t.mu.Unlock()
		if !moved {
			return t.finish(s, o, err)
		}
		o.release()
	}
}

// finish retires s with its last attempt o (released here) and err, its
// outcome; it returns err.
func (t *fwdTarget) finish(s *fwdSend, o *op, err error) error {
	t.mu.Lock()
	delete(t.pending, s)
	t.mu.Unlock()
	if o != nil {
		o.release()
	}
	s.ticket.Release()
	t.end(len(s.buf))
	if err != nil && t.ctx.Err() != nil {
		err = fmt.Errorf("%w (%w)", context.Cause(t.ctx), err)
	}
	return err
}

// fail marks t failed for good and tells OnFail, once.
func (t *fwdTarget) fail(err error) {
	t.failed.Do(func() {
		t.dead.Store(true)
		t.f.log("rdma/tcp: forward target failed; skipping it from now on", "segment", t.f.seg, "target", t.idx, "addr", t.cl.addr, "err", err)
		if t.f.onFail == nil {
			return
		}
		if ferr := t.f.onFail(t.idx, err); ferr != nil {
			t.unrecorded.Store(true)
			t.f.log("rdma/tcp: a failed forward target's loss was not recorded; answering this segment's ops INDETERMINATE until forwarding is set again", "segment", t.f.seg, "target", t.idx, "err", ferr)
		}
	})
}

// missed reports whether some target of f is dead with its loss not
// recorded (OnFail failed): an op it skipped cannot be acknowledged. It
// waits for an OnFail under way (sync.Once's Do returns only once the
// first call's function has), then costs an atomic load per dead target. A
// target dead from the start (lost) never fails, so its Once is free.
func (f *forwarder) missed() bool {
	for _, t := range f.targets {
		if t.dead.Load() {
			t.failed.Do(func() {})
			if t.unrecorded.Load() {
				return true
			}
		}
	}
	return false
}

// fwdIdle is how long a forwarding worker waits for the next op before it
// ends.
const fwdIdle = time.Second

// runForward runs fo on an idle forwarding worker, or on a new one when
// none is idle, so no op waits behind another's targets. Reusing workers
// spares each op a goroutine's start and the growth of its stack. The
// caller holds a count of s.wg.
func (s *Server) runForward(fo *fwdOp) {
	select {
	case s.fwdRuns <- fo:
	default:
		s.wg.Add(1)
		go s.forwardWorker(fo)
	}
}

// forwardWorker runs fo, then the ops handed to it while it is idle; it
// ends after fwdIdle without one, or when the server closes.
func (s *Server) forwardWorker(fo *fwdOp) {
	defer s.wg.Done()
	idle := time.NewTimer(fwdIdle)
	defer idle.Stop()
	for {
		fo.run()
		idle.Reset(fwdIdle)
		select {
		case fo = <-s.fwdRuns:
		case <-idle.C:
			return
		case <-s.ctx.Done():
			return
		}
	}
}

// run settles fo (settle) and answers the client, on a forwarding worker
// (runForward).
func (fo *fwdOp) run() {
	fo.settle()
	c, id, status, flags, value := fo.c, fo.id, fo.status, fo.flags, fo.value
	fo.free()
	c.handedOff.Add(-1)
	c.respondLater(id, status, flags, value)
}

// settle waits for every send of fo, fails the targets that failed,
// records the answer in the client's exactly-once slot and drops the
// segment's pin: everything but sending the answer. The forwarder stops
// counting fo in flight before OnFail runs, so that an OnFail that leads
// to a Forward call (directly or through the daemon that owns the
// segment) does not wait for itself.
func (fo *fwdOp) settle() {
	for _, s := range fo.sends {
		if err := s.await(s.t.ctx); err != nil {
			fo.failed = append(fo.failed, targetErr{s.t, fmt.Errorf("rdma/tcp: forward %s of segment %d offset %d to target %d (%s, %s): %w", s.kind, fo.f.seg, s.off, s.t.idx, s.t.cl.addr, s.t.region, err)})
		}
	}
	fo.f.inflight.Done()
	for _, te := range fo.failed {
		te.t.fail(te.err)
	}
	if fo.status == statusOK && fo.f.missed() {
		fo.status, fo.flags, fo.value = statusIndeterminate, 0, 0
	}
	fo.e.settle(fo)
	for _, b := range fo.bufs {
		putBuf(b)
	}
	if fo.sl != nil {
		fo.sl.record(fo.seq, fo.status, fo.flags, fo.value)
		fo.sl.mu.Unlock()
	}
	fo.e.unpin(true)
}

// forward hands the change an op made to [off, off+len(now)) to every live
// target of f, adding the sends to fo: now holds the range's bytes after
// the op, was (ForwardParity only) before it; both are fo's to keep, and
// was is overwritten. The sends carry fo.org as their origin block unless
// it is empty. Waiting for a session slot of a target counts as waiting
// on it (fwdTarget.watch). The export's fwdMu is held.
func (f *forwarder) forward(fo *fwdOp, off uint64, was, now []byte) {
	org := fo.org
	if len(org) == 0 {
		org = nil
	}
	bufs := fo.p.payloads[:0]
	switch f.mode {
	case ForwardCopy:
		for range f.targets {
			bufs = append(bufs, now)
		}
	case ForwardParity:
		xorBytes(was, now) // the delta
		for range f.targets {
			b := getBuf(len(now))
			clear(*b)
			fo.bufs = append(fo.bufs, b)
			bufs = append(bufs, *b)
		}
		// The parity of an empty change (a client may write zero bytes)
		// is empty, and the code refuses to compute it.
		if len(now) > 0 {
			if err := f.enc.EncodeIdx(was, f.shard, bufs); err != nil {
				// k, m and the shard were checked by Forward, and the
				// buffers have one length: this does not happen. Were it
				// to, it would for every op, so the line is sampled; and
				// the parity homes missed the change (a zero delta would
				// leave their parity silently wrong): they fail as targets
				// that missed a write do.
				fo.c.warn("rdma/tcp: parity of a forwarded op", "segment", f.seg, "err", err)
				for i, t := range f.targets {
					if !t.dead.Load() {
						fo.failed = append(fo.failed, targetErr{t, fmt.Errorf("rdma/tcp: forward to target %d (%s): parity of the change: %w", i, t.cl.addr, err)})
					}
				}
				return
			}
		}
	}
	kind := rdma.OpWrite
	if f.mode == ForwardParity {
		kind = rdma.OpXor
	}
	for i, t := range f.targets {
		if t.dead.Load() {
			continue
		}
		t.begin(len(bufs[i]))
		tk, err := t.cl.session.Acquire(t.ctx)
		if err != nil {
			t.end(len(bufs[i]))
			fo.failed = append(fo.failed, targetErr{t, fmt.Errorf("rdma/tcp: forward to target %d (%s): %w (%w)", i, t.cl.addr, context.Cause(t.ctx), err)})
			continue
		}
		s := fo.newSend()
		*s = fwdSend{t: t, kind: kind, off: off, buf: bufs[i], origin: org, ticket: tk}
		t.mu.Lock()
		ok := t.post(t.ctx, s)
		t.mu.Unlock()
		if !ok {
			tk.Release()
			t.end(len(bufs[i]))
			why := fmt.Errorf("no live connection: %w", rdma.ErrClosed)
			if t.ctx.Err() != nil {
				why = context.Cause(t.ctx)
			}
			fo.failed = append(fo.failed, targetErr{t, fmt.Errorf("rdma/tcp: forward to target %d (%s): %w", i, t.cl.addr, why)})
			continue
		}
		fo.sends = append(fo.sends, s)
	}
}

// xorBytes sets dst[i] ^= src[i] for every byte of dst.
func xorBytes(dst, src []byte) { subtle.XORBytes(dst, dst, src) }

// bufPool holds payload staging and forwarding buffers up to poolMax bytes.
var bufPool sync.Pool

const poolMax = 1 << 20

// getBuf returns a pooled buffer of n bytes (contents undefined).
func getBuf(n int) *[]byte {
	if p, _ := bufPool.Get().(*[]byte); p != nil && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	b := make([]byte, n, max(n, 4096))
	return &b
}

// putBuf returns b to the pool.
func putBuf(b *[]byte) {
	if cap(*b) <= poolMax {
		bufPool.Put(b)
	}
}
