package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/farmem/farmem/rdma"
)

// Option configures Dial.
type Option func(*options)

type options struct {
	conns        int
	cred         []byte
	maxInflight  int
	writeTimeout time.Duration
	readBuffer   int
	busyPoll     time.Duration
	session      *rdma.Session
	tls          *tls.Config
}

func defaultOptions() options {
	return options{
		conns:        max(runtime.GOMAXPROCS(0), 2),
		maxInflight:  256,
		writeTimeout: 10 * time.Second,
		readBuffer:   64 << 10,
		busyPoll:     DefaultBusyPoll,
	}
}

// WithConns sets how many TCP connections the client opens to the server;
// ops are spread across them so several cores work on both ends.
// Default: max(GOMAXPROCS, 2). Values below 1 are treated as 1.
func WithConns(n int) Option { return func(o *options) { o.conns = max(n, 1) } }

// WithCredential sets the credential presented in the handshake (at most
// MaxCredential bytes). Default: empty.
func WithCredential(cred []byte) Option {
	return func(o *options) { o.cred = slices.Clone(cred) }
}

// WithMaxInflight sets how many ops one connection keeps in flight; further
// callers wait for a free slot (honouring their ctx). Default: 256.
// Range: 1..65536.
func WithMaxInflight(n int) Option {
	return func(o *options) { o.maxInflight = min(max(n, 1), 1<<16) }
}

// WithWriteTimeout bounds one vectored write of queued requests; when the
// server stops reading for longer, the connection is closed and its ops fail
// with ErrClosed. It also bounds how long a cancelled op whose request is
// being written keeps its caller waiting. As on the server, a stalled write
// is cut after between d/2 and d. Default: 10s; 0 disables.
func WithWriteTimeout(d time.Duration) Option { return func(o *options) { o.writeTimeout = d } }

// WithBusyPoll sets how long a caller waiting for a response busy-polls
// the socket before it parks in the network poller (see
// ServerConfig.BusyPoll). Default: DefaultBusyPoll (50µs); 0 or negative:
// off.
func WithBusyPoll(d time.Duration) Option { return func(o *options) { o.busyPoll = d } }

// WithSession sets the exactly-once session the client's handshakes
// present: ops posted with a Ticket of this session (rdma.Op.Once) may be
// posted again on another Client dialed with it, and are applied once. Use
// one Session per server address, for every Client dialed to it. Default:
// a fresh session for each Client, whose tickets then work on it alone.
func WithSession(s *rdma.Session) Option { return func(o *options) { o.session = s } }

// WithTLS makes every connection run a TLS handshake with cfg before its
// hello, against a server whose ServerConfig.TLS is set: cfg must say how
// to verify the server (RootCAs and ServerName, a name its certificate
// holds). Busy polling (WithBusyPoll) works under it. Default: nil
// (plaintext).
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.tls = cfg } }

// Client is a connection to one server's exported memory over several TCP
// connections. It implements rdma.Conn and is safe for concurrent use; every
// call may run in parallel with every other.
//
// A Client does not redial: a connection that fails is skipped from then on,
// and once all have failed every call returns an error matching
// rdma.ErrClosed; dial a new Client then.
//
// Buffers: Read writes into p only while the call runs (a response that
// arrives after a cancelled Read returned is discarded, never copied into
// p); Write reads p only while the call runs. Neither retains p.
type Client struct {
	addr      string
	session   *rdma.Session
	conns     []*cliConn
	closeOnce sync.Once
	// fwdBytes is the payload bytes of the ops forwarded over the Client
	// (Server.Forward) that wait on the peer (fwdTarget.begin).
	fwdBytes atomic.Int64
}

// answers returns how many responses the Client's connections have read:
// while it moves, the peer is answering.
func (cl *Client) answers() uint64 {
	var n uint64
	for _, c := range cl.conns {
		n += c.answered.Load()
	}
	return n
}

var _ rdma.Conn = (*Client)(nil)

// Dial connects to the data-plane server at addr (host:port) with the
// options' number of connections and performs the handshake on each.
// ctx bounds connecting and the handshake.
func Dial(ctx context.Context, addr string, opts ...Option) (*Client, error) {
	o := defaultOptions()
	for _, opt := range opts {
		opt(&o)
	}
	if len(o.cred) > MaxCredential {
		return nil, fmt.Errorf("rdma/tcp: dial %s: credential is %d bytes, the limit is %d", addr, len(o.cred), MaxCredential)
	}
	if o.session == nil {
		o.session = rdma.NewSession()
	}
	cl := &Client{addr: addr, session: o.session}
	for i := range o.conns {
		nc, err := dialConn(ctx, addr, o.cred, o.session, o.tls)
		if err != nil {
			cl.Close()
			return nil, err
		}
		cl.conns = append(cl.conns, newCliConn(cl, i, nc, &o))
	}
	return cl, nil
}

// dialConn opens one connection, over TLS with tc when set, and performs
// the handshake, opening sess or resuming it if a server accepted it
// before.
func dialConn(ctx context.Context, addr string, cred []byte, sess *rdma.Session, tc *tls.Config) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("rdma/tcp: dial %s: %w%s", addr, err, resetHint(err))
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	nc.SetDeadline(deadline)
	raw := nc // the socket, below TLS: what a cancelled ctx interrupts
	stop := context.AfterFunc(ctx, func() { raw.SetDeadline(time.Now()) })
	defer stop()
	if tc != nil {
		tlsConn := tls.Client(newPolledConn(nc), tc)
		if err := tlsConn.Handshake(); err != nil {
			nc.Close()
			return nil, fmt.Errorf("rdma/tcp: TLS handshake with %s (does it serve TLS, with a certificate the client's CA and server name accept?): %w%s", addr, errors.Join(ctx.Err(), err), resetHint(err))
		}
		nc = tlsConn
	}
	// A server over its limits answers "busy" and resets the connection
	// without reading the hello: the write may fail, and the reply, read
	// anyway, says why.
	_, werr := nc.Write(appendHello(nil, hello{version: Version, cred: cred, session: sess.ID(), resume: sess.Opened()}))
	var b [replySize]byte
	if _, err := io.ReadFull(nc, b[:]); err != nil {
		nc.Close()
		if werr != nil {
			return nil, fmt.Errorf("rdma/tcp: handshake with %s: write hello: %w%s", addr, errors.Join(ctx.Err(), werr), resetHint(werr))
		}
		return nil, fmt.Errorf("rdma/tcp: handshake with %s: read reply (is this a farmem data-plane port?): %w", addr, errors.Join(ctx.Err(), err))
	}
	r, err := decodeReply(b[:])
	if err == nil {
		err = replyError(addr, r)
	} else {
		err = fmt.Errorf("rdma/tcp: handshake with %s: %w", addr, err)
	}
	if err == nil && werr != nil {
		err = fmt.Errorf("rdma/tcp: handshake with %s: write hello: %w", addr, werr)
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	if r.version != Version {
		nc.Close()
		return nil, fmt.Errorf("rdma/tcp: handshake with %s: server accepted protocol version %d, this client speaks %d: %w", addr, r.version, Version, rdma.ErrProtocol)
	}
	if !stop() {
		nc.Close()
		return nil, ctx.Err()
	}
	sess.MarkOpened()
	if err := nc.SetDeadline(time.Time{}); err != nil {
		nc.Close()
		return nil, fmt.Errorf("rdma/tcp: handshake with %s: %w", addr, err)
	}
	return nc, nil
}

// resetHint explains a connection reset while dialing: a server over its
// admission limits sends BUSY and resets at once, and the reset can
// overtake the connect or the hello.
func resetHint(err error) string {
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		return ""
	}
	return " (the server resets new connections while at its connection limit or handshake limits; retry later)"
}

// Addr returns the server address the client was dialed with.
func (cl *Client) Addr() string { return cl.addr }

// spreadThreshold is the number of ops in flight on a connection below which
// new ops stay on it. Packing ops onto one connection lets each writev and
// read(2) carry many of them (per-syscall cost dominates small ops); but a
// connection is served by one goroutine at each end, so past this depth
// the next connection puts another core of the server, and of the client,
// to work. At 16 reads of 4 KiB in flight from memctl to a poold in
// another process, 8 (two connections of 8) served about 1.25 times the
// reads of 16 (one connection), in plaintext and over TLS; with client and
// server in one process, where the two ends share the same processors and
// fewer syscalls is all that counts, one connection served about 1.2
// times more.
const spreadThreshold = 8

// conn picks the first live connection with fewer than spreadThreshold ops
// in flight, or else the least loaded live one.
func (cl *Client) conn() (*cliConn, error) {
	var best *cliConn
	bestLoad := 0
	for _, c := range cl.conns {
		if c.closed.Load() {
			continue
		}
		load := c.inflight()
		if load < spreadThreshold {
			return c, nil
		}
		if best == nil || load < bestLoad {
			best, bestLoad = c, load
		}
	}
	if best == nil {
		return nil, cl.conns[0].err
	}
	return best, nil
}

// check validates an op before it is sent.
func check(k rdma.OpKind, r rdma.Region, off int64, n int) error {
	if off < 0 || int64(n) > math.MaxInt64-off {
		return fmt.Errorf("rdma/tcp: %s %s offset %d length %d: %w", k, r, off, n, rdma.ErrOutOfRange)
	}
	if isAtomic(k) && off%8 != 0 {
		return fmt.Errorf("rdma/tcp: %s %s offset %d: %w", k, r, off, rdma.ErrUnaligned)
	}
	return nil
}

// isAtomic reports whether k is a one-word atomic.
func isAtomic(k rdma.OpKind) bool { return k == rdma.OpCompareAndSwap || k == rdma.OpFetchAdd }

// carriesPayload reports whether k's Buf is sent as the request payload.
func carriesPayload(k rdma.OpKind) bool { return k == rdma.OpWrite || k == rdma.OpXor }

// run sends one op and waits for it. nil means o's results are valid.
func (cl *Client) run(ctx context.Context, o *op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := cl.conn()
	if err != nil {
		return err
	}
	if _, err := c.register(ctx, o, true); err != nil {
		return err
	}
	c.enqueue(o)
	return c.wait(ctx, o)
}

// Read fills p with the remote bytes [off, off+len(p)) of r. Reads larger
// than MaxPayload are split into several ops sent together. If ctx ends
// first, Read returns ctx.Err(); if the response is already streaming into p
// at that moment, Read waits for it (it is on the wire) and returns its
// result, so p is never written after Read returns.
func (cl *Client) Read(ctx context.Context, r rdma.Region, off int64, p []byte) error {
	return cl.transfer(ctx, rdma.OpRead, r, off, p)
}

// Write stores p at the remote bytes [off, off+len(p)) of r. Writes larger
// than MaxPayload are split into several ops sent together (they are not
// atomic as a whole). If ctx ends before the request was handed to the
// socket it is never sent; if it ends while p is being written to the
// socket, Write waits for that write (bounded by WithWriteTimeout), so p is
// never read after Write returns. Whether a cancelled Write reached remote
// memory is unknown.
func (cl *Client) Write(ctx context.Context, r rdma.Region, off int64, p []byte) error {
	return cl.transfer(ctx, rdma.OpWrite, r, off, p)
}

// Xor XORs p into the remote bytes [off, off+len(p)) of r (the parity
// update of an erasure-coded segment; XORs commute). Buffers and
// cancellation are as for Write; XORs larger than MaxPayload are split
// into several ops, each XORed on its own. Whether a cancelled Xor reached
// remote memory is unknown, and an Xor applied twice cancels itself out:
// post it with an rdma.Op.Once ticket (Do) when it may be retried.
func (cl *Client) Xor(ctx context.Context, r rdma.Region, off int64, p []byte) error {
	return cl.transfer(ctx, rdma.OpXor, r, off, p)
}

// transfer runs one READ, WRITE or XOR, split into several ops when larger
// than MaxPayload.
func (cl *Client) transfer(ctx context.Context, kind rdma.OpKind, r rdma.Region, off int64, p []byte) error {
	if err := check(kind, r, off, len(p)); err != nil {
		return err
	}
	if len(p) > MaxPayload {
		return cl.Do(ctx, &rdma.Op{Kind: kind, Region: r, Offset: off, Buf: p})
	}
	o := getOp()
	o.kind, o.region, o.off, o.buf = kind, r, uint64(off), p
	err := cl.run(ctx, o)
	if err == nil {
		err = o.err
	}
	o.release()
	return err
}

// CompareAndSwap64 atomically replaces the word at off (a multiple of 8)
// with new if it equals old, and returns the word's previous value.
func (cl *Client) CompareAndSwap64(ctx context.Context, r rdma.Region, off int64, old, new uint64) (uint64, bool, error) {
	if err := check(rdma.OpCompareAndSwap, r, off, 8); err != nil {
		return 0, false, err
	}
	o := getOp()
	o.kind, o.region, o.off, o.arg0, o.arg1 = rdma.OpCompareAndSwap, r, uint64(off), old, new
	err := cl.run(ctx, o)
	if err == nil {
		err = o.err
	}
	prev, swapped := o.prev, o.swapped
	o.release()
	if err != nil {
		return 0, false, err
	}
	return prev, swapped, nil
}

// FetchAdd64 atomically adds delta to the word at off (a multiple of 8) and
// returns its previous value.
func (cl *Client) FetchAdd64(ctx context.Context, r rdma.Region, off int64, delta uint64) (uint64, error) {
	if err := check(rdma.OpFetchAdd, r, off, 8); err != nil {
		return 0, err
	}
	o := getOp()
	o.kind, o.region, o.off, o.arg0 = rdma.OpFetchAdd, r, uint64(off), delta
	err := cl.run(ctx, o)
	if err == nil {
		err = o.err
	}
	prev := o.prev
	o.release()
	if err != nil {
		return 0, err
	}
	return prev, nil
}

// part is one wire op of a Do call and the rdma.Op it belongs to.
type part struct {
	o     *op
	owner *rdma.Op
}

// Do posts all ops on one connection, written together with as few vectored
// writes as the in-flight limit allows, and waits once for all of them. Each
// Op gets its own result and Err; Do returns the first non-nil Op.Err in
// argument order. A READ or WRITE larger than MaxPayload becomes several wire
// ops; its Err is the first of theirs. If ctx ends, unfinished ops get
// ctx.Err() with the same buffer guarantees as Read and Write.
func (cl *Client) Do(ctx context.Context, ops ...*rdma.Op) error {
	if len(ops) == 1 && ops[0] != nil && oneFrame(ops[0]) {
		return cl.one(ctx, ops[0])
	}
	parts := make([]part, 0, len(ops))
	for _, u := range ops {
		if u == nil {
			continue
		}
		u.Err, u.Prev, u.Swapped = nil, 0, false
		if u.Once != nil {
			if u.Err = cl.checkOnce(u); u.Err != nil {
				continue
			}
			o := getOp()
			o.kind, o.region, o.off, o.buf = u.Kind, u.Region, uint64(u.Offset), u.Buf
			o.arg0, o.arg1 = opArgs(u)
			o.once, o.retry = u.Once, u.Once.Post()
			parts = append(parts, part{o, u})
			continue
		}
		switch u.Kind {
		case rdma.OpRead, rdma.OpWrite, rdma.OpXor:
			if u.Err = check(u.Kind, u.Region, u.Offset, len(u.Buf)); u.Err != nil {
				continue
			}
			for start := 0; ; start += MaxPayload {
				end := min(start+MaxPayload, len(u.Buf))
				o := getOp()
				o.kind, o.region, o.off, o.buf = u.Kind, u.Region, uint64(u.Offset)+uint64(start), u.Buf[start:end]
				parts = append(parts, part{o, u})
				if end == len(u.Buf) {
					break
				}
			}
		case rdma.OpCompareAndSwap, rdma.OpFetchAdd:
			if u.Err = check(u.Kind, u.Region, u.Offset, 8); u.Err != nil {
				continue
			}
			o := getOp()
			o.kind, o.region, o.off = u.Kind, u.Region, uint64(u.Offset)
			o.arg0, o.arg1 = opArgs(u)
			parts = append(parts, part{o, u})
		default:
			u.Err = &rdma.NotSupportedError{Feature: "tcp " + u.Kind.String(), Reason: "unknown op kind; use OpRead, OpWrite, OpXor, OpCompareAndSwap or OpFetchAdd"}
		}
	}

	posted := cl.post(ctx, parts)
	for i, p := range parts {
		var err error
		if i < posted {
			if err = cl.connOf(p.o).wait(ctx, p.o); err == nil {
				err = p.o.err
			}
		} else {
			err = p.o.err // set by post: never sent
		}
		if err != nil && p.owner.Err == nil {
			p.owner.Err = err
		}
		if isAtomic(p.owner.Kind) {
			p.owner.Prev, p.owner.Swapped = p.o.prev, p.o.swapped
		}
		p.o.release()
	}
	for _, u := range ops {
		if u != nil && u.Err != nil {
			return u.Err
		}
	}
	return nil
}

// oneFrame reports whether u travels as one wire op.
func oneFrame(u *rdma.Op) bool {
	switch u.Kind {
	case rdma.OpRead, rdma.OpWrite, rdma.OpXor:
		return len(u.Buf) <= MaxPayload
	case rdma.OpCompareAndSwap, rdma.OpFetchAdd:
		return true
	}
	return false
}

// one runs a lone op of one wire frame as Write and FetchAdd64 do, without
// setting up a batch: what a Do of one write or atomic with a ticket costs.
func (cl *Client) one(ctx context.Context, u *rdma.Op) error {
	u.Err, u.Prev, u.Swapped = nil, 0, false
	n := len(u.Buf)
	if isAtomic(u.Kind) {
		n = 8
	}
	if u.Once != nil {
		u.Err = cl.checkOnce(u)
	} else {
		u.Err = check(u.Kind, u.Region, u.Offset, n)
	}
	if u.Err != nil {
		return u.Err
	}
	o := getOp()
	o.kind, o.region, o.off, o.buf = u.Kind, u.Region, uint64(u.Offset), u.Buf
	o.arg0, o.arg1 = opArgs(u)
	if u.Once != nil {
		o.once, o.retry = u.Once, u.Once.Post()
	}
	err := cl.run(ctx, o)
	if err == nil {
		err = o.err
	}
	if err == nil {
		u.Prev, u.Swapped = o.prev, o.swapped
	}
	o.release()
	u.Err = err
	return err
}

// checkOnce validates an exactly-once op: a WRITE or XOR of at most one
// frame or an atomic, with a ticket of the client's session.
func (cl *Client) checkOnce(u *rdma.Op) error {
	n := len(u.Buf)
	switch u.Kind {
	case rdma.OpWrite, rdma.OpXor:
		if n > MaxPayload {
			return fmt.Errorf("rdma/tcp: exactly-once %s of %d bytes at %d: one ticket covers at most MaxPayload (%d) bytes; split it: %w", u.Kind, n, u.Offset, MaxPayload, rdma.ErrOutOfRange)
		}
	case rdma.OpCompareAndSwap, rdma.OpFetchAdd:
		n = 8
	default:
		return &rdma.NotSupportedError{Feature: "exactly-once " + u.Kind.String(), Reason: "only WRITE, XOR, CAS and FADD take a ticket; a READ can simply be retried"}
	}
	if err := check(u.Kind, u.Region, u.Offset, n); err != nil {
		return err
	}
	if u.Once.Session() != cl.session {
		if u.Once.Posted() { // it may have run on the ticket's own session
			return fmt.Errorf("rdma/tcp: %s %s: the ticket was posted on another session than this client's; not sent again: %w", u.Kind, u.Region, rdma.ErrIndeterminate)
		}
		return &rdma.NotSupportedError{Feature: "a ticket of another session", Reason: "dial the client WithSession(ticket.Session())"}
	}
	return nil
}

// opArgs returns an atomic op's two wire arguments: Old and New for
// OpCompareAndSwap, Delta for OpFetchAdd.
func opArgs(u *rdma.Op) (uint64, uint64) {
	switch u.Kind {
	case rdma.OpCompareAndSwap:
		return u.Old, u.New
	case rdma.OpFetchAdd:
		return u.Delta, 0
	}
	return 0, 0
}

// connOf returns the connection post put the op on.
func (cl *Client) connOf(o *op) *cliConn { return o.conn }

// post registers and queues parts on one connection in as few batches as
// the free slots allow. It returns how many parts were posted, in order;
// the others have o.err set.
func (cl *Client) post(ctx context.Context, parts []part) int {
	if len(parts) == 0 {
		return 0
	}
	fail := func(from int, err error) int {
		for _, p := range parts[from:] {
			p.o.err = err
		}
		return from
	}
	if err := ctx.Err(); err != nil {
		return fail(0, err)
	}
	c, err := cl.conn()
	if err != nil {
		return fail(0, err)
	}
	batch := make([]*op, 0, min(len(parts), len(c.slots)))
	i := 0
	for i < len(parts) {
		batch = batch[:0]
		for i < len(parts) {
			o := parts[i].o
			o.conn = c
			// Block only for the first op of a batch: everything registered
			// before must be queued first, or its slots never come back.
			ok, err := c.register(ctx, o, len(batch) == 0)
			if err != nil {
				if len(batch) > 0 {
					c.enqueue(batch...)
				}
				return fail(i, err)
			}
			if !ok {
				break
			}
			batch = append(batch, o)
			i++
		}
		c.enqueue(batch...)
	}
	return i
}

// Close closes every connection; ops in flight fail with ErrClosed. Close
// is idempotent and waits for the client's goroutines.
func (cl *Client) Close() error {
	cl.closeOnce.Do(func() {
		why := fmt.Errorf("rdma/tcp: client for %s closed: %w", cl.addr, rdma.ErrClosed)
		for i := len(cl.conns) - 1; i >= 0; i-- {
			cl.conns[i].close(why)
		}
	})
	return nil
}

// Transport is the tcp rdma.Transport: Dial opens a Client with the
// transport's options plus the given credential. It is immutable and safe for
// concurrent use.
type Transport struct {
	opts []Option
}

var _ rdma.Transport = (*Transport)(nil)

// NewTransport returns a Transport that dials with opts.
func NewTransport(opts ...Option) *Transport {
	return &Transport{opts: slices.Clone(opts)}
}

// Name returns "tcp".
func (t *Transport) Name() string { return "tcp" }

// Dial implements rdma.Transport.
func (t *Transport) Dial(ctx context.Context, addr string, cred []byte) (rdma.Conn, error) {
	opts := append(slices.Clip(t.opts), WithCredential(cred))
	c, err := Dial(ctx, addr, opts...)
	if err != nil {
		return nil, err
	}
	return c, nil
}
