package dialer

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/internal/verbs"
	"github.com/farmem/farmem/rdma/tcp"
)

// Server is a host's data plane: it serves exported segments with the tcp
// transport and, where this build and host have an active RDMA device, with
// the verbs transport too, on one TCP port (verbs peers use it for queue
// pair setup and to resolve a segment's key to its rkey; their reads,
// writes and atomics then go through the RDMA device). It implements
// rdma.Exporter and is safe for concurrent use.
type Server struct {
	tcp    *tcp.Server
	verbs  *verbs.Server // nil without verbs
	reason string
}

var _ rdma.Exporter = (*Server)(nil)

// NewServer makes a data plane with cfg for the tcp transport. It adds the
// verbs transport when it can; Transport and Reason say what it chose.
func NewServer(cfg tcp.ServerConfig) *Server {
	s := &Server{tcp: tcp.NewServer(cfg)}
	v, err := verbs.NewServer(verbs.Config{Authenticate: cfg.Authenticate, Logger: cfg.Logger})
	if err != nil {
		s.reason = "verbs not in use: " + err.Error()
		return s
	}
	s.verbs = v
	s.reason = "verbs on " + v.Device() + "; tcp on the same port for peers without RDMA"
	return s
}

// Transport names what the server offers: "verbs+tcp" or "tcp".
func (s *Server) Transport() string {
	if s.verbs != nil {
		return "verbs+tcp"
	}
	return "tcp"
}

// Reason says why the server offers what Transport names.
func (s *Server) Reason() string { return s.reason }

// Export registers mem with every transport under one fresh key.
func (s *Server) Export(seg uint64, mem []byte, epoch uint64) (rdma.Key, error) {
	return s.withVerbs(seg, mem, epoch, s.tcp.Export)
}

// ExportCopy is Export for memory filled by copying another home's (see
// tcp.Server.ExportCopy): until Join, the tcp transport answers a retried
// exactly-once op there INDETERMINATE unless it holds its answer.
func (s *Server) ExportCopy(seg uint64, mem []byte, epoch uint64) (rdma.Key, error) {
	return s.withVerbs(seg, mem, epoch, s.tcp.ExportCopy)
}

// Join records that a segment exported by ExportCopy (or ExportKey) takes
// every change from now on (see tcp.Server.Join). Exactly-once ops go
// over the tcp transport only.
func (s *Server) Join(seg uint64) error { return s.tcp.Join(seg) }

// withVerbs registers mem with the tcp transport by export, then with
// verbs under the same key.
func (s *Server) withVerbs(seg uint64, mem []byte, epoch uint64, export func(uint64, []byte, uint64) (rdma.Key, error)) (rdma.Key, error) {
	k, err := export(seg, mem, epoch)
	if err != nil || s.verbs == nil {
		return k, err
	}
	if err := s.verbs.ExportKey(seg, mem, epoch, k); err != nil {
		s.tcp.Revoke(seg)
		return rdma.Key{}, err
	}
	return k, nil
}

// ExportKey registers mem with every transport under key.
func (s *Server) ExportKey(seg uint64, mem []byte, epoch uint64, key rdma.Key) error {
	if err := s.tcp.ExportKey(seg, mem, epoch, key); err != nil || s.verbs == nil {
		return err
	}
	if err := s.verbs.ExportKey(seg, mem, epoch, key); err != nil {
		s.tcp.Revoke(seg)
		return err
	}
	return nil
}

// both runs fn on every transport's exporter and joins the errors.
func (s *Server) both(fn func(rdma.Exporter) error) error {
	err := fn(s.tcp)
	if s.verbs != nil {
		err = errors.Join(err, fn(s.verbs))
	}
	return err
}

// Revoke withdraws the segment from every transport.
func (s *Server) Revoke(seg uint64) error {
	return s.both(func(e rdma.Exporter) error { return e.Revoke(seg) })
}

// Fence withdraws the segment from every transport and remembers its key,
// so a client still holding it is told rdma.ErrLeaseExpired.
func (s *Server) Fence(seg uint64) error {
	err := s.tcp.Fence(seg)
	if s.verbs != nil {
		err = errors.Join(err, s.verbs.Fence(seg))
	}
	return err
}

// Allow sets who may operate on the segment over the tcp transport (see
// tcp.Server.Allow). Verbs peers read and write registered memory without
// this host's CPU, so only the segment's rkey guards it there.
func (s *Server) Allow(seg uint64, principals []string) error {
	return s.tcp.Allow(seg, principals)
}

// Disconnect closes the tcp transport's connections that act for
// principal (see tcp.Server.Disconnect). Verbs peers have no principal
// (their queue pairs are authenticated by the credential alone): the
// segments' rkeys guard them.
func (s *Server) Disconnect(principal string, keep func(tenant string) bool) int {
	return s.tcp.Disconnect(principal, keep)
}

// SetEpoch raises the segment's epoch on every transport.
func (s *Server) SetEpoch(seg, epoch uint64) error {
	return s.both(func(e rdma.Exporter) error { return e.SetEpoch(seg, epoch) })
}

// MarkLost marks the segment lost on every transport.
func (s *Server) MarkLost(seg uint64) error {
	return s.both(func(e rdma.Exporter) error { return e.MarkLost(seg) })
}

// Serve serves l until Close (see tcp.Server.Serve); verbs peers are taken
// off the same listener.
func (s *Server) Serve(l net.Listener) error {
	if s.verbs != nil {
		l = s.verbs.Listener(l)
	}
	return s.tcp.Serve(l)
}

// Close stops both transports. It is idempotent.
func (s *Server) Close() error {
	err := s.tcp.Close()
	if s.verbs != nil {
		err = errors.Join(err, s.verbs.Close())
	}
	return err
}

var preferred struct {
	sync.Mutex
	at           time.Time
	name, reason string
}

// Preferred says which transport Dial tries first on this host and why:
// ("verbs", "rxe0 port 1 gid 1 is active") or ("tcp", why verbs is not
// available). The answer is cached for ten seconds.
func Preferred() (name, reason string) {
	preferred.Lock()
	defer preferred.Unlock()
	if time.Since(preferred.at) < 10*time.Second {
		return preferred.name, preferred.reason
	}
	if dev, err := verbs.Available(); err == nil {
		preferred.name, preferred.reason = "verbs", fmt.Sprintf("RDMA device %s is active; one-sided operations go through it (tcp where a peer serves no verbs)", dev)
	} else {
		preferred.name, preferred.reason = "tcp", fmt.Sprintf("one-sided operations over the TCP fallback: %v", err)
	}
	preferred.at = time.Now()
	return preferred.name, preferred.reason
}
