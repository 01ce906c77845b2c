package tcp

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"strings"

	"github.com/farmem/farmem/rdma"
)

// Principals: with ServerConfig.Identify set, each connection acts for the
// principal its hello's credential was issued to, and a segment exported
// with a principal set (Allow) serves only connections whose principal is
// in it; any other gets ACCESS_DENIED, also with the right key. A segment
// never given a set serves every authenticated connection (its key alone
// guards it).

// principals is an immutable set of principals; an export points to the
// current one, replaced as a whole by Allow.
type principals map[string]struct{}

// Allow sets who may operate on segment seg: only connections whose
// principal (ServerConfig.Identify) is in names. It replaces the previous
// set; connections pass the new one from their next request. An empty
// names admits nobody but keeps the segment exported.
func (s *Server) Allow(seg uint64, names []string) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: allow principals on segment %d: %w", seg, rdma.ErrNotExported)
	}
	set := make(principals, len(names))
	for _, n := range names {
		set[n] = struct{}{}
	}
	e.allowed.Store(&set)
	return nil
}

// AllowReaders sets who may only read segment seg: connections whose
// principal is in names may READ it (also when a set given by Allow
// lacks them) and are refused WRITE, CAS, FADD and XOR with
// ACCESS_DENIED (also when Allow's set holds them). A backup copy is
// readable by its clients on failover, while only its primary writes it.
// It replaces the previous set; nil or empty names ends the restriction.
func (s *Server) AllowReaders(seg uint64, names []string) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: allow readers on segment %d: %w", seg, rdma.ErrNotExported)
	}
	if len(names) == 0 {
		e.readers.Store(nil)
		return nil
	}
	set := make(principals, len(names))
	for _, n := range names {
		set[n] = struct{}{}
	}
	e.readers.Store(&set)
	return nil
}

// Disconnect closes every connection that acts for principal (as
// ServerConfig.Identify named it at the hello) but those whose tenant
// (named with it) keep accepts (nil keeps none): a principal that changed
// hands keeps the new holder's. Their operations in flight fail and their
// clients redial, presenting a credential that Identify checks again. The
// caller withdraws first what Identify accepted for the connections it
// cuts (their credential, or its binding to whom it spoke for): a hello
// of principal that Identify was checking meanwhile is checked again, and
// refused. It returns how many it closed. Safe for concurrent use; keep
// runs with the server's connection table locked and must not call the
// server.
func (s *Server) Disconnect(principal string, keep func(tenant string) bool) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cuts.add(principal)
	n := 0
	for c := range s.conns {
		if c.identified && c.principal == principal && (keep == nil || !keep(c.tenant)) {
			c.sock.Close()
			n++
		}
	}
	return n
}

// maxRecheck is how many times a hello is checked again because its
// principal was disconnected meanwhile before it is refused.
const maxRecheck = 3

// cutLog remembers, while hellos are being checked, which principals
// Disconnect cut and when, so that a hello whose Identify ran across a cut
// checks again only when it cut the hello's principal: another tenant's
// cuts never refuse it. Guarded by Server.mu.
type cutLog struct {
	n      uint64              // Disconnect calls so far
	at     map[string]uint64   // principal -> n after its latest cut
	checks map[*srvConn]uint64 // hellos whose Identify runs -> n when it began
}

// begin records that c's Identify begins.
func (l *cutLog) begin(c *srvConn) {
	if l.checks == nil {
		l.checks = map[*srvConn]uint64{}
	}
	l.checks[c] = l.n
}

// end records that c's Identify ended and reports whether principal was
// cut since it began.
func (l *cutLog) end(c *srvConn, principal string) bool {
	began := l.checks[c]
	delete(l.checks, c)
	return l.at[principal] > began
}

// add records a Disconnect of principal. The cuts no hello began before
// are forgotten once there are many: what a hello checks is bounded by
// the hellos under way (MaxHandshakes) and the cuts meanwhile.
func (l *cutLog) add(principal string) {
	l.n++
	if l.at == nil {
		l.at = map[string]uint64{}
	}
	l.at[principal] = l.n
	if len(l.at) <= maxCutsKept {
		return
	}
	oldest := l.n
	for _, g := range l.checks {
		oldest = min(oldest, g)
	}
	for p, g := range l.at {
		if g <= oldest {
			delete(l.at, p)
		}
	}
}

// maxCutsKept is how many principals' cuts are kept before those no
// hello under way needs are forgotten.
const maxCutsKept = 1024

// mayUse reports whether the client of a reply-cache session named name
// (sessionName) may use e at all, to read or to write: any may where e has
// no Allow or readers set; where it has, only a principal in one.
func (e *export) mayUse(name string) bool {
	set, rd := e.allowed.Load(), e.readers.Load()
	if set == nil && rd == nil {
		return true
	}
	principal, ok := strings.CutPrefix(name, "p:")
	if !ok {
		return false
	}
	if set != nil {
		if _, in := (*set)[principal]; in {
			return true
		}
	}
	if rd != nil {
		if _, in := (*rd)[principal]; in {
			return true
		}
	}
	return false
}

// permits reports whether the connection's principal may operate on e, a
// mutating op or a read. It remembers the last sets it checked e against,
// so that a run of requests on one segment costs two atomic loads and
// three pointer comparisons.
func (c *srvConn) permits(e *export, mutating bool) bool {
	set, rd := e.allowed.Load(), e.readers.Load()
	if set == nil && rd == nil {
		return true
	}
	if e != c.okExport || set != c.okSet || rd != c.okReaders {
		// Without a principal (no Identify) a connection is in no set:
		// it may do anything on a segment without an Allow set, nothing
		// on one with.
		var reader bool
		if rd != nil && c.identified {
			_, reader = (*rd)[c.principal]
		}
		inSet := set == nil
		if !inSet && c.identified {
			_, inSet = (*set)[c.principal]
		}
		c.okReader, c.okWriter = reader || inSet, inSet && !reader
		c.okExport, c.okSet, c.okReaders = e, set, rd
	}
	if mutating {
		return c.okWriter
	}
	return c.okReader
}

// identify runs ServerConfig.Identify (else Authenticate) on a hello's
// credential with the client certificate the TLS session verified (nil
// without TLS or when the client presented none).
func (c *srvConn) identify(cred []byte, cert *x509.Certificate) error {
	cfg := &c.s.cfg
	if cfg.Identify != nil {
		for try := 0; ; try++ {
			c.s.mu.Lock()
			c.s.cuts.begin(c)
			c.s.mu.Unlock()
			p, tenant, err := cfg.Identify(cred, cert)
			c.s.mu.Lock()
			again := c.s.cuts.end(c, p)
			if err == nil && !again {
				c.principal, c.tenant, c.identified = p, tenant, true
			}
			c.s.mu.Unlock()
			if err != nil || !again {
				return err
			}
			// A Disconnect of this principal ran while Identify checked
			// the credential, and could not see this connection yet: its
			// caller withdrew what it cut before, so a second look
			// refuses a credential withdrawn.
			if try == maxRecheck {
				return fmt.Errorf("%w: principal %q was disconnected %d times while this hello was checked; reconnect", rdma.ErrClosed, p, maxRecheck+1)
			}
		}
	}
	if cfg.Authenticate != nil {
		return cfg.Authenticate(cred)
	}
	return nil
}

// peerCert is the client certificate the TLS session verified, if any.
func (c *srvConn) peerCert() *x509.Certificate {
	if tc, ok := c.nc.(*tls.Conn); ok {
		if ch := tc.ConnectionState().VerifiedChains; len(ch) > 0 && len(ch[0]) > 0 {
			return ch[0][0]
		}
	}
	return nil
}
