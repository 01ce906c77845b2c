//go:build linux && cgo && verbs

package verbs

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/rdma"
)

// Client tuning. A READ or WRITE is split into work requests of at most
// blockSize bytes, each through its own block of the connection's
// registered bounce buffer; at most roundBlocks of them are in flight per
// operation, so a large transfer runs in rounds of roundBlocks*blockSize.
const (
	blockSize   = 64 << 10
	numBlocks   = 128 // 8 MiB of bounce buffer per connection, and the solo block
	roundBlocks = 16  // 1 MiB per round
	pollSpinNs  = 50_000
	pollBatch   = 32 // completions a poll takes at most (fm_poll's limit)
)

// Transport is the verbs transport: Dial connects an RC queue pair to the
// peer's data plane. It is stateless and safe for concurrent use.
type Transport struct{}

var _ rdma.Transport = Transport{}

// Name returns "verbs".
func (Transport) Name() string { return "verbs" }

// Dial connects to the data plane at addr (its TCP address, which carries
// the control protocol) and presents cred. Without an active RDMA device
// here, or when the peer serves only tcp, the error matches
// rdma.ErrNotSupported.
func (Transport) Dial(ctx context.Context, addr string, cred []byte) (rdma.Conn, error) {
	return Dial(ctx, addr, cred)
}

// Available reports the RDMA device this process would use, or an error
// matching rdma.ErrNotSupported that says why there is none.
func Available() (string, error) {
	d, err := openDevice()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s port %d gid %d", d.name, int(d.d.port), int(d.d.gid_index)), nil
}

// segInfo is what RESOLVE returned for a segment.
type segInfo struct {
	addr  uint64
	rkey  uint32
	size  uint64
	epoch uint64
}

// segEntry is a resolved segment; it is not changed once published.
type segEntry struct {
	seg  uint64
	info segInfo
}

// req is one posted round of one operation. Its owner is the caller until
// it completes; a caller that leaves early (ctx) abandons it and the poller
// that sees its completion frees its blocks. A round lives in Conn.reqs at
// the index of its first bounce block, which no other round in flight
// holds, and its work-request id is that index plus a sequence number
// (above slotBits), so a completion finds its round without a map and a
// stale one (a flushed work request of a round already completed) is told
// apart by the sequence.
type req struct {
	id      uint64
	nblocks int
	blocks  [roundBlocks]int
	ws      []wr          // roundBlocks work requests in C memory, fixed per slot
	status  uint32        // set before done
	done    atomic.Bool   // the round's last work request completed
	waitCh  chan struct{} // guarded by Conn.pmu: made by a sleeping caller, closed on completion
	// abandoned is guarded by Conn.pmu: the caller left (ctx); the poller
	// frees the blocks.
	abandoned bool
	live      bool // guarded by Conn.pmu: posted, completion not yet seen
}

// slotBits is the width of the slot (first block) in a work-request id.
const slotBits = 16

// Conn is a client connection to one peer's data plane over an RC queue
// pair. It implements rdma.Conn and is safe for concurrent use.
//
// Completions are polled by whichever caller is waiting (leader/follower):
// a lone operation posts its work requests and polls the completion queue
// itself, so no goroutine hand-off sits on its path; concurrent callers wait
// on their own completion and take over polling when the leader leaves. An
// operation of one work request whose caller finds nobody polling runs
// through the solo slot, polling from its post to its completion, without
// the locking the shared bounce blocks and pending set need.
// There is no goroutine per operation and none per connection.
//
// Buffers: data moves through the connection's registered bounce buffer
// (mmap'd, never the Go heap); Read copies into p and Write copies from p
// only while the call runs.
type Conn struct {
	dev    *device
	qp     *queuePair
	bounce []byte
	mr     *memRegion
	ctl    net.Conn
	ctlMu  sync.Mutex // one RESOLVE at a time on ctl

	// state counts the operations in flight, with closedBit set once
	// Close began; the last operation to leave a closed Conn closes
	// drained.
	state    atomic.Int64
	drained  chan struct{}
	closedCh chan struct{}
	once     sync.Once
	broken   atomic.Bool // the queue pair failed; every op fails with ErrClosed

	smu  sync.Mutex
	segs map[uint64]*segEntry     // guarded by smu
	last atomic.Pointer[segEntry] // the segment used last: stored under smu, loaded without

	bmu    sync.Mutex
	free   []int
	freed  chan struct{} // closed and replaced when blocks are released while someone waits
	bwait  int           // callers waiting on freed
	pollMu sync.Mutex    // held by the polling caller
	wcs    []completion  // guarded by pollMu; pollBatch of them, in cm
	polls  pollYield     // guarded by pollMu
	wake   chan struct{} // a token: the leader left while ops are pending
	reqs   []req         // by first block; see req
	cm     cmem          // C memory behind wcs and every req's ws
	pmu    sync.Mutex
	npend  atomic.Int32 // changed under pmu: live reqs
	seq    uint64       // guarded by pmu: the last round's sequence number
	solo   solo         // guarded by pollMu
}

// soloSlot is the solo round's slot in work-request ids and the index of
// its bounce block, the one after the free list's.
const soloSlot = numBlocks

// solo is a connection's solo slot: a bounce block outside the free list
// and one work request, for an operation that fits one work request and
// whose caller holds pollMu from its post to its completion (runSolo).
// The round then needs none of the free-list and pending-set locking the
// others do; a lone operation takes this path.
type solo struct {
	w      []wr   // one work request, in cm
	id     uint64 // the last round's work-request id (sequence<<slotBits | soloSlot)
	live   bool   // posted, its completion not yet seen
	status uint32 // the last completion's
}

var _ rdma.Conn = (*Conn)(nil)

// Dial is Transport.Dial.
func Dial(ctx context.Context, addr string, cred []byte) (rdma.Conn, error) {
	if len(cred) > MaxCredential {
		return nil, fmt.Errorf("rdma/verbs: credential of %d bytes is longer than %d", len(cred), MaxCredential)
	}
	d, err := openDevice()
	if err != nil {
		return nil, err
	}
	var nd net.Dialer
	nc, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma/verbs: dial %s: %w", addr, err)
	}
	c, err := handshake(ctx, d, nc, cred)
	if err != nil {
		nc.Close()
		return nil, err
	}
	return c, nil
}

func randomPSN() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.LittleEndian.Uint32(b[:]) & 0xffffff
}

func handshake(ctx context.Context, d *device, nc net.Conn, cred []byte) (_ *Conn, err error) {
	if dl, ok := ctx.Deadline(); ok {
		nc.SetDeadline(dl)
	} else {
		nc.SetDeadline(time.Now().Add(10 * time.Second))
	}
	qp, err := d.newQueuePair(numBlocks + 1)
	if err != nil {
		return nil, err
	}
	c := &Conn{dev: d, qp: qp, ctl: nc, closedCh: make(chan struct{}), drained: make(chan struct{}), segs: map[uint64]*segEntry{},
		freed: make(chan struct{}), wake: make(chan struct{}, 1), reqs: make([]req, numBlocks)}
	defer func() {
		if err != nil {
			c.release()
		}
	}()
	var ws []wr
	if c.cm, ws, c.wcs, err = newCmem(numBlocks*roundBlocks+1, pollBatch); err != nil {
		return nil, err
	}
	c.solo.w, c.solo.id = ws[numBlocks*roundBlocks:], soloSlot
	for i := range c.reqs {
		c.reqs[i].ws = ws[i*roundBlocks : (i+1)*roundBlocks : (i+1)*roundBlocks]
	}
	c.bounce, err = unix.Mmap(-1, 0, (numBlocks+1)*blockSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("rdma/verbs: map the bounce buffer: %w", err)
	}
	if c.mr, err = d.register(c.bounce, accessLocalWrite); err != nil {
		return nil, err
	}
	for i := range numBlocks {
		c.free = append(c.free, i)
	}
	psn := randomPSN()
	if _, err := nc.Write(appendHello(nil, d.localInfo(qp.num(), psn), cred)); err != nil {
		return nil, fmt.Errorf("rdma/verbs: send hello to %s: %w", nc.RemoteAddr(), err)
	}
	remote, err := readReply(nc)
	if err != nil {
		return nil, err
	}
	if err := d.connect(qp, accessLocalWrite, psn, remote); err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Time{})
	return c, nil
}

// release frees what handshake or Close set up, in reverse order.
func (c *Conn) release() {
	if c.qp != nil {
		c.qp.destroy()
	}
	if c.mr != nil {
		c.mr.deregister()
	}
	if c.bounce != nil {
		unix.Munmap(c.bounce)
	}
	if c.cm.p != nil {
		c.cm.free()
	}
}

// errNoMessage says why a verbs connection carries no message.
var errNoMessage = &rdma.NotSupportedError{
	Feature: "MSG over verbs",
	Reason:  "the verbs control protocol has no message and the queue pair carries only one-sided work requests; rdma/dialer sends messages over a tcp connection to the same data plane",
}

// Message fails with an error matching rdma.ErrNotSupported: see the
// package doc, "Messages".
func (c *Conn) Message(context.Context, rdma.Region, []byte, []byte) (int, error) {
	return 0, errNoMessage
}

// Close closes the connection; operations in flight fail with ErrClosed.
// Close is idempotent.
func (c *Conn) Close() error {
	c.once.Do(func() {
		if c.state.Or(closedBit) == 0 {
			close(c.drained)
		}
		close(c.closedCh)
		<-c.drained
		c.ctl.Close()
		c.release()
	})
	return nil
}

// closedBit marks Conn.state once Close began.
const closedBit = 1 << 62

// enter registers an operation, or fails once Close has begun.
func (c *Conn) enter() error {
	for {
		s := c.state.Load()
		if s&closedBit != 0 {
			return fmt.Errorf("rdma/verbs: connection is closed: %w", rdma.ErrClosed)
		}
		if c.state.CompareAndSwap(s, s+1) {
			break
		}
	}
	if c.broken.Load() {
		c.exit()
		return c.qpFailed()
	}
	return nil
}

// exit ends an operation enter registered.
func (c *Conn) exit() {
	if c.state.Add(-1) == closedBit {
		close(c.drained)
	}
}

// Read fills p with the bytes of r starting at off.
func (c *Conn) Read(ctx context.Context, r rdma.Region, off int64, p []byte) error {
	return c.one(ctx, &rdma.Op{Kind: rdma.OpRead, Region: r, Offset: off, Buf: p})
}

// Write stores p into r starting at off.
func (c *Conn) Write(ctx context.Context, r rdma.Region, off int64, p []byte) error {
	return c.one(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: r, Offset: off, Buf: p})
}

// CompareAndSwap64 atomically replaces the word at off with new if it
// equals old (an RDMA ATOMIC_CMP_AND_SWP).
func (c *Conn) CompareAndSwap64(ctx context.Context, r rdma.Region, off int64, old, new uint64) (uint64, bool, error) {
	op := &rdma.Op{Kind: rdma.OpCompareAndSwap, Region: r, Offset: off, Old: old, New: new}
	err := c.one(ctx, op)
	return op.Prev, op.Swapped, err
}

// FetchAdd64 atomically adds delta to the word at off (an RDMA
// ATOMIC_FETCH_AND_ADD) and returns its previous value.
func (c *Conn) FetchAdd64(ctx context.Context, r rdma.Region, off int64, delta uint64) (uint64, error) {
	op := &rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Offset: off, Delta: delta}
	err := c.one(ctx, op)
	return op.Prev, err
}

// one runs a lone operation; op does not escape, so the Read, Write and
// atomic wrappers allocate nothing.
func (c *Conn) one(ctx context.Context, op *rdma.Op) error {
	op.Prev, op.Swapped, op.Err = 0, false, nil
	if err := c.enter(); err != nil {
		op.Err = err
		return err
	}
	defer c.exit()
	st := opState{op: op}
	if op.Err = c.check(ctx, &st); op.Err != nil || st.length() == 0 {
		return op.Err
	}
	if st.length() <= blockSize && c.pollMu.TryLock() {
		if !c.solo.live {
			op.Err = c.runSolo(ctx, &st)
			return op.Err
		}
		c.pollMu.Unlock()
	}
	if op.Err = c.post(ctx, &st, true); st.r != nil {
		op.Err = c.finish(ctx, &st)
	}
	return op.Err
}

// opState is one operation of a Do call while it runs.
type opState struct {
	op   *rdma.Op
	info segInfo
	done int // bytes finished
	r    *req
}

// Do posts every op's first round of work requests, then waits for each.
// The last op's post also polls, so a lone operation crosses into C once.
func (c *Conn) Do(ctx context.Context, ops ...*rdma.Op) error {
	if len(ops) == 1 {
		return c.one(ctx, ops[0])
	}
	if err := c.enter(); err != nil {
		for _, op := range ops {
			op.Err = err
		}
		return err
	}
	defer c.exit()
	sts := make([]opState, len(ops))
	for i, op := range ops {
		sts[i].op = op
		op.Prev, op.Swapped, op.Err = 0, false, nil
		if op.Err = c.check(ctx, &sts[i]); op.Err == nil && sts[i].length() > 0 {
			op.Err = c.post(ctx, &sts[i], i == len(ops)-1)
		}
	}
	var first error
	for i := range sts {
		if sts[i].r != nil {
			sts[i].op.Err = c.finish(ctx, &sts[i])
		}
		if first == nil && sts[i].op.Err != nil {
			first = sts[i].op.Err
		}
	}
	return first
}

func (op *opState) mutating() bool { return op.op.Kind != rdma.OpRead }

func (op *opState) length() int {
	if op.op.Kind == rdma.OpCompareAndSwap || op.op.Kind == rdma.OpFetchAdd {
		return 8
	}
	return len(op.op.Buf)
}

// check checks the op against its segment, which it resolves if need be.
func (c *Conn) check(ctx context.Context, st *opState) error {
	op := st.op
	switch op.Kind {
	case rdma.OpRead, rdma.OpWrite:
	case rdma.OpCompareAndSwap, rdma.OpFetchAdd:
		if op.Offset%8 != 0 {
			return fmt.Errorf("rdma/verbs: %s at offset %d of %s: %w", op.Kind, op.Offset, op.Region, rdma.ErrUnaligned)
		}
	default:
		return fmt.Errorf("rdma/verbs: %s: %w", op.Kind, rdma.ErrNotSupported)
	}
	info, err := c.segment(ctx, op.Region, st.mutating())
	if err != nil {
		return err
	}
	st.info = info
	n := st.length()
	if op.Offset < 0 || uint64(op.Offset) > info.size || uint64(n) > info.size-uint64(op.Offset) {
		return fmt.Errorf("rdma/verbs: %s of %d bytes at offset %d of %s (size %d): %w", op.Kind, n, op.Offset, op.Region, info.size, rdma.ErrOutOfRange)
	}
	if op.Once != nil && op.Kind != rdma.OpRead && op.Once.Post() {
		// RC retransmits exactly once within a queue pair; a new queue
		// pair cannot tell whether the old one's work request ran.
		return fmt.Errorf("rdma/verbs: %s at offset %d of %s was posted before on a queue pair that failed, and may have run; not posted again: %w", op.Kind, op.Offset, op.Region, rdma.ErrIndeterminate)
	}
	return nil
}

// AtomicScope reports what the device's atomics are atomic with
// (ibv_device_attr.atomic_cap).
func (c *Conn) AtomicScope() AtomicScope { return c.dev.atomicScope() }

// segment returns the cached address and rkey of the region's segment,
// resolving it over the control connection when unknown or when the caller
// holds a newer epoch than the cached one. A mutating op with an older epoch
// than the segment's fails with ErrLeaseExpired.
func (c *Conn) segment(ctx context.Context, r rdma.Region, write bool) (segInfo, error) {
	var info segInfo
	e := c.last.Load()
	ok := e != nil && e.seg == r.Segment
	if !ok {
		c.smu.Lock()
		if e, ok = c.segs[r.Segment]; ok {
			c.last.Store(e)
		}
		c.smu.Unlock()
	}
	if ok {
		info = e.info
	}
	if !ok || r.Epoch > info.epoch {
		var err error
		if info, err = c.resolve(ctx, r, write); err != nil {
			return segInfo{}, err
		}
	}
	if write && r.Epoch < info.epoch {
		return segInfo{}, fmt.Errorf("rdma/verbs: %s holds epoch %d, the segment is at %d: %w", r, r.Epoch, info.epoch, rdma.ErrLeaseExpired)
	}
	return info, nil
}

// resolve asks the server for the segment's address and rkey.
func (c *Conn) resolve(ctx context.Context, r rdma.Region, write bool) (segInfo, error) {
	q := request{Op: opResolve, Seg: r.Segment, Key: r.Key, Epoch: r.Epoch}
	if write {
		q.Flags = flagWrite
	}
	c.ctlMu.Lock()
	defer c.ctlMu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		c.ctl.SetDeadline(dl)
	} else {
		c.ctl.SetDeadline(time.Now().Add(30 * time.Second))
	}
	b := make([]byte, responseLen)
	if _, err := c.ctl.Write(q.encode()); err != nil {
		c.broken.Store(true)
		return segInfo{}, fmt.Errorf("rdma/verbs: resolve %s at %s: %w (%w)", r, c.ctl.RemoteAddr(), err, rdma.ErrClosed)
	}
	if _, err := io.ReadFull(c.ctl, b); err != nil {
		c.broken.Store(true)
		return segInfo{}, fmt.Errorf("rdma/verbs: resolve %s at %s: %w (%w)", r, c.ctl.RemoteAddr(), err, rdma.ErrClosed)
	}
	p, err := decodeResponse(b)
	if err != nil {
		c.broken.Store(true)
		return segInfo{}, err
	}
	if err := statusErr(p.Status, r.Segment); err != nil {
		c.forget(r.Segment)
		return segInfo{}, err
	}
	e := &segEntry{seg: r.Segment, info: segInfo{addr: p.Addr, rkey: p.RKey, size: p.Size, epoch: p.Epoch}}
	c.smu.Lock()
	c.segs[r.Segment] = e
	c.last.Store(e)
	c.smu.Unlock()
	return e.info, nil
}

func (c *Conn) forget(seg uint64) {
	c.smu.Lock()
	delete(c.segs, seg)
	if e := c.last.Load(); e != nil && e.seg == seg {
		c.last.Store(nil) // stores are all under smu
	}
	c.smu.Unlock()
}

// takeBlocks fills blocks with free bounce blocks, all or none, waiting
// for releases.
func (c *Conn) takeBlocks(ctx context.Context, blocks []int) error {
	n := len(blocks)
	for {
		c.bmu.Lock()
		if len(c.free) >= n {
			copy(blocks, c.free[len(c.free)-n:])
			c.free = c.free[:len(c.free)-n]
			c.bmu.Unlock()
			return nil
		}
		ch := c.freed
		c.bwait++
		c.bmu.Unlock()
		var err error
		select {
		case <-ch:
		case <-ctx.Done():
			err = ctx.Err()
		case <-c.closedCh:
			err = fmt.Errorf("rdma/verbs: connection is closed: %w", rdma.ErrClosed)
		}
		c.bmu.Lock()
		c.bwait--
		c.bmu.Unlock()
		if err != nil {
			return err
		}
	}
}

// recycle returns r's blocks, and with its first one r itself: r may be
// reused at once, so the caller must be done with it.
func (c *Conn) recycle(r *req) {
	c.bmu.Lock()
	c.free = append(c.free, r.blocks[:r.nblocks]...)
	if c.bwait > 0 {
		close(c.freed)
		c.freed = make(chan struct{})
	}
	c.bmu.Unlock()
}

func (c *Conn) block(i int) []byte { return c.bounce[i*blockSize : (i+1)*blockSize] }

// post posts the op's next round: up to roundBlocks work requests, the last
// one signalled (RC completes them in order, so its completion covers all).
// With poll, and nobody else polling, it polls right after posting in the
// same call into C.
func (c *Conn) post(ctx context.Context, st *opState, poll bool) error {
	op := st.op
	left := st.length() - st.done
	nb := min((left+blockSize-1)/blockSize, roundBlocks)
	var blocks [roundBlocks]int
	if err := c.takeBlocks(ctx, blocks[:nb]); err != nil {
		return err
	}
	// The slot is free (its block was): nobody else reads r until it is
	// live.
	r := &c.reqs[blocks[0]]
	r.blocks, r.nblocks = blocks, nb
	r.status, r.waitCh, r.abandoned = 0, nil, false
	r.done.Store(false)
	ws := r.ws[:nb]
	raddr := st.info.addr + uint64(op.Offset) + uint64(st.done)
	c.pmu.Lock()
	c.seq++
	r.id = c.seq<<slotBits | uint64(blocks[0])
	r.live = true
	c.npend.Add(1)
	c.pmu.Unlock()
	for i, b := range r.blocks[:nb] {
		n := min(left-i*blockSize, blockSize)
		if op.Kind == rdma.OpWrite {
			from := st.done + i*blockSize
			copy(c.block(b), op.Buf[from:from+n])
		}
		c.setWR(&ws[i], r.id, op, b, n, raddr+uint64(i*blockSize), st.info.rkey)
	}
	setSignaled(&ws[nb-1])
	var err error
	if poll && c.pollMu.TryLock() {
		var n int
		n, err = c.qp.postPoll(ws, c.wcs, pollSpinNs)
		if err == nil {
			c.dispatch(n)
		}
		c.polls.unlock(&c.pollMu)
	} else {
		err = c.qp.post(ws)
	}
	if err != nil {
		c.pmu.Lock()
		r.live = false
		c.npend.Add(-1)
		c.pmu.Unlock()
		c.recycle(r)
		c.broken.Store(true)
		return fmt.Errorf("rdma/verbs: ibv_post_send %s: %w (%w)", op.Kind, err, rdma.ErrClosed)
	}
	st.r = r
	return nil
}

// setWR fills w with the work request for n bytes of op through bounce
// block b to raddr (for an atomic, its 8-byte word).
func (c *Conn) setWR(w *wr, id uint64, op *rdma.Op, b, n int, raddr uint64, rkey uint32) {
	laddr := uintptr(unsafe.Pointer(unsafe.SliceData(c.bounce))) + uintptr(b*blockSize)
	switch op.Kind {
	case rdma.OpRead:
		*w = newWR(id, opRead, laddr, n, c.mr.lkey, raddr, rkey)
	case rdma.OpWrite:
		*w = newWR(id, opWrite, laddr, n, c.mr.lkey, raddr, rkey)
	case rdma.OpCompareAndSwap:
		*w = newWR(id, opCAS, laddr, 8, c.mr.lkey, raddr, rkey)
		setAtomic(w, op.Old, op.New)
	case rdma.OpFetchAdd:
		*w = newWR(id, opFAdd, laddr, 8, c.mr.lkey, raddr, rkey)
		setAtomic(w, op.Delta, 0)
	}
}

// setPrev sets an atomic op's result from bounce block b, where the
// responder returned the original word in host order.
func (c *Conn) setPrev(op *rdma.Op, b int) {
	op.Prev = *(*uint64)(unsafe.Pointer(&c.block(b)[0]))
	op.Swapped = op.Kind == rdma.OpCompareAndSwap && op.Prev == op.Old
}

// runSolo runs st's operation, which fits one work request, through the
// solo slot. The caller holds pollMu and runSolo releases it: it posts and
// polls in one crossing into C, and keeps polling (completing any other
// caller's rounds it sees) until its own completion arrives, ctx ends or
// the queue pair fails. A round left behind stays live until a later
// poller sees its completion.
func (c *Conn) runSolo(ctx context.Context, st *opState) error {
	op, s := st.op, &c.solo
	n := st.length()
	s.id += 1 << slotBits // the next sequence number, in the solo slot
	if op.Kind == rdma.OpWrite {
		copy(c.block(soloSlot), op.Buf)
	}
	c.setWR(&s.w[0], s.id, op, soloSlot, n, st.info.addr+uint64(op.Offset), st.info.rkey)
	setSignaled(&s.w[0])
	s.live = true
	k, err := c.qp.postPoll(s.w, c.wcs, pollSpinNs)
	if err != nil {
		s.live = false
		c.broken.Store(true)
		err = fmt.Errorf("rdma/verbs: ibv_post_send %s: %w (%w)", op.Kind, err, rdma.ErrClosed)
	} else {
		c.dispatch(k)
	}
	for s.live && err == nil { // dispatch clears live on its completion
		if err = ctx.Err(); err == nil && c.broken.Load() {
			err = c.qpFailed()
		}
		if err == nil {
			err = c.pollOnce()
		}
	}
	// The block is this round's until pollMu is released.
	status := s.status
	if err == nil && status == wcSuccess {
		switch op.Kind {
		case rdma.OpRead:
			copy(op.Buf, c.block(soloSlot)[:n])
		case rdma.OpCompareAndSwap, rdma.OpFetchAdd:
			c.setPrev(op, soloSlot)
		}
	}
	c.polls.unlock(&c.pollMu)
	c.handOff()
	switch {
	case err != nil:
		return err
	case status != wcSuccess:
		return c.failed(ctx, st, status)
	}
	return nil
}

// qpFailed is the error of an operation on a connection whose queue pair
// failed.
func (c *Conn) qpFailed() error {
	return fmt.Errorf("rdma/verbs: the queue pair to %s failed: %w", c.ctl.RemoteAddr(), rdma.ErrClosed)
}

// finish waits for the op's rounds, posting the next one after each.
func (c *Conn) finish(ctx context.Context, st *opState) error {
	for {
		r := st.r
		st.r = nil
		if err := c.wait(ctx, r); err != nil {
			return err
		}
		if r.status != wcSuccess {
			status := r.status
			c.recycle(r)
			return c.failed(ctx, st, status)
		}
		op := st.op
		n := min(st.length()-st.done, r.nblocks*blockSize)
		switch op.Kind {
		case rdma.OpRead:
			for i, b := range r.blocks[:r.nblocks] {
				k := min(n-i*blockSize, blockSize)
				copy(op.Buf[st.done+i*blockSize:], c.block(b)[:k])
			}
		case rdma.OpCompareAndSwap, rdma.OpFetchAdd:
			c.setPrev(op, r.blocks[0])
		}
		c.recycle(r)
		st.done += n
		if st.done >= st.length() {
			return nil
		}
		if err := c.post(ctx, st, true); err != nil {
			return err
		}
	}
}

// failed turns an error completion into the rdma error the caller can act
// on. An error completion leaves the queue pair in the error state, so the
// connection is broken from now on; the segment is resolved afresh to tell
// a revoked key or a stale epoch from a transient failure.
func (c *Conn) failed(ctx context.Context, st *opState, status uint32) error {
	c.broken.Store(true)
	op := st.op
	what := fmt.Sprintf("rdma/verbs: %s at offset %d of %s: work completion %q", op.Kind, op.Offset, op.Region, wcStatusString(status))
	switch status {
	case wcRemAccessErr:
		c.forget(op.Region.Segment)
		if _, err := c.resolve(ctx, op.Region, st.mutating()); err != nil && !errors.Is(err, rdma.ErrClosed) {
			return fmt.Errorf("%s: %w", what, err)
		}
		return fmt.Errorf("%s: the segment was re-registered; dial again: %w", what, rdma.ErrClosed)
	case wcRemInvReqErr:
		return fmt.Errorf("%s: %w", what, rdma.ErrOutOfRange)
	default:
		return fmt.Errorf("%s: %w", what, rdma.ErrClosed)
	}
}

// wait waits for r's completion, polling the completion queue while no
// other caller does (leader/follower). When ctx ends first, r is abandoned:
// the poller frees its blocks when its completion arrives.
func (c *Conn) wait(ctx context.Context, r *req) error {
	for {
		if r.done.Load() {
			return nil
		}
		if c.pollMu.TryLock() {
			err := c.pollOnce()
			c.polls.unlock(&c.pollMu)
			if r.done.Load() {
				c.handOff()
				return nil
			}
			if err == nil {
				err = ctx.Err()
			}
			if err == nil && c.broken.Load() {
				err = c.qpFailed()
			}
			if err != nil {
				if c.abandon(r) {
					c.handOff()
					return err
				}
				c.handOff()
				return nil // it completed meanwhile
			}
			continue
		}
		// Another caller polls: sleep until this completion or a hand-off.
		c.pmu.Lock()
		if r.done.Load() {
			c.pmu.Unlock()
			return nil
		}
		if r.waitCh == nil {
			r.waitCh = make(chan struct{})
		}
		ch := r.waitCh
		c.pmu.Unlock()
		select {
		case <-ch:
			return nil
		case <-c.wake:
		case <-ctx.Done():
			if c.abandon(r) {
				c.handOff()
				return ctx.Err()
			}
			<-ch
			return nil
		}
	}
}

// abandon marks r abandoned unless it already completed.
func (c *Conn) abandon(r *req) bool {
	c.pmu.Lock()
	defer c.pmu.Unlock()
	if r.done.Load() {
		return false
	}
	r.abandoned = true
	return true
}

// handOff passes the polling duty on when operations are still pending.
func (c *Conn) handOff() {
	if c.npend.Load() > 0 {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// pollOnce polls for up to pollSpinNs and completes what it finds. The
// caller holds pollMu.
func (c *Conn) pollOnce() error {
	n, err := c.qp.poll(c.wcs, pollSpinNs)
	if err != nil {
		c.broken.Store(true)
		return fmt.Errorf("%w (%w)", err, rdma.ErrClosed)
	}
	c.dispatch(n)
	return nil
}

// dispatch completes the requests of the first n polled completions. The
// caller holds pollMu.
func (c *Conn) dispatch(n int) {
	for i := range n {
		id, status := wcID(&c.wcs[i])
		slot := id & (1<<slotBits - 1)
		if slot == soloSlot {
			if s := &c.solo; s.live && s.id == id {
				s.live, s.status = false, status
				if status != wcSuccess {
					c.broken.Store(true)
				}
			}
			continue
		}
		if slot >= uint64(len(c.reqs)) {
			continue
		}
		r := &c.reqs[slot]
		c.pmu.Lock()
		if !r.live || r.id != id { // a later work request of a round that already failed
			c.pmu.Unlock()
			continue
		}
		r.live = false
		c.npend.Add(-1)
		r.status = status
		r.done.Store(true)
		ab, ch := r.abandoned, r.waitCh
		c.pmu.Unlock()
		if status != wcSuccess {
			c.broken.Store(true)
		}
		if ab {
			c.recycle(r)
		} else if ch != nil {
			close(ch)
		}
	}
}
