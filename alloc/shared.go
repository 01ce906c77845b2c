package alloc

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/coherence"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/dialer"
	"github.com/farmem/farmem/rdma/tcp"
)

// AttachOption configures Attach. Options are immutable values, safe to
// share.
type AttachOption func(*attachOptions)

type attachOptions struct {
	shared *sharedOptions // nil: a plain (not coherent) attachment
}

// Shared makes Attach join the segment as a shared segment: the returned
// Segment's ReadAt, WriteAt and atomics go through a cache that the
// coherence protocol keeps coherent with every other shared attachment, on
// any host, and its Shared method gives the SharedSegment (Sync, Stats,
// Detach). The segment must be on the rdma tier. Default: a plain
// attachment, whose accesses go to the home one-sided, uncached.
func Shared(opts ...SharedOption) AttachOption {
	return func(o *attachOptions) {
		so := sharedOptions{pageSize: coherence.DefaultConfig().PageSize}
		for _, opt := range opts {
			opt(&so)
		}
		o.shared = &so
	}
}

// SharedOption configures Shared. Options are immutable values, safe to
// share.
type SharedOption func(*sharedOptions)

type sharedOptions struct {
	pageSize int
}

// SharedPageSize sets the unit of coherence: a power of two from 512 bytes
// to 1 MiB. Every attachment of a segment must use the same page size (the
// home refuses another). Default: 4096.
func SharedPageSize(n int) SharedOption { return func(o *sharedOptions) { o.pageSize = n } }

// SharedSegment is one attachment of a named rdma-tier segment that
// several processes on several hosts read and write at once, kept coherent
// by the protocol of package coherence: pages are cached here under read
// leases, a write takes exclusive ownership of its page (the home
// invalidates the other copies first), and modified pages are written back
// on Sync, on downgrade, before their lease runs out and on Detach.
//
// Guarantee: every single-page ReadAt, WriteAt and atomic is linearizable.
// An access spanning pages is linearizable per page: a ReadAt spanning
// pages may observe a concurrent multi-page WriteAt torn between pages
// (never within one). When this process dies, writes not yet written back
// (Sync) are lost; when the home's daemon restarts or dies, the attachment
// fails with ErrSegmentLost and writes not yet written back are lost. A
// session that ends and is replaced (this client's with its daemon, or
// its daemon's with the home, after a network cut) withdraws the
// data-plane credential the attachment presents; the attachment then asks
// the daemon for the one it holds now and goes on.
//
// A SharedSegment is safe for concurrent use. ReadAt and WriteAt follow
// io.ReaderAt and io.WriterAt and retain no buffer. Client.Close detaches
// it (writing modified pages back) if Detach was not called.
type SharedSegment struct {
	info   *poolv1.Segment
	sh     *coherence.Sharer
	link   *sharedLink
	closed atomic.Bool
}

// attachShared joins the segment info describes (Attach with Shared), which
// must be on the rdma tier (allocate it with WithName and
// WithTier(TierRDMA)), as a shared segment. Processes on the segment's own
// host attach it the same way and take part in the directory like any
// other sharer (over loopback).
func (c *Client) attachShared(ctx context.Context, info *poolv1.Segment, o sharedOptions) (*Segment, error) {
	name := info.Name
	cfg := coherence.DefaultConfig()
	cfg.PageSize = o.pageSize
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("attach %q shared: %w", name, err)
	}
	if info.State == poolv1.SegmentState_SEGMENT_STATE_LOST {
		return nil, fmt.Errorf("attach %q shared: segment %d: %w", name, info.Id, ErrSegmentLost)
	}
	if info.Tier != poolv1.Tier_TIER_RDMA {
		return nil, fmt.Errorf("attach %q shared: the segment is on the %s tier; shared segments live on the rdma tier (allocate with alloc.WithTier(alloc.TierRDMA)): %w",
			name, tierFromProto(info.Tier), ErrNotSupported)
	}
	r, err := newRemote(c, info)
	if err != nil {
		return nil, err
	}
	link, err := dialShared(ctx, info.DataAddr, r.plane.Load().region, uint32(cfg.PageSize), info.DataCredential,
		c.linkDialer(info.DataAddr, r.plane.Load().tls), c.sharedCredential(info.Id))
	if err != nil {
		return nil, fmt.Errorf("attach %q shared: %w", name, err)
	}
	sh, err := coherence.NewSharer(cfg, info.Size, link, nil)
	if err != nil {
		link.close()
		return nil, fmt.Errorf("attach %q shared: %w", name, err)
	}
	sh.SetOpTimeout(c.opts.opTimeout)
	ss := &SharedSegment{info: info, sh: sh, link: link}
	seg := c.newSegment(info, sharedBackend{ss})
	if err := c.register(seg); err != nil {
		ss.abandon()
		return nil, err
	}
	return seg, nil
}

// sharedLink carries coherence messages as the data plane's messages
// (rdma.Conn.Message, the MSG opcode of rdma/tcp) on three connections of
// whichever transport rdma/dialer picks, as the home may hold a request's
// connection: the long poll on one, ReadReq and WriteReq (which the home
// answers with the grant once the invalidations are acknowledged) on
// another, and the acknowledgements, write-backs and releases, which the
// home answers at once, on a third, so that they never queue behind a
// held request. A dial the home refuses (the credential was withdrawn:
// this client's session with its daemon, or its daemon's with the home,
// ended and was replaced) asks the daemon for the segment's credential
// now and dials once more with it; the refusals go on being answered so
// for renewGrace before they end the attachment, and a daemon that
// refuses to hand out a credential (the segment is no longer this
// client's) ends it at once.
type sharedLink struct {
	addr     string
	dial     func(ctx context.Context, cred []byte) (rdma.Conn, error)
	renew    func(context.Context) ([]byte, error) // the daemon's credential for the segment now
	region   rdma.Region
	pageSize uint32
	pollBuf  []byte // the poll's answers; one poller at a time

	mu   sync.Mutex
	cred []byte
	// refusedSince is when the home began refusing what the daemon hands
	// out (zero: it does not); past renewGrace of that a refusal ends the
	// attachment.
	refusedSince time.Time
	conns        [numLinkConns]rdma.Conn // nil after a failure: redialed on next use
	closed       bool
}

// renewGrace is how long a shared attachment asks its daemon again for a
// credential while the home refuses what the daemon hands out: its
// session at the home may have ended without its knowing yet (it learns
// within a keepalive, or at its next call there) or not be back yet
// after a network cut, and this client's own session may have ended
// without its knowing yet. A refusal episode ends when a dial is
// accepted or does not reach the home.
const renewGrace = 30 * time.Second

// The connections of a sharedLink.
const (
	connCalls = iota // InvAck, WriteBack, Release: answered at once
	connReqs         // ReadReq, WriteReq: may be held until the grant
	connPoll         // the long poll
	numLinkConns
)

var _ coherence.Link = (*sharedLink)(nil)

// linkDialer dials one connection of a shared segment's link to the home
// at addr (through WithDataAddr's mapping), presenting a credential: one
// tcp connection (not a pool, since the home may hold it), verified with
// tc when the home serves TLS.
func (c *Client) linkDialer(addr string, tc *tls.Config) func(context.Context, []byte) (rdma.Conn, error) {
	opts := append(tlsOption(tc), tcp.WithConns(1), tcp.WithBusyPoll(c.opts.busyPoll))
	if c.opts.dataAddr != nil {
		addr = c.opts.dataAddr(addr)
	}
	return func(ctx context.Context, cred []byte) (rdma.Conn, error) {
		conn, _, err := dialer.Dial(ctx, addr, cred, opts...)
		return conn, err
	}
}

// sharedCredential asks the daemon for this client's data-plane
// credential for segment id now (Stat hands out the caller's own: a new
// session's, or one the home delegated anew).
func (c *Client) sharedCredential(id uint64) func(context.Context) ([]byte, error) {
	return func(ctx context.Context) ([]byte, error) {
		info, err := c.stat(ctx, &poolv1.StatRequest{Id: id})
		if err != nil {
			return nil, err
		}
		return info.DataCredential, nil
	}
}

func dialShared(ctx context.Context, addr string, r rdma.Region, pageSize uint32, cred []byte,
	dial func(context.Context, []byte) (rdma.Conn, error), renew func(context.Context) ([]byte, error)) (*sharedLink, error) {
	l := &sharedLink{addr: addr, dial: dial, renew: renew, cred: cred, region: r, pageSize: pageSize, pollBuf: make([]byte, 1<<20)}
	for which := range numLinkConns {
		if _, err := l.conn(ctx, which); err != nil {
			l.close()
			return nil, err
		}
	}
	return l, nil
}

// conn returns connection which, dialing it if a failure dropped it (the
// home's daemon restarted, say), with the daemon's credential now if the
// home refuses the one the link holds. It dials and asks the daemon
// without l.mu, so that the other connections' calls (write-backs before
// a lease runs out) do not wait behind a slow dial.
func (l *sharedLink) conn(ctx context.Context, which int) (rdma.Conn, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, fmt.Errorf("shared segment link to %s: %w", l.addr, rdma.ErrClosed)
	}
	if c := l.conns[which]; c != nil {
		l.mu.Unlock()
		return c, nil
	}
	start := l.cred
	cred := start
	l.mu.Unlock()

	c, err := l.dial(ctx, cred)
	if errors.Is(err, rdma.ErrAccessDenied) {
		fresh, rerr := l.renew(ctx)
		switch {
		case errors.Is(rerr, ErrUnavailable) || errors.Is(rerr, context.DeadlineExceeded) || errors.Is(rerr, context.Canceled) || ctx.Err() != nil:
			// The daemon was not reached, or did not answer in time (a
			// busy host, a peer session still coming back after a
			// network cut): not the end of the attachment, which asks
			// again on its next call.
			return nil, fmt.Errorf("shared segment link to %s: the home refused the credential, and the daemon did not answer with the one it holds now: %w", l.addr, cmp.Or(rerr, ctx.Err()))
		case rerr == nil && len(fresh) > 0 && !bytes.Equal(fresh, cred):
			cred = fresh
			c, err = l.dial(ctx, fresh)
		case rerr != nil && !errors.Is(rerr, ErrLeaseExpired):
			// The daemon refuses: the segment is no longer this
			// client's (freed, detached, lost).
			return nil, fmt.Errorf("%w (the daemon, asked for a new credential: %v)", err, rerr)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if bytes.Equal(l.cred, start) { // not renewed by another call meanwhile
		l.cred = cred
	}
	if !errors.Is(err, rdma.ErrAccessDenied) && ctx.Err() == nil {
		// Reached and accepted, or not reached: the refusals (if any)
		// are over. A call whose own deadline cut the dial says nothing.
		l.refusedSince = time.Time{}
	}
	if err != nil {
		if errors.Is(err, rdma.ErrAccessDenied) {
			// The daemon hands out no other credential (it may not have
			// seen its session at the home end yet, or has none there
			// yet), or hands out one the home refuses too, or this
			// client's own session ended: asked again until renewGrace.
			now := time.Now()
			if l.refusedSince.IsZero() {
				l.refusedSince = now
			}
			if now.Sub(l.refusedSince) < renewGrace {
				return nil, fmt.Errorf("shared segment link to %s: the home refused the credential the daemon holds now; asking again: %v", l.addr, err)
			}
		}
		return nil, err
	}
	if l.closed {
		c.Close()
		return nil, fmt.Errorf("shared segment link to %s: %w", l.addr, rdma.ErrClosed)
	}
	if old := l.conns[which]; old != nil { // another call dialed meanwhile
		c.Close()
		return old, nil
	}
	l.conns[which] = c
	return c, nil
}

// drop forgets a failed connection.
func (l *sharedLink) drop(c rdma.Conn) {
	l.mu.Lock()
	for i, cc := range l.conns {
		if cc == c {
			l.conns[i] = nil
		}
	}
	l.mu.Unlock()
	c.Close()
}

// linkErr makes the data plane's refusals that end the attachment (the
// segment was freed, revoked, or its memory is gone; the home refused
// every credential for renewGrace; the home refused a coherence message:
// this client speaks as another's sharer id, or as more than a home keeps
// per client) coherence's final ErrSegmentLost.
func linkErr(err error) error {
	if errors.Is(err, rdma.ErrSegmentLost) || errors.Is(err, rdma.ErrAccessDenied) || errors.Is(err, rdma.ErrLeaseExpired) {
		return fmt.Errorf("%w (%w)", coherence.ErrSegmentLost, err)
	}
	return err
}

// one sends msgs (a request, then any acks riding with it) on connection
// which and decodes the answer into buf.
func (l *sharedLink) one(ctx context.Context, which int, msgs []coherence.Message, buf []byte) ([]coherence.Message, error) {
	msgs[0].PageSize = l.pageSize
	c, err := l.conn(ctx, which)
	if err != nil {
		return nil, linkErr(err)
	}
	n, err := c.Message(ctx, l.region, coherence.AppendBatch(nil, msgs), buf)
	if err != nil {
		if errors.Is(err, rdma.ErrClosed) {
			l.drop(c)
		}
		return nil, linkErr(err)
	}
	return coherence.DecodeBatch(buf[:n])
}

// Call implements coherence.Link.
func (l *sharedLink) Call(ctx context.Context, m coherence.Message) (coherence.Message, error) {
	which := connCalls
	if m.Kind == coherence.ReadReq || m.Kind == coherence.WriteReq {
		which = connReqs
	}
	msgs, err := l.one(ctx, which, []coherence.Message{m}, make([]byte, 4+2*(72+int(l.pageSize))))
	if err != nil {
		return coherence.Message{}, err
	}
	if len(msgs) != 1 {
		return coherence.Message{}, fmt.Errorf("alloc: the home answered %s with %d messages, want 1: %w", m.Kind, len(msgs), coherence.ErrProtocol)
	}
	return msgs[0], nil
}

// Poll implements coherence.Link.
func (l *sharedLink) Poll(ctx context.Context, id coherence.SharerID, wait time.Duration, acks []coherence.Message) ([]coherence.Message, error) {
	return l.one(ctx, connPoll, append([]coherence.Message{{Kind: coherence.Poll, From: id, Lease: wait}}, acks...), l.pollBuf)
}

func (l *sharedLink) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	for _, c := range l.conns {
		if c != nil {
			c.Close()
		}
	}
}

// Shared returns the segment's shared attachment (Sync, Stats, Detach), or
// nil when it was not attached with Shared.
func (s *Segment) Shared() *SharedSegment {
	if b, ok := s.base().(sharedBackend); ok {
		return b.SharedSegment
	}
	return nil
}

// sharedBackend is a shared attachment as its Segment's backend: the
// Segment's calls go to the attachment's cache, and retiring the Segment
// detaches it (its modified pages written back).
type sharedBackend struct{ *SharedSegment }

var _ backend = sharedBackend{}

func (b sharedBackend) readAt(p []byte, off int64) (int, error)  { return b.ReadAt(p, off) }
func (b sharedBackend) writeAt(p []byte, off int64) (int, error) { return b.WriteAt(p, off) }
func (b sharedBackend) load64(off int64) (uint64, error)         { return b.Load64(off) }
func (b sharedBackend) store64(off int64, v uint64) error        { return b.Store64(off, v) }
func (b sharedBackend) compareAndSwap64(off int64, old, new uint64) (bool, error) {
	return b.CompareAndSwap64(off, old, new)
}
func (b sharedBackend) add64(off int64, delta uint64) (uint64, error) { return b.Add64(off, delta) }
func (b sharedBackend) bytes() []byte                                 { return nil }
func (b sharedBackend) retire(ctx context.Context) error              { return b.Detach(ctx) }

// ID is the segment's id on its home.
func (s *SharedSegment) ID() uint64 { return s.info.Id }

// Name is the segment's name.
func (s *SharedSegment) Name() string { return s.info.Name }

// Size is the segment's size in bytes.
func (s *SharedSegment) Size() int64 { return s.info.Size }

// Node names the segment's home.
func (s *SharedSegment) Node() string { return s.info.Node }

// Stats counts this attachment's cache hits, misses, invalidations
// received, write-backs and waits for a grant.
func (s *SharedSegment) Stats() coherence.SharerStats { return s.sh.Stats() }

func (s *SharedSegment) err(what string, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, io.EOF) {
		return err
	}
	return fmt.Errorf("shared segment %d (%s) %s: %w", s.info.Id, s.info.Name, what, err)
}

// ReadAt implements io.ReaderAt, reading page by page from the cached
// copies (asking the home for pages not held).
func (s *SharedSegment) ReadAt(p []byte, off int64) (int, error) {
	ctx := context.Background() // the sharer applies the op timeout on a miss
	n, err := s.sh.ReadAt(ctx, p, off)
	return n, s.err("read", err)
}

// WriteAt implements io.WriterAt; each page's part is written under
// exclusive ownership of the page.
func (s *SharedSegment) WriteAt(p []byte, off int64) (int, error) {
	ctx := context.Background() // the sharer applies the op timeout on a miss
	n, err := s.sh.WriteAt(ctx, p, off)
	return n, s.err("write", err)
}

// Load64 reads the little-endian word at off (a multiple of 8).
func (s *SharedSegment) Load64(off int64) (uint64, error) {
	ctx := context.Background() // the sharer applies the op timeout on a miss
	v, err := s.sh.Load64(ctx, off)
	return v, s.err("load", err)
}

// Store64 stores v as the little-endian word at off (a multiple of 8).
func (s *SharedSegment) Store64(off int64, v uint64) error {
	var b [8]byte
	le64(b[:], v)
	if off%8 != 0 {
		return s.err("store", fmt.Errorf("offset %d: %w", off, ErrUnaligned))
	}
	_, err := s.WriteAt(b[:], off)
	return err
}

// CompareAndSwap64 replaces the word at off (a multiple of 8) with new if
// it holds old, reporting whether it did. It runs under exclusive ownership
// of the page: a second atomic on a page still owned costs no message.
func (s *SharedSegment) CompareAndSwap64(off int64, old, new uint64) (bool, error) {
	ctx := context.Background() // the sharer applies the op timeout on a miss
	ok, err := s.sh.CompareAndSwap64(ctx, off, old, new)
	return ok, s.err("compare-and-swap", err)
}

// Add64 adds delta to the word at off (a multiple of 8) and returns the new
// value.
func (s *SharedSegment) Add64(off int64, delta uint64) (uint64, error) {
	ctx := context.Background() // the sharer applies the op timeout on a miss
	prev, err := s.sh.FetchAdd64(ctx, off, delta)
	return prev + delta, s.err("add", err)
}

// Sync writes every page this attachment modified back to the home: when
// it returns nil, those writes survive this process. It reports writes lost
// since the last Sync (ErrLeaseExpired: a partition outlasted a lease) and
// a lost segment (ErrSegmentLost).
func (s *SharedSegment) Sync(ctx context.Context) error {
	return s.err("sync", s.sh.Sync(ctx))
}

// Detach writes modified pages back, gives up every cached page and closes
// the attachment's connections; the segment itself stays (Free it with
// Client.FreeByName). Idempotent. On a lost segment it returns
// ErrSegmentLost: writes not yet synced are gone.
func (s *SharedSegment) Detach(ctx context.Context) error {
	if s.closed.Swap(true) {
		return nil
	}
	err := s.sh.Close(ctx)
	s.link.close()
	return s.err("detach", err)
}

// abandon drops the attachment without writing anything back, as a
// crashed process would (tests).
func (s *SharedSegment) abandon() {
	if s.closed.Swap(true) {
		return
	}
	s.sh.Abandon()
	s.link.close()
}

func le64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}
