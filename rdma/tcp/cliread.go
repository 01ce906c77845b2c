package tcp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/farmem/farmem/rdma"
)

// Reading responses: whoever holds rdToken reads from the socket. A caller
// waiting for its op takes the token if it is free and reads responses
// itself (completing other callers' ops on the way) until its own arrives:
// on an idle connection a request/response then costs what raw TCP does,
// with no goroutine hand-off. Otherwise it waits on its done channel, and the
// reader goroutine, kicked by the last leader, reads for as long as ops are
// in flight. Whoever releases the token checks for ops in flight afterwards
// and makes sure someone reads for them.

// largePayload is the payload size from which the reader stops reading
// ahead of the next header.
const largePayload = 32 << 10

// errLeadEnded means a leading caller's ctx ended while it waited for a
// response header; the stream is intact.
var errLeadEnded = errors.New("leading caller's context ended")

// readLoop reads for the callers who are not reading themselves.
func (c *cliConn) readLoop() {
	defer c.wg.Done()
	for {
		select {
		case <-c.rdKick:
		case <-c.done:
			return
		}
		select {
		case <-c.rdToken:
		case <-c.done:
			return
		}
		for {
			for c.inflight() > 0 {
				if err := c.readOne(nil); err != nil {
					c.fail(err)
					c.rdToken <- struct{}{}
					return
				}
			}
			c.rdToken <- struct{}{}
			// An op registered after the last check may have found the
			// token taken and be waiting for someone to read: check again.
			if c.inflight() == 0 {
				break
			}
			select {
			case <-c.rdToken:
				continue
			default:
			}
			break // another reader holds the token and sees the op
		}
	}
}

// lead reads responses on the calling goroutine until o completes, ctx ends
// or the connection fails, if nobody else is reading. It reports whether it
// led.
func (c *cliConn) lead(ctx context.Context, o *op) bool {
	select {
	case <-c.rdToken:
	default:
		return false
	}
	// Busy-poll once this is the loneRun-th op in a row to be alone on
	// the connection: one op alone now and then is a lull in a pipelined
	// load, where batching responses beats answering each at once.
	c.lone.note(c.inflight() == 1)
	c.spin = noSpin
	if c.lone.long() {
		c.spin = spinClassOf(o.kind)
	}
	var stop func() bool
	if ctx.Done() != nil {
		c.leadMu.Lock()
		c.leadGen++
		gen := c.leadGen
		c.leadMu.Unlock()
		stop = context.AfterFunc(ctx, func() { c.interruptLeader(gen) })
	}
	for o.state.Load() != opDone {
		if err := c.readOne(ctx); err != nil {
			if err != errLeadEnded {
				c.fail(err)
			}
			break
		}
	}
	if stop != nil {
		stop()
		c.leadMu.Lock()
		c.leaderWaiting = false
		if c.leaderPoked {
			c.leaderPoked = false
			c.nc.SetReadDeadline(time.Time{})
		}
		c.leadMu.Unlock()
	}
	c.spin = noSpin
	c.rdToken <- struct{}{}
	if c.inflight() > 0 {
		c.kickReader() // ops in flight (o itself, if ctx ended) need a reader
	}
	return true
}

// kickReader wakes readLoop.
func (c *cliConn) kickReader() {
	select {
	case c.rdKick <- struct{}{}:
	default:
	}
}

// interruptLeader runs when the ctx of leader number gen ends: if that
// leader is blocked waiting for a response header, a past read deadline
// wakes it.
func (c *cliConn) interruptLeader(gen uint64) {
	c.leadMu.Lock()
	if c.leaderWaiting && c.leadGen == gen {
		c.leaderPoked = true
		c.nc.SetReadDeadline(time.Now())
	}
	c.leadMu.Unlock()
}

// readOne reads one response and completes its op. leadCtx is the ctx of a
// leading caller, nil for the reader goroutine. An error other than
// errLeadEnded means the stream is broken.
func (c *cliConn) readOne(leadCtx context.Context) error {
	var (
		b   []byte
		err error
	)
	// After a large payload another one is likely: read only its header
	// ahead, so the payload goes straight into the caller's buffer.
	limit := len(c.rd.buf)
	if c.lastPayload >= largePayload {
		limit = respHeaderSize
	}
	if leadCtx == nil || leadCtx.Done() == nil {
		b, err = c.rd.nextLimit(respHeaderSize, limit)
	} else {
		c.leadMu.Lock()
		c.leaderWaiting = true
		ended := leadCtx.Err() != nil
		c.leadMu.Unlock()
		if !ended {
			b, err = c.rd.nextLimit(respHeaderSize, limit)
		}
		c.leadMu.Lock()
		c.leaderWaiting = false
		if c.leaderPoked {
			c.leaderPoked = false
			c.nc.SetReadDeadline(time.Time{})
			if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
				ended = true
			}
		}
		c.leadMu.Unlock()
		if ended {
			return errLeadEnded // a partial header stays buffered
		}
	}
	if err != nil {
		return fmt.Errorf("read response: %w", err)
	}
	var h respHeader
	if err := decodeResponse(b, &h); err != nil {
		return err
	}
	c.lastPayload = int(h.payloadLen)
	s := uint32(h.id)
	var o *op
	if int(s) < len(c.slots) {
		o = c.slots[s].Load()
	}
	if o == nil || o.id.Load() != h.id {
		return fmt.Errorf("response for unknown request id %#x: %w", h.id, rdma.ErrProtocol)
	}
	if !c.slots[s].CompareAndSwap(o, nil) {
		return c.err // fail swept it: the connection is closing
	}
	c.free <- s
	c.answered.Add(1)
	claimed := false
	for !claimed {
		st := o.state.Load()
		if st != opSending && st != opSent {
			break
		}
		claimed = o.state.CompareAndSwap(st, opReceiving)
	}
	if !claimed {
		// The caller gave up: drop the payload, not into its buffer.
		err = c.rd.discard(int(h.payloadLen))
		o.release()
		return err
	}
	err = c.complete(o, &h)
	o.state.Store(opDone)
	o.done <- struct{}{}
	o.release()
	return err
}

// complete fills o's results from its response. An error means the stream
// is broken (o.err is set too).
func (c *cliConn) complete(o *op, h *respHeader) error {
	if h.status != statusOK {
		o.err = statusError(h.status, h.value, o.kind, o.region.Segment, o.off, len(o.buf))
		return nil
	}
	want := 0
	if o.kind == rdma.OpRead {
		want = len(o.buf)
	}
	if o.kind == opKindMessage && int(h.payloadLen) <= len(o.buf) {
		return c.completeMessage(o, h)
	}
	if int(h.payloadLen) != want {
		err := fmt.Errorf("%s response %#x carries %d payload bytes, want %d: %w", o.kind, h.id, h.payloadLen, want, rdma.ErrProtocol)
		o.err = fmt.Errorf("rdma/tcp: %w", err)
		return err
	}
	switch o.kind {
	case rdma.OpRead:
		if err := c.rd.readInto(o.buf); err != nil {
			o.err = fmt.Errorf("rdma/tcp: READ segment %d offset %d: connection to %s broke mid-payload: %w: %w", o.region.Segment, o.off, c.cl.addr, rdma.ErrClosed, err)
			return fmt.Errorf("read READ payload: %w", err)
		}
	case rdma.OpCompareAndSwap:
		o.prev, o.swapped = h.value, h.flags&respFlagSwapped != 0
	case rdma.OpFetchAdd:
		o.prev = h.value
	}
	return nil
}
