package tcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/farmem/farmem/internal/listener"
	"github.com/farmem/farmem/internal/logsample"
	"github.com/farmem/farmem/rdma"
)

// Server serves the one-sided protocol on the segments exported to it. It
// implements rdma.Exporter. All methods are safe for concurrent use.
type Server struct {
	cfg    ServerConfig
	cfgErr error
	log    *slog.Logger

	expMu    sync.Mutex                         // serialises writers of exports
	exports  atomic.Pointer[map[uint64]*export] // copy on write; read per op without locks
	fences   fences                             // segments fenced (Fence): their ops get LEASE_EXPIRED
	sessions *sessionTable                      // exactly-once reply cache

	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[*srvConn]struct{}
	nconns    atomic.Int64
	cuts      cutLog                  // the principals Disconnect cut lately (srvConn.identify)
	lastFlush atomic.Pointer[srvConn] // the connection that flushed last, for busy polling
	wg        sync.WaitGroup

	// Connections in their handshake, in all and by source (admit.go);
	// guarded by mu.
	handshakes int
	sources    map[netip.Prefix]int
	// tenantConns counts authenticated connections by tenantKey.
	tenantConns map[string]int

	// Warnings a client can provoke at will, sampled: refusals by reason,
	// those about an authenticated connection by what and whose.
	refusalLog logsample.Sampler[Refusal]
	connLog    logsample.Sampler[connWarning]

	ctx    context.Context // ends when Close is called; given to Message
	cancel context.CancelFunc

	fwdRuns chan *fwdOp // hands forwarded ops to idle forwarding workers
}

var _ rdma.Exporter = (*Server)(nil)

// NewServer returns a server configured by cfg (zero fields take the
// defaults of DefaultConfig). It validates cfg; an invalid configuration
// makes every later Export and Serve return the validation error, so the
// server is inert rather than half-configured.
func NewServer(cfg ServerConfig) *Server {
	s := &Server{
		cfgErr:      cfg.Validate(),
		cfg:         cfg.withDefaults(),
		listeners:   make(map[net.Listener]struct{}),
		conns:       make(map[*srvConn]struct{}),
		sources:     make(map[netip.Prefix]int),
		tenantConns: make(map[string]int),
		fwdRuns:     make(chan *fwdOp),
	}
	s.log = s.cfg.Logger
	s.sessions = newSessionTable(s.cfg.MaxSessions, s.cfg.Tenant)
	s.ctx, s.cancel = context.WithCancel(context.Background())
	m := make(map[uint64]*export)
	s.exports.Store(&m)
	return s
}

// Export registers mem as segment seg under a fresh random key. mem must be
// mapped memory that stays mapped until Revoke(seg) returns, must not be
// empty and must start 8-byte aligned (mmap returns page-aligned memory).
func (s *Server) Export(seg uint64, mem []byte, epoch uint64) (rdma.Key, error) {
	key, err := rdma.NewKey()
	if err != nil {
		return rdma.Key{}, fmt.Errorf("rdma/tcp: export segment %d: %w", seg, err)
	}
	return key, s.export(seg, mem, epoch, key, 0)
}

// ExportKey is Export under a key the caller chose: a daemon restarting
// re-exports its surviving segments under the keys their owners hold.
// Such memory may hold ops of exactly-once sessions this server never
// saw, so from then on a session an origin block opens starts with its
// history unknown, and the segment joins at once (see ExportCopy and
// doc.go, Forwarding).
func (s *Server) ExportKey(seg uint64, mem []byte, epoch uint64, key rdma.Key) error {
	s.sessions.forget()
	return s.export(seg, mem, epoch, key, onceClock.Add(1))
}

// ExportCopy is Export for memory a daemon fills by copying another
// home's while that home goes on applying clients' ops (a rebuild's new
// copy or shard, the target of a home's move): the copy holds the effect
// of ops whose answers this server never saw. Until Join(seg), a RETRY
// of an exactly-once op on it answers INDETERMINATE unless its answer is
// cached here; after, unless the op's session slot recorded an op here
// since the Join (see doc.go, Forwarding).
func (s *Server) ExportCopy(seg uint64, mem []byte, epoch uint64) (rdma.Key, error) {
	key, err := rdma.NewKey()
	if err != nil {
		return rdma.Key{}, fmt.Errorf("rdma/tcp: export segment %d: %w", seg, err)
	}
	return key, s.export(seg, mem, epoch, key, notJoined)
}

// Join records that segment seg, exported by ExportCopy or ExportKey,
// takes every change from now on through this server (its forwarders
// forward each to it, or it is the primary), and held every earlier one
// when this is called: call it once the homes that applied ops before
// are sealed against writes or gone, before they apply another. Calling
// it again moves the mark later, which only makes more retries answer
// INDETERMINATE. It does nothing to a segment exported by Export.
func (s *Server) Join(seg uint64) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: join segment %d: %w", seg, rdma.ErrNotExported)
	}
	for {
		j := e.joined.Load()
		if j == 0 || e.joined.CompareAndSwap(j, onceClock.Add(1)) {
			return nil
		}
	}
}

// export registers mem as segment seg under key with the join mark
// joined (export.joined).
func (s *Server) export(seg uint64, mem []byte, epoch uint64, key rdma.Key, joined uint64) error {
	if s.cfgErr != nil {
		return s.cfgErr
	}
	if key.IsZero() {
		return fmt.Errorf("rdma/tcp: export segment %d: the zero key is never valid; pass the key the segment was first exported under", seg)
	}
	if len(mem) == 0 {
		return fmt.Errorf("rdma/tcp: export segment %d: memory is empty; pass the mapped segment", seg)
	}
	if !isAligned8(mem) {
		return fmt.Errorf("rdma/tcp: export segment %d: memory does not start 8-byte aligned; pass the mapping itself or an 8-byte aligned part of it", seg)
	}
	s.expMu.Lock()
	defer s.expMu.Unlock()
	old := *s.exports.Load()
	if _, ok := old[seg]; ok {
		return fmt.Errorf("rdma/tcp: export segment %d: %w", seg, rdma.ErrAlreadyExported)
	}
	m := make(map[uint64]*export, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	e := newExport(seg, mem, key, epoch)
	e.joined.Store(joined)
	m[seg] = e
	s.exports.Store(&m)
	s.fences.forget(seg)
	return nil
}

// lookup returns the export for seg, or nil.
func (s *Server) lookup(seg uint64) *export { return (*s.exports.Load())[seg] }

// Revoke withdraws segment seg. New operations on it fail with
// ErrAccessDenied at once. Revoke then waits until no operation touches its
// memory any more: a connection streaming a WRITE payload into the segment is
// interrupted and closed, and unflushed READ responses are flushed first (a
// client that stops reading delays Revoke by at most WriteTimeout).
func (s *Server) Revoke(seg uint64) error {
	s.expMu.Lock()
	old := *s.exports.Load()
	e, ok := old[seg]
	if !ok {
		s.expMu.Unlock()
		return fmt.Errorf("rdma/tcp: revoke segment %d: %w", seg, rdma.ErrNotExported)
	}
	m := make(map[uint64]*export, len(old))
	for k, v := range old {
		if k != seg {
			m[k] = v
		}
	}
	s.exports.Store(&m)
	e.revoke()
	s.expMu.Unlock()

	// A WRITE whose payload is still arriving pins e for as long as its
	// client takes; cut it off. streaming is stored before the conn re-checks
	// e.state, and e.state was stored above before this load.
	s.interruptStreams(e)
	<-e.drained
	return nil
}

// SetEpoch raises segment seg's lease epoch; WRITE, CAS and FADD carrying an
// older epoch then fail with ErrLeaseExpired. An epoch lower than the
// current one is refused.
func (s *Server) SetEpoch(seg, epoch uint64) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: set epoch of segment %d: %w", seg, rdma.ErrNotExported)
	}
	for {
		cur := e.epoch.Load()
		if epoch < cur {
			return fmt.Errorf("rdma/tcp: set epoch of segment %d to %d: the current epoch %d is higher; epochs only grow", seg, epoch, cur)
		}
		if e.epoch.CompareAndSwap(cur, epoch) {
			return nil
		}
	}
}

// MarkLost records that segment seg's memory is gone: new operations fail
// with ErrSegmentLost and do not touch it (operations already running may
// finish; a fault they hit is contained). Revoke must still be called.
func (s *Server) MarkLost(seg uint64) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: mark segment %d lost: %w", seg, rdma.ErrNotExported)
	}
	e.state.CompareAndSwap(stateLive, stateLost)
	return nil
}

// Serve accepts connections on l and serves each in its own goroutine until
// Close is called (then it returns nil) or l is closed by someone else
// (then it returns the error). An accept that fails for want of resources
// (EMFILE, ENFILE, ENOBUFS, ENOMEM) or for one aborted connection is
// retried after a backoff (package internal/listener), never returned: a
// flood of connections must not stop the data plane for good. Serve closes
// l before it returns. Several Serve calls on different listeners may run
// at once.
func (s *Server) Serve(l net.Listener) error {
	if s.cfgErr != nil {
		l.Close()
		return s.cfgErr
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return fmt.Errorf("rdma/tcp: serve on %s: server is closed: %w", l.Addr(), rdma.ErrClosed)
	}
	al := listener.Wrap(l, listener.Config{Name: "rdma/tcp on " + l.Addr().String(), Logger: s.log})
	s.listeners[al] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.listeners, al)
		s.mu.Unlock()
		al.Close()
	}()

	for {
		nc, err := al.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			return fmt.Errorf("rdma/tcp: accept on %s: %w", l.Addr(), err)
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return nil
		}
		c, why := s.admit(nc)
		if c == nil {
			s.mu.Unlock()
			s.refuse(nc, why)
			continue
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// dropConn forgets a finished connection.
func (s *Server) dropConn(c *srvConn) {
	s.mu.Lock()
	delete(s.conns, c)
	if k := c.countedAs; k != "" {
		if s.tenantConns[k]--; s.tenantConns[k] == 0 {
			delete(s.tenantConns, k)
		}
	}
	s.mu.Unlock()
	s.nconns.Add(-1)
	s.lastFlush.CompareAndSwap(c, nil) // do not keep its buffers alive
}

// Close stops every Serve loop, closes every connection (clients see their
// operations fail with ErrClosed) and waits for the connection goroutines to
// finish. Exports stay registered; Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	s.cancel()
	var errs []error
	for l := range s.listeners {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("rdma/tcp: close listener %s: %w", l.Addr(), err))
		}
	}
	for c := range s.conns {
		c.sock.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return errors.Join(errs...)
}
