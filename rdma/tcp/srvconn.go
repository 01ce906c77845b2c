package tcp

import (
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/rdma"
)

// flushBytes is the payload volume after which pending responses are flushed
// even if more requests are buffered.
const flushBytes = 256 << 10

// srvConn serves one client connection. One goroutine reads a request,
// executes it against the mapped memory and queues its response; queued
// responses go out in one vectored write when no further complete request is
// buffered (the goroutine would block reading), when MaxInflightPerConn are
// queued, or when flushBytes of payload are queued. Doing the writes on the
// same goroutine, instead of handing them to a writer goroutine, saves a
// goroutine wake-up per batch, which on a two-core host is most of the cost
// of a small op; batching is the same either way.
type srvConn struct {
	s      *Server
	sock   net.Conn // the TCP socket: closed and interrupted from other goroutines
	nc     net.Conn // sock, or the TLS connection over it once handshake ran
	rd     *frameReader
	out    batchWriter
	log    *slog.Logger
	remote string

	hdrs      []byte                 // response headers of the pending batch
	iov       [][]byte               // pending batch: headers and READ payloads
	nb        net.Buffers            // writev argument; a field so it does not escape per flush
	pinned    []*export              // exports pinned by pending READ payloads
	copies    []*[]byte              // pooled copies pending READ payloads were read into (readSettled)
	npend     int                    // pending responses
	pendBytes int                    // pending payload bytes
	deadline  time.Time              // current write deadline
	streaming atomic.Pointer[export] // export a WRITE payload is streaming into
	cut       atomic.Bool            // Revoke interrupted a streaming WRITE
	status    uint16                 // status of the last response queued, for ServerConfig.Observe
	handover  uint64                 // the token of the MOVED that pin answered last (export.handover)
	lone      streak                 // flushes in a row that wrote one response
	src       netip.Prefix           // source counted for MaxHandshakesPerSource, if valid
	countedAs string                 // tenantKey counted for MaxConnsPerTenant; "" if none

	// Frame deadline: framing is set once the current request frame has
	// begun to arrive and is not complete (its first byte came, so the
	// rest must come within FrameTimeout); deadlined while a read deadline
	// is set on the socket (it is cleared lazily, before an idle wait).
	framing, deadlined bool
	sess               *session    // the client's exactly-once session, opened by its first ONCE request
	sessKey            *sessionKey // the session the hello named; nil before version 2
	sessResume         bool        // the hello resumed sessKey (see sessionTable.open)
	record             *slot       // the slot whose request runs; respond caches its answer
	recSeq             uint32      // the sequence number of that request
	tookSlot           bool        // a forwarded op took record (and its lock) to answer later

	// Answers of forwarded ops, which come from other goroutines once the
	// targets acknowledged (respondLater): wmu serialises every write to
	// the socket (out, deadline); late holds encoded answers waiting for
	// lateWriting's holder to write them.
	handedOff   atomic.Int32 // forwarded ops handed to a worker and not yet answered
	wmu         sync.Mutex
	lateMu      sync.Mutex
	late, spare []byte
	lateWriting bool

	// The principal the hello's credential names and its tenant
	// (ServerConfig.Identify; the session's share counts against that
	// tenant however the credential fares later), set under s.mu
	// (Disconnect reads them), and the last export and principal set it
	// was found in (permits).
	principal  string
	tenant     string
	identified bool
	okExport   *export
	okSet      *principals
	okReaders  *principals
	okReader   bool // okExport with okSet and okReaders: the principal may read
	okWriter   bool // and may write
}

// newSrvConn returns a connection in its handshake: it holds no buffers
// yet, so a connection that never authenticates costs only its goroutine.
func newSrvConn(s *Server, nc net.Conn) *srvConn {
	return &srvConn{s: s, sock: nc, nc: nc, log: s.log}
}

// setup allocates the buffers of an authenticated connection.
func (c *srvConn) setup() {
	s := c.s
	max := s.cfg.MaxInflightPerConn
	c.remote = c.nc.RemoteAddr().String()
	c.hdrs = make([]byte, max*respHeaderSize)
	c.iov = make([][]byte, 0, 2*max)
	c.pinned = make([]*export, 0, max)
	// A client that sends one request at a time sends the next one soon
	// after each response: once a run of flushes has carried one response
	// each, the connection busy-polls for the next request, unless another
	// connection has flushed since (then the cores have work, and the
	// clients' share of them is what brings the next request).
	c.rd = newFrameReader(pollingReader(c.nc, s.cfg.BusyPoll, func() int {
		if c.lone.long() && s.lastFlush.Load() == c {
			return spinOther // the next request, whatever it is
		}
		return noSpin
	}), s.cfg.ReadBufferSize)
	c.out = newBatchWriter(c.nc)
	c.rd.partial = c.arm
}

// interrupt cuts off a WRITE payload that is streaming into a segment being
// revoked; the connection is then closed.
func (c *srvConn) interrupt() {
	c.cut.Store(true)
	c.sock.SetReadDeadline(time.Now())
}

func (c *srvConn) serve() {
	defer c.s.wg.Done()
	defer c.s.dropConn(c)
	defer c.sock.Close()
	defer c.unpin()
	// A SIGBUS on mapped memory (truncated file, poisoned line) becomes a
	// recoverable panic in this goroutine; see copyGuarded.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))

	code, err := c.handshake()
	c.s.shaken(c)
	if err != nil {
		if c.s.isClosed() || errors.Is(err, net.ErrClosed) {
			c.log.Debug("rdma/tcp: handshake cut off by server close", "remote", c.nc.RemoteAddr().String(), "err", err)
		} else {
			c.s.refused(handshakeRefusal(code, err), c.nc.RemoteAddr(), err)
		}
		return
	}
	c.setup()
	defer func() {
		if c.sess != nil {
			// Most recently used as the connection ends, which is when
			// its client may come back to resume it.
			c.s.sessions.touch(c.sess)
		}
	}()
	var h reqHeader
	lastPayload := 0
	for {
		c.framing = false
		if c.rd.buffered() < reqHeaderSize {
			if err := c.flush(); err != nil {
				c.closeWith("write responses", err)
				return
			}
			if c.rd.buffered() == 0 && c.deadlined {
				// An idle wait for the next frame is not limited.
				c.deadlined = false
				c.nc.SetReadDeadline(time.Time{})
			}
		}
		// After a large WRITE payload another one is likely: read only its
		// header ahead, so the payload goes straight into the mapping.
		limit := len(c.rd.buf)
		if lastPayload >= largePayload {
			limit = reqHeaderSize
		}
		b, err := c.rd.nextLimit(reqHeaderSize, limit)
		if err != nil {
			if errors.Is(err, io.EOF) {
				c.log.Debug("rdma/tcp: client closed the connection", "remote", c.remote)
				return
			}
			c.closeWith("read request header (truncated frame?)", err)
			return
		}
		if err := decodeRequest(b, &h); err != nil {
			c.closeWith("malformed request frame", err)
			return
		}
		lastPayload = int(h.payloadLen)
		start := c.opStart()
		if err := c.handle(&h); err != nil {
			c.closeWith(fmt.Sprintf("request %d opcode %d", h.id, h.op), err)
			return
		}
		c.observe(&h, start)
	}
}

// closeWith logs why the connection is being closed: a warning, sampled
// (warn), as a client can have its connections closed at will; a
// connection closed by Server.Close is not worth a warning.
func (c *srvConn) closeWith(what string, err error) {
	switch {
	case c.cut.Load():
		what = "a segment was revoked while a WRITE payload was streaming into it"
	case c.framing && errors.Is(err, os.ErrDeadlineExceeded):
		what = fmt.Sprintf("a request frame did not complete within ServerConfig.FrameTimeout (%v) of its first byte", c.s.cfg.FrameTimeout)
	}
	const msg = "rdma/tcp: closing connection"
	if c.s.isClosed() || errors.Is(err, net.ErrClosed) {
		c.log.Debug(msg, "remote", c.remote, "reason", what, "err", err)
		return
	}
	c.warn(msg, "remote", c.remote, "reason", what, "err", err)
}

// connWarning keys the sampled warnings about authenticated connections:
// the message and the connection's principal, so that a client provoking
// one at will hides neither other warnings nor other clients' lines.
type connWarning struct{ msg, principal string }

// warn logs a warning about the connection, at most one per
// logsample.Interval per message and principal, with the number held back
// since the last one (suppressed_since_last).
func (c *srvConn) warn(msg string, args ...any) {
	c.s.connLog.Log(c.log, slog.LevelWarn, connWarning{msg, c.principal}, msg, args...)
}

// handshake runs the TLS handshake (with ServerConfig.TLS), then reads
// the client's hello and answers it; it returns the reply code sent (or
// due) with the error that refused the client. HandshakeTimeout bounds
// both. The admission limits were checked at accept (admit).
func (c *srvConn) handshake() (uint16, error) {
	cfg := &c.s.cfg
	c.nc.SetDeadline(time.Now().Add(cfg.HandshakeTimeout))
	if cfg.TLS != nil {
		tc := tls.Server(newPolledConn(c.sock), cfg.TLS)
		if err := tc.Handshake(); err != nil {
			return replyBadMagic, fmt.Errorf("TLS handshake: %w", err)
		}
		c.nc = tc
	}
	h, code, err := readHello(c.nc)
	if err == nil {
		if aerr := c.identify(h.cred, c.peerCert()); aerr != nil {
			code, err = replyAuthFailed, fmt.Errorf("authenticate: %w", aerr)
		} else if !c.s.admitTenant(c) {
			code, err = replyBusy, fmt.Errorf("tenant of principal %s: %w", c.principal, errTenantLimit)
		}
	}
	version := uint16(maxVersion)
	if code == replyAccept {
		version = h.version
		if h.version >= sessionVersion {
			// Opened at the first ONCE request, so that a client that only
			// reads takes no place in the table.
			who := string(h.cred)
			if c.identified {
				who = c.principal
			}
			c.sessKey, c.sessResume = &sessionKey{name: sessionName(c.identified, who), id: h.session}, h.resume
			if !h.resume {
				c.s.sessions.announce(*c.sessKey)
			}
		}
	}
	var b [replySize]byte
	encodeReply(b[:], reply{version: version, code: code, maxPayload: MaxPayload})
	if _, werr := c.nc.Write(b[:]); werr != nil && err == nil {
		err = fmt.Errorf("write reply: %w", werr)
	}
	if err != nil {
		return code, err
	}
	return code, c.nc.SetDeadline(time.Time{})
}

// arm starts the current frame's FrameTimeout, once per frame: called when
// a read of the frame finds it incomplete, and before a payload is read
// from the socket.
func (c *srvConn) arm() {
	if c.framing {
		return
	}
	c.framing, c.deadlined = true, true
	c.nc.SetReadDeadline(time.Now().Add(c.s.cfg.FrameTimeout))
}

func (c *srvConn) handle(h *reqHeader) error {
	if h.flags != 0 {
		if h.flags&^reqFlagsKnown != 0 || h.flags&reqFlagOnce == 0 || c.sessKey == nil {
			return c.unsupported(h)
		}
		return c.once(h)
	}
	switch h.op {
	case opRead:
		return c.read(h)
	case opWrite, opXor:
		return c.write(h)
	case opCAS, opFADD:
		return c.atomic(h)
	case opMsg:
		if c.s.cfg.Message != nil {
			return c.message(h)
		}
		return c.unsupported(h)
	default:
		return c.unsupported(h)
	}
}

// once runs an exactly-once request: it executes a sequence number the
// slot has not run and caches the answer, answers a repeat of the slot's
// last one from the cache, and answers INDETERMINATE when the slot moved on
// or its history was lost. The slot stays locked while the request runs,
// so a retry that overtakes its original on another connection waits for
// it.
func (c *srvConn) once(h *reqHeader) error {
	writes := h.op == opWrite || h.op == opXor
	if (!writes && h.op != opCAS && h.op != opFADD) || int(h.slot) >= rdma.SessionSlots || (h.flags&reqFlagForward != 0 && !writes) {
		return c.unsupported(h)
	}
	if h.flags&reqFlagForward != 0 && c.s.cfg.Forwarders != nil && !c.s.cfg.Forwarders(c.principal) {
		return c.reject(h, statusAccessDenied)
	}
	if c.sess == nil {
		// open marks it used, and the connection's end does again: use is
		// counted per connection, so requests share no counter.
		c.sess = c.s.sessions.open(*c.sessKey, tenantName(*c.sessKey, c.tenant), c.sessResume)
	}
	retry := h.flags&reqFlagRetry != 0
	// Only a RETRY is judged by its export's join mark: a first send
	// costs no second export lookup (pin makes the one that counts).
	var joined uint64
	if retry {
		if e := c.s.lookup(h.seg); e != nil && subtle.ConstantTimeCompare(e.key[:], h.key[:]) == 1 {
			joined = e.joined.Load()
		}
	}
	sl := &c.sess.slots[h.slot]
	sl.mu.Lock()
	switch sl.decideAt(h.seq, retry, joined) {
	case replay:
		defer sl.mu.Unlock()
		if err := c.discard(int(h.payloadLen)); err != nil {
			return err
		}
		return c.respond(h.id, sl.status, sl.flags, sl.value, nil, nil)
	case indeterminate:
		defer sl.mu.Unlock()
		return c.reject(h, statusIndeterminate)
	}
	// A WRITE whose payload is cut short returns an error without an
	// answer: nothing is cached, and a retry runs it again in full. A
	// forwarded op keeps the slot locked until its targets acknowledged
	// and it is answered (tookSlot).
	c.record, c.recSeq, c.tookSlot = sl, h.seq, false
	var err error
	if writes {
		err = c.write(h)
	} else {
		err = c.atomic(h)
	}
	c.record = nil
	if !c.tookSlot {
		sl.mu.Unlock()
	}
	return err
}

// unsupported skips the payload of an op this server does not know and
// answers statusUnsupported, so newer clients can probe older servers.
func (c *srvConn) unsupported(h *reqHeader) error { return c.reject(h, statusUnsupported) }

// reject skips the payload of a request that is not run and answers it
// with status st.
func (c *srvConn) reject(h *reqHeader, st uint16) error {
	if err := c.discard(int(h.payloadLen)); err != nil {
		return err
	}
	return c.respond(h.id, st, 0, 0, nil, nil)
}

// discard skips n payload bytes, flushing pending responses first if it
// has to wait for the socket.
func (c *srvConn) discard(n int) error {
	if c.rd.buffered() < n && c.npend > 0 {
		if err := c.flush(); err != nil {
			return err
		}
	}
	return c.rd.discard(n)
}

// pin checks the key, state and (for mutating ops) epoch of h's segment and
// pins it. The key comparison is constant-time. A segment that was fenced
// answers LEASE_EXPIRED to its own key, one that moved away (or is
// sealed for its move's switch-over) MOVED; any other key gets
// ACCESS_DENIED. A mutating op's pin is dropped with unpin(true).
func (c *srvConn) pin(h *reqHeader, mutating bool) (*export, uint16) {
	c.handover = 0
	e := c.s.lookup(h.seg)
	if e == nil || subtle.ConstantTimeCompare(e.key[:], h.key[:]) != 1 {
		if e == nil {
			if st, ok := c.s.fences.status(h.seg, h.key); ok {
				return nil, st
			}
		}
		return nil, statusAccessDenied
	}
	if !c.permits(e, mutating) {
		return nil, statusAccessDenied
	}
	st := e.acquire(mutating)
	if st == pinSealedRead {
		if !e.readableBy(c.principal) {
			e.unpin(false)
			st = statusMoved
		} else {
			st = statusOK
		}
	}
	if st == statusMoved {
		c.handover = e.handover.Load()
		return nil, st
	}
	if st != statusOK {
		if st == statusAccessDenied {
			if fst, ok := c.s.fences.status(h.seg, h.key); ok {
				st = fst // revoked by a Fence or MoveAway in progress
			}
		}
		return nil, st
	}
	if mutating && h.epoch < e.epoch.Load() {
		e.unpin(true)
		return nil, statusLeaseExpired
	}
	return e, statusOK
}

func (c *srvConn) read(h *reqHeader) error {
	e, st := c.pin(h, false)
	if st != statusOK {
		return c.respond(h.id, st, 0, 0, nil, nil)
	}
	if !e.inRange(h.off, h.length) {
		e.release()
		return c.respond(h.id, statusOutOfRange, 0, 0, nil, nil)
	}
	if e.fwd.Load() != nil || e.nUnsettled.Load() > 0 {
		return c.readSettled(h, e)
	}
	// The payload is sent straight from the mapping; e stays pinned until
	// the batch is flushed.
	return c.respond(h.id, statusOK, 0, 0, e.mem[h.off:h.off+uint64(h.length)], e)
}

// readSettled reads a segment that forwards its changes: once no op whose
// change the read overlaps is still on its way to the targets, it copies
// the bytes under the forwarding lock (no op applies meanwhile), so a read
// here never returns a change that a target may still miss and a failover
// then lose. The copy is sent at the next flush.
func (c *srvConn) readSettled(h *reqHeader, e *export) error {
	n := uint64(h.length)
	buf := getBuf(int(n))
	e.fwdMu.Lock()
	for e.overlapsUnsettled(h.off, n) {
		e.settled.Wait()
	}
	_, fault := copyGuarded(*buf, e.mem[h.off:h.off+n])
	e.fwdMu.Unlock()
	e.release()
	if fault {
		putBuf(buf)
		e.state.CompareAndSwap(stateLive, stateLost)
		c.log.Error("rdma/tcp: memory fault reading a segment; marked segment lost", "segment", e.seg, "offset", h.off, "length", n)
		return c.respond(h.id, statusSegmentLost, 0, 0, nil, nil)
	}
	c.copies = append(c.copies, buf)
	return c.respond(h.id, statusOK, 0, 0, *buf, nil)
}

// write stores a WRITE payload. Payload bytes that arrived in the same socket
// read as earlier headers are copied once from the read buffer; the rest is
// read from the socket straight into the mapping. A request that fails its
// checks still has its payload consumed (discarded), so the connection stays
// usable.
func (c *srvConn) write(h *reqHeader) error {
	n := int(h.payloadLen)
	if c.rd.buffered() < n {
		// Before the stream is announced: Revoke's interrupt must not be
		// overwritten by this deadline.
		c.arm()
	}
	e, st := c.pin(h, true)
	if st == statusOK && !e.inRange(h.off, h.length) {
		e.unpin(true)
		st = statusOutOfRange
	}
	if st == statusOK {
		// Announce the stream before re-checking the state; Revoke stores
		// the state before it looks for streaming connections.
		c.streaming.Store(e)
		if es := e.state.Load(); es != stateLive && es != stateSealed {
			c.streaming.Store(nil)
			e.unpin(true)
			st = statusAccessDenied
		}
	}
	if st != statusOK {
		if err := c.discard(n); err != nil {
			return err
		}
		return c.respond(h.id, st, 0, 0, nil, nil)
	}

	if h.op == opXor || h.flags&reqFlagForward != 0 || e.fwd.Load() != nil {
		return c.writeStaged(h, e)
	}
	dst := e.mem[h.off : h.off+uint64(n)]
	pre := c.rd.take(n)
	k, fault := copyGuarded(dst, pre)
	var err error
	switch {
	case fault:
		err = c.rd.discard(n - len(pre))
	case k < n:
		// The rest has to come from the socket; send what is ready first.
		if c.npend > 0 {
			err = c.flush()
		}
		if err == nil {
			fault, err = readGuarded(c.nc, dst[k:])
		}
	}
	c.streaming.Store(nil)
	if !fault {
		e.changed(h.off, uint64(n))
	}
	if fault {
		e.state.CompareAndSwap(stateLive, stateLost)
		c.log.Error("rdma/tcp: memory fault writing segment; marked lost", "segment", e.seg, "offset", h.off, "length", n)
	}
	e.unpin(true)
	if c.cut.Load() {
		return fmt.Errorf("segment %d was revoked while a %d-byte WRITE payload was streaming into it", e.seg, n)
	}
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read %d-byte WRITE payload: %w", n, err)
	}
	if fault {
		return c.respond(h.id, statusSegmentLost, 0, 0, nil, nil)
	}
	return c.respond(h.id, statusOK, 0, 0, nil, nil)
}

func (c *srvConn) atomic(h *reqHeader) error {
	e, st := c.pin(h, true)
	if st != statusOK {
		return c.respond(h.id, st, 0, 0, nil, nil)
	}
	if h.off%8 != 0 {
		e.unpin(true)
		return c.respond(h.id, statusUnaligned, 0, 0, nil, nil)
	}
	if !e.inRange(h.off, 8) {
		e.unpin(true)
		return c.respond(h.id, statusOutOfRange, 0, 0, nil, nil)
	}
	return c.mutate(h, e, nil, nil)
}

// respond queues one response; pinned, if not nil, is released after the
// batch holding payload has been written.
func (c *srvConn) respond(id uint64, status uint16, flags uint8, value uint64, payload []byte, pinned *export) error {
	c.status = status
	if status == statusMoved {
		value = c.handover // the token of a switch-over done, or 0
	}
	if c.record != nil {
		c.record.record(c.recSeq, status, flags, value)
		c.record = nil
	}
	hb := c.hdrs[c.npend*respHeaderSize : (c.npend+1)*respHeaderSize]
	encodeResponse(hb, &respHeader{id: id, status: status, flags: flags, payloadLen: uint32(len(payload)), value: value})
	c.iov = append(c.iov, hb)
	if len(payload) > 0 {
		c.iov = append(c.iov, payload)
	}
	if pinned != nil {
		c.pinned = append(c.pinned, pinned)
	}
	c.npend++
	c.pendBytes += len(payload)
	if c.npend >= len(c.hdrs)/respHeaderSize || c.pendBytes >= flushBytes {
		return c.flush()
	}
	return nil
}

// flush writes every pending response with one vectored write and unpins
// the segments their payloads came from.
func (c *srvConn) flush() error {
	if c.npend == 0 {
		return nil
	}
	c.nb = c.iov
	c.wmu.Lock()
	c.extendWriteDeadline()
	err := c.out.write(&c.nb)
	c.wmu.Unlock()
	c.nb = nil
	clear(c.iov)
	c.iov = c.iov[:0]
	c.unpin()
	for i, b := range c.copies {
		putBuf(b)
		c.copies[i] = nil
	}
	c.copies = c.copies[:0]
	c.lone.note(c.npend == 1)
	// Written only when it changes: at one busy connection the shared
	// word stays in every core's cache.
	if c.s.lastFlush.Load() != c {
		c.s.lastFlush.Store(c)
	}
	c.npend, c.pendBytes = 0, 0
	return err
}

// extendWriteDeadline moves the write deadline on; c.wmu is held. It moves
// only when half of it is used up: a timer update per flush would cost
// more than the flush of a small batch.
func (c *srvConn) extendWriteDeadline() {
	if wt := c.s.cfg.WriteTimeout; wt > 0 {
		if now := time.Now(); c.deadline.Sub(now) < wt/2 {
			c.deadline = now.Add(wt)
			c.nc.SetWriteDeadline(c.deadline)
		}
	}
}

// unpin releases the exports pinned by the pending batch.
func (c *srvConn) unpin() {
	for i, e := range c.pinned {
		e.release()
		c.pinned[i] = nil
	}
	c.pinned = c.pinned[:0]
}
