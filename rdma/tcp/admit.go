package tcp

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/farmem/farmem/internal/listener"
)

// Refusal is why the server refused a connection before or during its
// handshake (ServerConfig.Refused). A plain value, safe to copy and compare.
type Refusal uint8

// The reasons a connection is refused.
const (
	// RefusedMaxConns: accepting it would exceed ServerConfig.MaxConns.
	RefusedMaxConns Refusal = iota
	// RefusedHandshakeLimit: ServerConfig.MaxHandshakes connections were
	// in their handshake.
	RefusedHandshakeLimit
	// RefusedSourceLimit: ServerConfig.MaxHandshakesPerSource connections
	// from its source address were in their handshake.
	RefusedSourceLimit
	// RefusedTimeout: its hello did not arrive within HandshakeTimeout.
	RefusedTimeout
	// RefusedBadHello: its hello was malformed, of an unknown version or
	// with an over-long credential.
	RefusedBadHello
	// RefusedAuthFailed: Authenticate rejected its credential.
	RefusedAuthFailed
	// RefusedHangup: the client closed or reset the connection before the
	// handshake was done.
	RefusedHangup
	// RefusedTenantLimit: its tenant held ServerConfig.MaxConnsPerTenant
	// authenticated connections.
	RefusedTenantLimit

	numRefusals
)

// Refusals lists every Refusal, for metrics that start each at zero.
func Refusals() []Refusal {
	r := make([]Refusal, numRefusals)
	for i := range r {
		r[i] = Refusal(i)
	}
	return r
}

// String returns a short lower-case name, fit for a metric label.
func (r Refusal) String() string {
	switch r {
	case RefusedMaxConns:
		return "max_conns"
	case RefusedHandshakeLimit:
		return "handshake_limit"
	case RefusedSourceLimit:
		return "source_limit"
	case RefusedTimeout:
		return "timeout"
	case RefusedBadHello:
		return "bad_hello"
	case RefusedAuthFailed:
		return "auth_failed"
	case RefusedHangup:
		return "hangup"
	case RefusedTenantLimit:
		return "tenant_limit"
	default:
		return "other"
	}
}

// busyReply is the reply sent to a connection refused at accept; it is
// static so that refusing allocates nothing.
var busyReply = func() (b [replySize]byte) {
	encodeReply(b[:], reply{version: Version, code: replyBusy, maxPayload: MaxPayload})
	return b
}()

// admit registers a just-accepted connection as in its handshake, or
// returns the reason it must be refused. s.mu must be held.
func (s *Server) admit(nc net.Conn) (*srvConn, Refusal) {
	cfg := &s.cfg
	src, counted := listener.Source(nc.RemoteAddr())
	switch {
	case len(s.conns) >= cfg.MaxConns:
		return nil, RefusedMaxConns
	case s.handshakes >= cfg.MaxHandshakes:
		return nil, RefusedHandshakeLimit
	case counted && s.sources[src] >= cfg.MaxHandshakesPerSource:
		return nil, RefusedSourceLimit
	}
	c := newSrvConn(s, nc)
	if counted {
		c.src = src
		s.sources[src]++
	}
	s.handshakes++
	s.conns[c] = struct{}{}
	s.nconns.Add(1)
	return c, 0
}

// errTenantLimit refuses a connection whose tenant holds MaxConnsPerTenant.
var errTenantLimit = errors.New("at ServerConfig.MaxConnsPerTenant authenticated connections")

// tenantKey is what MaxConnsPerTenant counts c under: its tenant, or its
// principal where it has none; "" (not counted) for a connection that no
// Identify named.
func (c *srvConn) tenantKey() string {
	switch {
	case !c.identified:
		return ""
	case c.tenant != "":
		return "t:" + c.tenant
	}
	return "p:" + c.principal
}

// admitTenant counts authenticated c against its tenant's
// MaxConnsPerTenant, or reports that it must be refused: once half of
// MaxConns are open, a tenant holding MaxConnsPerTenant gets no more, so
// that the rest stays for the others; below that, a lone tenant may open
// more (a client opens one connection per core of its host).
func (s *Server) admitTenant(c *srvConn) bool {
	k := c.tenantKey()
	if k == "" {
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.conns) > s.cfg.MaxConns/2 && s.tenantConns[k] >= s.cfg.MaxConnsPerTenant {
		return false
	}
	s.tenantConns[k]++
	c.countedAs = k
	return true
}

// shaken releases c's handshake slots: its handshake is over, either way.
func (s *Server) shaken(c *srvConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.handshakes--
	if c.src.IsValid() {
		if s.sources[c.src]--; s.sources[c.src] == 0 {
			delete(s.sources, c.src)
		}
	}
}

// isClosed reports whether Close has been called.
func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// refuse answers a connection refused at accept with a busy reply and
// resets it: no goroutine, no buffer, no TIME_WAIT. The reply is 12 bytes
// into a fresh socket's empty send buffer, so the write does not block.
// Over TLS the reset alone answers (a TLS client could not read a reply
// sent before the handshake).
func (s *Server) refuse(nc net.Conn, why Refusal) {
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	if s.cfg.TLS == nil {
		nc.Write(busyReply[:])
	}
	nc.Close()
	s.refused(why, nc.RemoteAddr(), nil)
}

// refused counts and logs (sampled) one refused connection.
func (s *Server) refused(why Refusal, remote net.Addr, err error) {
	if fn := s.cfg.Refused; fn != nil {
		fn(why)
	}
	n, ok := s.refusalLog.Take(why)
	if !ok {
		return
	}
	args := []any{"reason", why.String(), "remote", remote.String(), "suppressed_since_last", n}
	if err != nil {
		args = append(args, "err", err)
	}
	if setting := why.setting(); setting != "" {
		args = append(args, "setting", setting)
	}
	s.log.Warn("rdma/tcp: refused connection", args...)
}

// setting names the setting behind a refusal, for the log.
func (why Refusal) setting() string {
	switch why {
	case RefusedMaxConns:
		return "MaxConns (poold --data-max-conns)"
	case RefusedHandshakeLimit:
		return "MaxHandshakes (poold --data-max-handshakes)"
	case RefusedSourceLimit:
		return "MaxHandshakesPerSource (poold --data-max-handshakes-per-source)"
	case RefusedTimeout:
		return "HandshakeTimeout"
	case RefusedTenantLimit:
		return "MaxConnsPerTenant (poold --data-max-conns-per-tenant)"
	default:
		return ""
	}
}

// handshakeRefusal classifies a failed handshake: its reply code and error.
func handshakeRefusal(code uint16, err error) Refusal {
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return RefusedTimeout
	case errors.Is(err, errTenantLimit):
		return RefusedTenantLimit
	case code == replyAuthFailed:
		return RefusedAuthFailed
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return RefusedHangup
	default:
		return RefusedBadHello
	}
}
