package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/farmem/farmem/internal/fdpass"
	"github.com/farmem/farmem/internal/listener"
)

// peerInfo is what the daemon knows of the process at the other end of a
// unix socket connection. It is the AuthInfo of gRPC calls on that socket.
type peerInfo struct {
	UID, GID uint32
	PID      int32
}

// AuthType implements credentials.AuthInfo.
func (peerInfo) AuthType() string { return "unix-peercred" }

// peerConn is an accepted connection whose first bytes the mux already
// read. Closing it gives back its process's slot.
type peerConn struct {
	*net.UnixConn
	r       io.Reader
	peer    peerInfo
	release func()
}

func (c *peerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

func (c *peerConn) Close() error {
	c.release()
	return c.UnixConn.Close()
}

// mux splits one unix socket between gRPC (HTTP/2 preface) and descriptor
// passing (fdpass.Magic), and checks every peer against the allow list. It
// holds at most maxLocalConnsPerProcess connections of one process (and
// maxLocalConns in all), refusing more at once: a local process that opens
// connections by the thousand cannot take the descriptors other clients
// need. A connection that says nothing is closed after timeout; one that
// starts gRPC has ConnectionTimeout to finish its HTTP/2 handshake.
type mux struct {
	conns   *listener.Slots    // per process id
	l       *listener.Listener // retries accept errors such as EMFILE
	grpc    chan net.Conn
	fd      func(*net.UnixConn, peerInfo)
	allow   func(peerInfo) error
	onErr   func(msg string, args ...any)
	done    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
	timeout time.Duration
}

// listenUnix creates the socket, removing a stale one but never one that a
// live daemon answers on.
func listenUnix(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("socket directory %s: %w (choose another with --socket)", filepath.Dir(path), err)
	}
	if _, err := os.Stat(path); err == nil {
		if err := socketInUse(path); err != nil {
			return nil, err
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("socket %s: remove stale socket: %w", path, err)
		}
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("socket %s: %w (choose another with --socket)", path, err)
	}
	l.SetUnlinkOnClose(true)
	// Anyone may connect: who is served is decided per connection by the
	// allow lists (SO_PEERCRED), so the file's mode must not refuse an
	// allowed uid or gid before that check (a umask of 077 would).
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return l, nil
}

// socketInUse reports an error when a live daemon answers on path.
func socketInUse(path string) error {
	c, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return nil
	}
	c.Close()
	return fmt.Errorf("socket %s: another poold is listening there; stop it or choose another --socket", path)
}

func newMux(l *listener.Listener, allow func(peerInfo) error, fd func(*net.UnixConn, peerInfo), log *slog.Logger) (*mux, error) {
	conns, err := listener.NewSlots(listener.Limits{Name: listenerUnix, Logger: log, Total: maxLocalConns, PerSource: maxLocalConnsPerProcess})
	if err != nil {
		return nil, err
	}
	m := &mux{conns: conns, l: l, grpc: make(chan net.Conn), fd: fd, allow: allow, onErr: log.Warn, done: make(chan struct{}), timeout: 10 * time.Second}
	m.wg.Add(1)
	go m.acceptLoop()
	return m, nil
}

// Bounds of the unix socket's connections (see mux).
const (
	maxLocalConns           = 8192
	maxLocalConnsPerProcess = 128
)

var http2Preface = []byte("PRI ")

func (m *mux) acceptLoop() {
	defer m.wg.Done()
	for {
		nc, err := m.l.Accept()
		if err != nil {
			// m.l fails only once closed (see listener.Listener).
			select {
			case <-m.done:
			default:
				m.onErr("unix socket closed; no more local clients", "err", err)
				m.shutdown()
			}
			return
		}
		c, ok := nc.(*net.UnixConn)
		if !ok {
			m.onErr("unix socket accepted a connection of another kind; closing it", "type", fmt.Sprintf("%T", nc))
			nc.Close()
			continue
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			m.route(c)
		}()
	}
}

// route reads the first bytes of a connection and hands it on.
func (m *mux) route(c *net.UnixConn) {
	cred, err := fdpass.PeerCred(c)
	if err != nil {
		m.onErr("peer credentials unavailable; closing connection", "err", err)
		c.Close()
		return
	}
	peer := peerInfo{UID: cred.Uid, GID: cred.Gid, PID: cred.Pid}
	if err := m.allow(peer); err != nil {
		m.onErr("refused a local client", "uid", peer.UID, "pid", peer.PID, "err", err)
		c.Close()
		return
	}
	src := fmt.Sprintf("pid %d", peer.PID)
	if !m.conns.Acquire(src) {
		c.Close()
		return
	}
	release := sync.OnceFunc(func() { m.conns.Release(src) })
	head := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(m.timeout))
	if _, err := io.ReadFull(c, head); err != nil {
		c.Close()
		release()
		return
	}
	c.SetReadDeadline(time.Time{})
	switch {
	case bytes.Equal(head, []byte(fdpass.Magic)):
		m.fd(c, peer)
		release()
	case bytes.Equal(head, http2Preface):
		pc := &peerConn{UnixConn: c, r: io.MultiReader(bytes.NewReader(head), c), peer: peer, release: release}
		select {
		case m.grpc <- pc:
		case <-m.done:
			pc.Close()
		}
	default:
		m.onErr("unknown protocol on unix socket; closing connection", "first-bytes", fmt.Sprintf("%q", head), "pid", peer.PID)
		c.Close()
		release()
	}
}

func (m *mux) shutdown() {
	m.once.Do(func() {
		close(m.done)
		m.l.Close()
	})
}

// grpcListener is the gRPC half of the mux as a net.Listener.
type grpcListener struct{ m *mux }

func (g grpcListener) Accept() (net.Conn, error) {
	select {
	case c := <-g.m.grpc:
		return c, nil
	case <-g.m.done:
		return nil, net.ErrClosed
	}
}

func (g grpcListener) Close() error   { g.m.shutdown(); return nil }
func (g grpcListener) Addr() net.Addr { return g.m.l.Addr() }

// peerCreds are gRPC transport credentials for the unix socket: no
// encryption (the kernel carries the bytes), the peer's uid/gid/pid as
// AuthInfo.
type peerCreds struct{}

func (peerCreds) ClientHandshake(_ context.Context, _ string, c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c, peerInfo{}, nil
}

func (peerCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	pc, ok := c.(*peerConn)
	if !ok {
		return nil, nil, errors.New("connection did not come through the unix socket mux")
	}
	return c, pc.peer, nil
}

func (peerCreds) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "unix-peercred"}
}
func (p peerCreds) Clone() credentials.TransportCredentials { return p }
func (peerCreds) OverrideServerName(string) error           { return nil }
