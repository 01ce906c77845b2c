package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"

	"github.com/farmem/farmem/rdma"
)

// writeStaged serves a WRITE or XOR whose payload cannot stream into the
// mapping: an XOR (it combines with the bytes there), a forwarded op (its
// payload starts with an origin block), and any write to a forwarding
// segment (its change is applied under the forwarding lock, which must not
// wait for the socket). The payload is read into a buffer first. e is
// pinned as mutating and announced as streaming; the pin is passed on.
func (c *srvConn) writeStaged(h *reqHeader, e *export) error {
	n := int(h.payloadLen)
	var err error
	if c.rd.buffered() < n && c.npend > 0 {
		err = c.flush()
	}
	var b *[]byte
	if err == nil {
		b, err = c.readStaged(n)
		defer putBuf(b)
	}
	c.streaming.Store(nil)
	if c.cut.Load() {
		e.unpin(true)
		return fmt.Errorf("segment %d was revoked while a %d-byte %s payload was arriving", e.seg, n, opName(h.op))
	}
	if err != nil {
		e.unpin(true)
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read %d-byte %s payload: %w", n, opName(h.op), err)
	}
	pre := n - int(h.length)
	var org *origin
	if pre > 0 {
		o, err := decodeOrigin((*b)[:pre])
		if err == nil && (c.sessKey != nil && o.key == *c.sessKey || c.s.namesForwarder(o.key)) {
			// The op holds its sender's slot while it runs, and then takes
			// the origin's: an origin naming a forwarder's session (its
			// own, or another forwarder's that names it back) would wait
			// forever. An origin names a client's session, never a peer
			// daemon's, so slots are always taken in that order.
			err = fmt.Errorf("origin block names a session of a forwarder (%s), not of a client: %w", o.key.name, rdma.ErrProtocol)
		}
		if err != nil {
			e.unpin(true)
			c.warn("rdma/tcp: malformed origin block of a forwarded op", "remote", c.remote, "request", h.id, "err", err)
			return c.respond(h.id, statusProtocol, 0, 0, nil, nil)
		}
		org = &o
	}
	return c.mutate(h, e, (*b)[pre:], org)
}

// stagedStep is how much of a staged payload is buffered before its bytes
// arrive; the buffer grows by doubling as they do.
const stagedStep = 1 << 20

// readStaged reads an n-byte payload into a pooled buffer. The buffer
// holds at most stagedStep, or what has arrived, more than the bytes read
// so far: a header that announces megabytes and sends nothing (up to
// FrameTimeout, on many connections) costs the daemon only what was sent,
// for one copy more of a large payload. b is never nil.
func (c *srvConn) readStaged(n int) (b *[]byte, err error) {
	b = getBuf(min(n, max(stagedStep, c.rd.buffered())))
	if err := c.rd.readInto(*b); err != nil {
		return b, err
	}
	for have := len(*b); have < n; have = len(*b) {
		next := getBuf(min(n, 2*have))
		copy(*next, (*b)[:have])
		putBuf(b)
		b = next
		if err := c.rd.readInto((*b)[have:]); err != nil {
			return b, err
		}
	}
	return b, nil
}

// rememberFor keeps the answer of a forwarded op in the reply cache of its
// origin's client (org nil: not forwarded), if that client may use e: a
// forwarder speaks only for the clients of the segment it forwards, and an
// answer planted for another would be what that one's next op with the
// slot and sequence number (on any segment here) got instead of running.
// The op itself is applied either way: a home that was not told of a
// client attached since (a copy rebuilt elsewhere) must not fail the
// forwarder for it.
func (c *srvConn) rememberFor(e *export, org *origin) {
	if org == nil {
		return
	}
	if !e.mayUse(org.key.name) {
		c.warn("rdma/tcp: forwarded op names a client that may not use its segment; its answer is not kept", "remote", c.remote, "segment", e.seg, "client", org.key.name)
		return
	}
	c.s.sessions.remember(org)
}

// mutate applies a WRITE or XOR of data, or a CAS or FADD, to the pinned
// export e, whose checks passed, and answers it (the pin is dropped). On a
// forwarding segment the op is applied and its change handed to the
// targets under e.fwdMu, and answered once they acknowledged. org is the
// origin of a forwarded op, whose answer the reply cache keeps for its
// client.
func (c *srvConn) mutate(h *reqHeader, e *export, data []byte, org *origin) error {
	n := uint64(len(data))
	if h.op == opCAS || h.op == opFADD {
		n = 8
	}
	f := e.fwd.Load()
	locked := f != nil || h.op == opXor
	if locked {
		e.fwdMu.Lock()
		f = e.fwd.Load()
	}
	mem := e.mem[h.off : h.off+n]
	var was *[]byte
	fault := false
	if f != nil && f.mode == ForwardParity {
		was = getBuf(int(n))
		_, fault = copyGuarded(*was, mem)
	}
	var (
		flags uint8
		value uint64
	)
	if !fault {
		flags, value, fault = apply(h, mem, data)
	}
	var now *[]byte
	if !fault && f != nil {
		now = getBuf(int(n))
		_, fault = copyGuarded(*now, mem)
	}
	if fault || f == nil {
		if locked {
			e.fwdMu.Unlock()
		}
		if was != nil {
			putBuf(was)
		}
		if now != nil {
			putBuf(now)
		}
		if fault {
			e.state.CompareAndSwap(stateLive, stateLost)
			c.log.Error("rdma/tcp: memory fault applying an op; marked segment lost", "segment", e.seg, "op", opName(h.op), "offset", h.off, "length", n)
			e.unpin(true)
			return c.respond(h.id, statusSegmentLost, 0, 0, nil, nil)
		}
		e.changed(h.off, n)
		c.rememberFor(e, org)
		e.unpin(true)
		return c.respond(h.id, statusOK, flags, value, nil, nil)
	}

	e.changed(h.off, n)
	c.rememberFor(e, org)
	fo := getFwdOp()
	fo.c, fo.e, fo.f, fo.id, fo.status, fo.flags, fo.value = c, e, f, h.id, statusOK, flags, value
	fo.bufs = append(fo.bufs, now)
	if c.record != nil {
		fo.sl, fo.seq = c.record, c.recSeq
		c.record, c.tookSlot = nil, true
	}
	switch {
	case org != nil: // a forwarded op forwarded on: its client's origin
		fo.org = appendOrigin(fo.org, org)
	case fo.sl != nil:
		fo.org = appendOrigin(fo.org, &origin{key: *c.sessKey, slot: h.slot, seq: h.seq, status: statusOK, flags: flags, value: value})
	}
	var wasb []byte
	if was != nil {
		fo.bufs = append(fo.bufs, was)
		wasb = *was
	}
	f.forward(fo, h.off, wasb, *now)
	f.inflight.Add(1)
	e.unsettle(h.off, n, fo)
	e.fwdMu.Unlock()
	c.status = statusOK
	// A client's op alone on the connection is awaited here (see the
	// forwarding notes in forward.go). A forwarded op never is: its
	// connection's goroutine must not wait for other hosts, or two homes
	// forwarding to each other could each hold up the other's answers.
	if org == nil && c.rd.buffered() == 0 && c.handedOff.Load() == 0 {
		err := c.flush()
		fo.settle()
		id, status, flags, value := fo.id, fo.status, fo.flags, fo.value
		fo.free()
		if err != nil {
			return err
		}
		return c.respond(id, status, flags, value, nil, nil)
	}
	c.handedOff.Add(1)
	c.s.runForward(fo)
	return nil
}

// apply runs op h on mem (the op's bytes of the mapping): WRITE and XOR
// with data, CAS and FADD on the word mem holds. It returns the response
// flags and value, or reports a memory fault. The calling goroutine must
// have SetPanicOnFault(true).
func apply(h *reqHeader, mem, data []byte) (flags uint8, value uint64, fault bool) {
	switch h.op {
	case opWrite:
		_, fault = copyGuarded(mem, data)
	case opXor:
		fault = xorGuarded(mem, data)
	case opCAS:
		var swapped bool
		value, swapped, fault = casGuarded(word(mem), h.arg0, h.arg1)
		if swapped {
			flags = respFlagSwapped
		}
	case opFADD:
		value, fault = faddGuarded(word(mem), h.arg0)
	}
	return flags, value, fault
}

// respondLater sends the answer of a forwarded op from whichever goroutine
// has it. Answers that arrive while one is being written are gathered and
// written together by the goroutine writing. A write error closes the
// socket; the connection's goroutine then ends.
func (c *srvConn) respondLater(id uint64, status uint16, flags uint8, value uint64) {
	var hb [respHeaderSize]byte
	encodeResponse(hb[:], &respHeader{id: id, status: status, flags: flags, value: value})
	c.lateMu.Lock()
	c.late = append(c.late, hb[:]...)
	if c.lateWriting {
		c.lateMu.Unlock()
		return
	}
	c.lateWriting = true
	c.lateMu.Unlock()
	// The acknowledgements of a batch of forwarded ops arrive together and
	// wake their goroutines together: let them queue their answers, so
	// that one write carries them all.
	runtime.Gosched()
	c.lateMu.Lock()
	for len(c.late) > 0 {
		b := c.late
		c.late, c.spare = c.spare[:0], nil
		c.lateMu.Unlock()
		c.wmu.Lock()
		c.extendWriteDeadline()
		nb := net.Buffers{b}
		err := c.out.write(&nb)
		c.wmu.Unlock()
		if err != nil {
			c.sock.Close()
		}
		c.lateMu.Lock()
		c.spare = b[:0]
	}
	c.lateWriting = false
	c.lateMu.Unlock()
}
