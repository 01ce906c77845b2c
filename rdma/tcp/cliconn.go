package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/rdma"
)

// cliConn is one TCP connection of a Client. Requests are matched to
// responses by id (slot index in the low 32 bits, a generation in the high
// 32), so a slow op never holds up the others.
//
// Sending: the caller that finds nobody flushing writes the queue itself
// with one writev (no goroutine wake-up on an idle connection); ops queued
// meanwhile are written by the per-connection writer goroutine, which keeps
// draining the queue in batches as long as there is work.
type cliConn struct {
	cl  *Client
	idx int
	nc  net.Conn
	rd  *frameReader
	out batchWriter // owned by the holder of the flush role

	slots []atomic.Pointer[op]
	free  chan uint32
	gen   atomic.Uint32

	mu       sync.Mutex
	cond     sync.Cond // on mu: a writev finished
	queue    []*op
	spare    []*op
	flushing bool // someone holds the flush role
	writing  bool // a writev is in progress
	shut     bool // fail ran; guarded by mu
	waiters  int
	kick     chan struct{}

	// Owned by the holder of the flush role.
	hdrBuf       []byte
	iov          [][]byte
	nb           net.Buffers
	deadline     time.Time
	writeTimeout time.Duration

	rdToken     chan struct{} // capacity 1: held by whoever reads responses
	lastPayload int           // size of the last response payload; guarded by rdToken
	answered    atomic.Uint64 // responses read (Client.answers)
	rdKick      chan struct{} // capacity 1: wakes readLoop

	leadMu        sync.Mutex // guards the three fields below
	leaderWaiting bool       // a leading caller waits for a header
	leaderPoked   bool       // interruptLeader set a read deadline
	leadGen       uint64     // counts leaders whose ctx can end
	spin          int        // the reader's spin class, or noSpin (guarded by rdToken, as lone)
	lone          streak     // leaders in a row whose op was alone

	closed   atomic.Bool
	failOnce sync.Once
	err      error // set before closed and done
	done     chan struct{}
	wg       sync.WaitGroup
}

func newCliConn(cl *Client, idx int, nc net.Conn, o *options) *cliConn {
	c := &cliConn{
		cl:           cl,
		idx:          idx,
		nc:           nc,
		slots:        make([]atomic.Pointer[op], o.maxInflight),
		free:         make(chan uint32, o.maxInflight),
		kick:         make(chan struct{}, 1),
		rdToken:      make(chan struct{}, 1),
		rdKick:       make(chan struct{}, 1),
		hdrBuf:       make([]byte, o.maxInflight*reqHeaderSize),
		iov:          make([][]byte, 0, 2*o.maxInflight),
		writeTimeout: o.writeTimeout,
		done:         make(chan struct{}),
	}
	// A caller whose op is alone on the connection has nothing else to do
	// for the whole round trip: it busy-polls (see lead).
	c.rd = newFrameReader(pollingReader(nc, o.busyPoll, func() int { return c.spin }), o.readBuffer)
	c.out = newBatchWriter(nc)
	c.cond.L = &c.mu
	c.rdToken <- struct{}{}
	for i := range o.maxInflight {
		c.free <- uint32(i)
	}
	c.wg.Add(2)
	go c.readLoop()
	go c.writeLoop()
	return c
}

// inflight returns the number of ops holding a slot.
func (c *cliConn) inflight() int { return cap(c.free) - len(c.free) }

// failure returns why the connection is closed.
func (c *cliConn) failure() error {
	<-c.done
	return c.err
}

// register gives o a slot and an id, waiting for a free slot if all are in
// use. On success o holds two more references (flusher and slot table).
func (c *cliConn) register(ctx context.Context, o *op, block bool) (bool, error) {
	var s uint32
	select {
	case s = <-c.free:
	default:
		if !block {
			return false, nil
		}
		// Slots come back only as responses are read; the callers of the
		// ops holding them may not be reading yet (a Do still posting).
		c.kickReader()
		select {
		case s = <-c.free:
		case <-ctx.Done():
			return false, ctx.Err()
		case <-c.done:
			return false, c.err
		}
	}
	o.slot = s
	o.id.Store(uint64(c.gen.Add(1))<<32 | uint64(s))
	o.state.Store(opQueued)
	o.refs.Add(2)
	c.slots[s].Store(o)
	// fail stores closed before it sweeps the slots; we store the slot
	// before loading closed. Either we see closed, or fail sees o.
	if c.closed.Load() && c.slots[s].CompareAndSwap(o, nil) {
		o.refs.Add(-2)
		return false, c.err
	}
	return true, nil
}

// enqueue queues registered ops and, if nobody is flushing, writes them.
func (c *cliConn) enqueue(ops ...*op) {
	c.mu.Lock()
	if c.shut {
		c.mu.Unlock()
		// fail's sweep completes them; drop the flusher's references.
		for _, o := range ops {
			o.release()
		}
		return
	}
	c.queue = append(c.queue, ops...)
	if c.flushing {
		c.mu.Unlock()
		return
	}
	c.flushing = true
	c.mu.Unlock()
	// On an idle connection (the latency case) the caller writes its own
	// request: no goroutine hand-off. With other ops in flight, responses
	// are arriving and waking other callers who will queue requests too;
	// the writer goroutine collects them into one writev instead of one
	// syscall per op.
	if c.inflight() > len(ops) {
		c.kickWriter()
		return
	}
	if !c.writeQueued() {
		return
	}
	// More arrived while we wrote: the writer goroutine takes over, so this
	// caller can go and wait for its own response.
	c.kickWriter()
}

func (c *cliConn) kickWriter() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// writeLoop drains the queue whenever the flush role is handed to it.
func (c *cliConn) writeLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.kick:
		case <-c.done:
			return
		}
		for {
			// Let the callers that responses just woke queue their requests
			// first, so one writev carries them all.
			runtime.Gosched()
			if !c.writeQueued() {
				break
			}
		}
	}
}

// writeQueued writes the queued ops with one writev. The caller holds the
// flush role; it reports whether it still does (more ops are queued).
func (c *cliConn) writeQueued() bool {
	c.mu.Lock()
	if c.shut || len(c.queue) == 0 {
		for _, o := range c.queue {
			o.release()
		}
		clear(c.queue)
		c.queue = c.queue[:0]
		c.flushing = false
		c.mu.Unlock()
		return false
	}
	batch := c.queue
	c.queue, c.spare = c.spare[:0], nil
	c.writing = true
	c.mu.Unlock()

	err := c.writeBatch(batch)

	c.mu.Lock()
	c.writing = false
	if c.waiters > 0 {
		c.cond.Broadcast()
	}
	clear(batch)
	c.spare = batch[:0]
	more := len(c.queue) > 0 && !c.shut && err == nil
	if !more {
		c.flushing = false
		if err != nil || c.shut {
			for _, o := range c.queue {
				o.release()
			}
			clear(c.queue)
			c.queue = c.queue[:0]
		}
	}
	c.mu.Unlock()
	if err != nil {
		c.fail(fmt.Errorf("write requests: %w", err))
	}
	return more
}

// writeBatch encodes and writes every op of batch that is still queued.
func (c *cliConn) writeBatch(batch []*op) error {
	iov := c.iov[:0]
	n := 0
	var h reqHeader
	for _, o := range batch {
		if !o.state.CompareAndSwap(opQueued, opSending) {
			continue // cancelled by its caller, or failed by fail
		}
		h = reqHeader{
			id:     o.id.Load(),
			op:     uint8(o.kind),
			seg:    o.region.Segment,
			key:    o.region.Key,
			epoch:  o.region.Epoch,
			off:    o.off,
			length: uint32(len(o.buf)),
			arg0:   o.arg0,
			arg1:   o.arg1,
		}
		if o.once != nil {
			h.flags, h.slot, h.seq = reqFlagOnce, o.once.Slot, o.once.Seq
			if o.retry {
				h.flags |= reqFlagRetry
			}
		}
		switch o.kind {
		case rdma.OpWrite, rdma.OpXor:
			h.payloadLen = h.length
			if o.origin != nil {
				h.flags |= reqFlagForward
				h.payloadLen += uint32(len(o.origin))
			}
		case rdma.OpCompareAndSwap, rdma.OpFetchAdd:
			h.length = 8
		case opKindMessage:
			h.payloadLen = uint32(len(o.req))
		}
		hb := c.hdrBuf[n*reqHeaderSize : (n+1)*reqHeaderSize]
		n++
		encodeRequest(hb, &h)
		iov = append(iov, hb)
		if len(o.origin) > 0 {
			iov = append(iov, o.origin)
		}
		if carriesPayload(o.kind) && len(o.buf) > 0 {
			iov = append(iov, o.buf)
		}
		if o.kind == opKindMessage && len(o.req) > 0 {
			iov = append(iov, o.req)
		}
	}
	var err error
	if n > 0 {
		if c.writeTimeout > 0 {
			if now := time.Now(); c.deadline.Sub(now) < c.writeTimeout/2 {
				c.deadline = now.Add(c.writeTimeout)
				c.nc.SetWriteDeadline(c.deadline)
			}
		}
		c.nb = iov
		err = c.out.write(&c.nb)
		c.nb = nil
	}
	clear(iov) // drop references to caller buffers
	c.iov = iov[:0]
	for _, o := range batch {
		o.state.CompareAndSwap(opSending, opSent)
		o.release()
	}
	return err
}

// wait waits for o to complete or ctx to end. nil means o completed and its
// results (including o.err) are valid.
func (c *cliConn) wait(ctx context.Context, o *op) error {
	c.lead(ctx, o)
	select {
	case <-o.done:
		return nil
	case <-ctx.Done():
		return c.cancel(ctx, o)
	}
}

// cancel withdraws o after its caller's ctx ended; see the state diagram.
func (c *cliConn) cancel(ctx context.Context, o *op) error {
	for {
		switch o.state.Load() {
		case opQueued:
			if o.state.CompareAndSwap(opQueued, opCancelled) {
				if c.slots[o.slot].CompareAndSwap(o, nil) {
					c.free <- o.slot
					o.release()
				}
				return ctx.Err()
			}
		case opSending:
			c.mu.Lock()
			c.waiters++
			for o.state.Load() == opSending && c.writing {
				c.cond.Wait()
			}
			c.waiters--
			c.mu.Unlock()
		case opSent:
			if o.state.CompareAndSwap(opSent, opAbandoned) {
				return ctx.Err()
			}
		default: // receiving or done: the result is (nearly) there
			<-o.done
			return nil
		}
	}
}

// fail closes the connection once and fails every op in flight with an
// error that matches rdma.ErrClosed and cause.
func (c *cliConn) fail(cause error) {
	c.failOnce.Do(func() {
		if errors.Is(cause, rdma.ErrClosed) {
			c.err = cause
		} else {
			c.err = fmt.Errorf("rdma/tcp: connection %d to %s: %w: %w", c.idx, c.cl.addr, rdma.ErrClosed, cause)
		}
		c.closed.Store(true)
		c.nc.Close()
		close(c.done)

		c.mu.Lock()
		c.shut = true
		for c.writing {
			c.waiters++
			c.cond.Wait()
			c.waiters--
		}
		c.mu.Unlock()

		for i := range c.slots {
			if o := c.slots[i].Swap(nil); o != nil {
				c.abort(o)
			}
		}
	})
}

// abort completes o with the connection's error unless its caller gave up.
func (c *cliConn) abort(o *op) {
	for {
		st := o.state.Load()
		switch st {
		case opQueued, opSent:
			if o.state.CompareAndSwap(st, opReceiving) {
				o.err, o.unsent = c.err, st == opQueued
				o.state.Store(opDone)
				o.done <- struct{}{}
				o.release()
				return
			}
		default:
			o.release()
			return
		}
	}
}

// close fails the connection with ErrClosed and waits for its goroutines.
func (c *cliConn) close(why error) {
	c.fail(why)
	c.wg.Wait()
}
