//go:build linux && cgo && verbs

package verbs

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"
	"unsafe"

	"github.com/farmem/farmem/rdma"
)

// export is one registered segment.
type export struct {
	mem   []byte
	key   rdma.Key
	epoch uint64
	mr    *memRegion // nil once lost
	lost  bool
}

// Server exports mapped segment memory to RDMA peers: each segment is its
// own memory region (ibv_reg_mr), so its rkey is a per-segment key that
// Revoke withdraws (ibv_dereg_mr). Peers reach it with one-sided verbs; the
// server's CPU only answers connection setup and RESOLVE requests on the
// control connections that Listener hands it. Safe for concurrent use.
type Server struct {
	dev *device
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	segs   map[uint64]*export
	fenced map[uint64]rdma.Key // segments fenced (Fence): RESOLVE answers LEASE_EXPIRED
	fifo   []uint64            // fenced ids, oldest first, at most maxFenced
	ctls   map[net.Conn]struct{}
	lns    map[*muxListener]struct{}
	closed bool
	wg     sync.WaitGroup
}

var _ rdma.Exporter = (*Server)(nil)

// NewServer opens the RDMA device (cfg.Device, FARMEM_VERBS_DEVICE, or the
// first with an active port). Without one the error matches
// rdma.ErrNotSupported.
func NewServer(cfg Config) (*Server, error) {
	d, err := openDevice()
	if err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	return &Server{dev: d, cfg: cfg, log: log, segs: map[uint64]*export{}, ctls: map[net.Conn]struct{}{}, lns: map[*muxListener]struct{}{}}, nil
}

// Device names the RDMA device, port and GID index the server uses.
func (s *Server) Device() string {
	return fmt.Sprintf("%s port %d gid %d", s.dev.name, int(s.dev.d.port), int(s.dev.d.gid_index))
}

// Export registers mem as segment seg under a fresh key.
func (s *Server) Export(seg uint64, mem []byte, epoch uint64) (rdma.Key, error) {
	k, err := rdma.NewKey()
	if err != nil {
		return rdma.Key{}, err
	}
	return k, s.ExportKey(seg, mem, epoch, k)
}

// ExportKey registers mem as segment seg under key (a daemon restoring its
// segments after a restart keeps their keys). mem must be mapped memory,
// never the Go heap, and stay mapped until Revoke returns.
func (s *Server) ExportKey(seg uint64, mem []byte, epoch uint64, key rdma.Key) error {
	if len(mem) == 0 || uintptr(unsafe.Pointer(unsafe.SliceData(mem)))%8 != 0 {
		return fmt.Errorf("rdma/verbs: export segment %d: memory must be non-empty and 8-byte aligned", seg)
	}
	if key.IsZero() {
		return fmt.Errorf("rdma/verbs: export segment %d: the zero key is never valid", seg)
	}
	s.mu.Lock()
	if _, ok := s.segs[seg]; ok {
		s.mu.Unlock()
		return fmt.Errorf("rdma/verbs: export segment %d: %w", seg, rdma.ErrAlreadyExported)
	}
	s.mu.Unlock()
	mr, err := s.dev.register(mem, accessRemoteAll)
	if err != nil {
		return fmt.Errorf("export segment %d: %w", seg, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.segs[seg]; ok {
		mr.deregister()
		return fmt.Errorf("rdma/verbs: export segment %d: %w", seg, rdma.ErrAlreadyExported)
	}
	s.segs[seg] = &export{mem: mem, key: key, epoch: epoch, mr: mr}
	delete(s.fenced, seg)
	return nil
}

// maxFenced is how many fenced segments a Server remembers (as rdma/tcp).
const maxFenced = 1 << 14

// Fence revokes the segment as Revoke does and remembers its key: a peer
// that resolves it with that key is then told ErrLeaseExpired rather than
// ErrAccessDenied (its lease ended or the segment was freed), for the next
// maxFenced fences.
func (s *Server) Fence(seg uint64) error {
	s.mu.Lock()
	if e := s.segs[seg]; e != nil {
		if s.fenced == nil {
			s.fenced = map[uint64]rdma.Key{}
		}
		if _, ok := s.fenced[seg]; !ok {
			s.fifo = append(s.fifo, seg)
		}
		s.fenced[seg] = e.key
		for len(s.fifo) > maxFenced {
			delete(s.fenced, s.fifo[0])
			s.fifo = s.fifo[1:]
		}
	}
	s.mu.Unlock()
	return s.Revoke(seg)
}

// Revoke deregisters the segment's memory region: its rkey stops working
// and the provider returns only after in-flight accesses have ended.
func (s *Server) Revoke(seg uint64) error {
	s.mu.Lock()
	e := s.segs[seg]
	delete(s.segs, seg)
	s.mu.Unlock()
	if e == nil {
		return fmt.Errorf("rdma/verbs: revoke segment %d: %w", seg, rdma.ErrNotExported)
	}
	if e.mr != nil {
		return e.mr.deregister()
	}
	return nil
}

// SetEpoch raises the segment's epoch and re-registers its memory under a
// new rkey, so peers holding the old epoch's rkey are fenced: their next
// operation fails and their RESOLVE with the old epoch is refused for
// writes.
func (s *Server) SetEpoch(seg, epoch uint64) error {
	s.mu.Lock()
	e := s.segs[seg]
	if e == nil {
		s.mu.Unlock()
		return fmt.Errorf("rdma/verbs: set epoch of segment %d: %w", seg, rdma.ErrNotExported)
	}
	if epoch < e.epoch {
		cur := e.epoch
		s.mu.Unlock()
		return fmt.Errorf("rdma/verbs: set epoch of segment %d to %d: it is at %d and epochs never go down", seg, epoch, cur)
	}
	if epoch == e.epoch || e.mr == nil {
		e.epoch = epoch
		s.mu.Unlock()
		return nil
	}
	mem := e.mem
	s.mu.Unlock()
	mr, err := s.dev.register(mem, accessRemoteAll)
	if err != nil {
		return fmt.Errorf("set epoch of segment %d: %w", seg, err)
	}
	s.mu.Lock()
	if s.segs[seg] != e || e.mr == nil {
		s.mu.Unlock()
		mr.deregister()
		return fmt.Errorf("rdma/verbs: set epoch of segment %d: revoked meanwhile: %w", seg, rdma.ErrNotExported)
	}
	old := e.mr
	e.mr, e.epoch = mr, max(e.epoch, epoch)
	s.mu.Unlock()
	return old.deregister()
}

// MarkLost deregisters the segment's memory (no peer may touch it again)
// and answers RESOLVE for it with SEGMENT_LOST until Revoke.
func (s *Server) MarkLost(seg uint64) error {
	s.mu.Lock()
	e := s.segs[seg]
	if e == nil {
		s.mu.Unlock()
		return fmt.Errorf("rdma/verbs: mark segment %d lost: %w", seg, rdma.ErrNotExported)
	}
	mr := e.mr
	e.mr, e.lost = nil, true
	s.mu.Unlock()
	if mr != nil {
		return mr.deregister()
	}
	return nil
}

// resolve answers a RESOLVE request.
func (s *Server) resolve(q request) response {
	if q.Op != opResolve || q.Flags&^flagWrite != 0 {
		return response{Status: statusUnsupported}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.segs[q.Seg]
	if e == nil {
		if k, ok := s.fenced[q.Seg]; ok && subtle.ConstantTimeCompare(k[:], q.Key[:]) == 1 {
			return response{Status: statusLeaseExpired}
		}
		return response{Status: statusAccessDenied}
	}
	if subtle.ConstantTimeCompare(e.key[:], q.Key[:]) != 1 {
		return response{Status: statusAccessDenied}
	}
	if e.lost || e.mr == nil {
		return response{Status: statusSegmentLost}
	}
	if q.Flags&flagWrite != 0 && q.Epoch < e.epoch {
		return response{Status: statusLeaseExpired, Epoch: e.epoch}
	}
	return response{RKey: e.mr.rkey, Addr: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(e.mem)))), Size: uint64(len(e.mem)), Epoch: e.epoch}
}

// serveCtl runs one peer's control connection: the hello, its queue pair,
// then RESOLVE requests until the peer hangs up, when the queue pair goes.
func (s *Server) serveCtl(nc net.Conn, first [4]byte) {
	defer s.wg.Done()
	defer func() {
		s.mu.Lock()
		delete(s.ctls, nc)
		s.mu.Unlock()
		nc.Close()
	}()
	nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	peer, cred, err := readHello(nc, first)
	if err != nil {
		var he *helloError
		if errors.As(err, &he) {
			nc.Write(encodeReply(he.code, qpInfo{}))
		}
		s.log.Warn("rdma/verbs: refused a connection", "peer", nc.RemoteAddr().String(), "err", err)
		return
	}
	if s.cfg.Authenticate != nil {
		if err := s.cfg.Authenticate(cred); err != nil {
			nc.Write(encodeReply(codeAuthFailed, qpInfo{}))
			s.log.Warn("rdma/verbs: credential refused", "peer", nc.RemoteAddr().String(), "err", err)
			return
		}
	}
	qp, err := s.dev.newQueuePair(1)
	if err != nil {
		nc.Write(encodeReply(codeInternal, qpInfo{}))
		s.log.Error("rdma/verbs: queue pair for a peer", "peer", nc.RemoteAddr().String(), "err", err)
		return
	}
	defer qp.destroy()
	psn := randomPSN()
	if err := s.dev.connect(qp, accessRemoteAll, psn, peer); err != nil {
		nc.Write(encodeReply(codeInternal, qpInfo{}))
		s.log.Error("rdma/verbs: connect a peer's queue pair", "peer", nc.RemoteAddr().String(), "err", err)
		return
	}
	if _, err := nc.Write(encodeReply(codeAccept, s.dev.localInfo(qp.num(), psn))); err != nil {
		return
	}
	nc.SetDeadline(time.Time{})
	s.log.Debug("rdma/verbs: peer connected", "peer", nc.RemoteAddr().String(), "qpn", qp.num(), "peer_qpn", peer.QPN)
	b := make([]byte, requestLen)
	for {
		if _, err := io.ReadFull(nc, b); err != nil {
			return
		}
		q, err := decodeRequest(b)
		if err != nil {
			nc.Write(response{Status: statusProtocol}.encode())
			s.log.Warn("rdma/verbs: bad request; closing", "peer", nc.RemoteAddr().String(), "err", err)
			return
		}
		if _, err := nc.Write(s.resolve(q).encode()); err != nil {
			return
		}
	}
}

// Close stops the control listeners, drops every peer's queue pair and
// deregisters every segment. It is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	lns := s.lns
	for l := range lns {
		l.Close()
	}
	for nc := range s.ctls {
		nc.Close()
	}
	s.mu.Unlock()
	for l := range lns {
		l.wait()
	}
	s.mu.Lock()
	for nc := range s.ctls { // handed over by a router that finished after the loop above
		nc.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for id, e := range s.segs {
		if e.mr != nil {
			errs = append(errs, e.mr.deregister())
		}
		delete(s.segs, id)
	}
	return errors.Join(errs...)
}

// Listener returns a listener that serves the verbs control protocol on the
// connections of l that speak it and passes every other connection through
// Accept, so the tcp transport's server can serve on the result: one port
// carries both transports. Closing the result closes l.
func (s *Server) Listener(l net.Listener) net.Listener {
	m := newMux(l, s.cfg.HandshakeTimeout, s.takeCtl)
	s.mu.Lock()
	closed := s.closed
	if !closed {
		s.lns[m] = struct{}{}
	}
	s.mu.Unlock()
	if closed {
		m.Close()
	}
	return m
}

// takeCtl starts serving a verbs control connection.
func (s *Server) takeCtl(nc net.Conn, first [4]byte) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		nc.Write(encodeReply(codeShuttingDown, qpInfo{}))
		nc.Close()
		return
	}
	s.ctls[nc] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	go s.serveCtl(nc, first)
}
