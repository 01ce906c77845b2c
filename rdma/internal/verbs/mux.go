package verbs

import (
	"io"
	"net"
	"sync"
	"time"

	"github.com/farmem/farmem/internal/listener"
)

// muxListener shares one TCP listener between the verbs control protocol
// and rdma/tcp: it reads the first four bytes of every accepted connection,
// hands connections that open with the verbs magic to onVerbs, and returns
// every other one from Accept with those bytes put back, so a tcp server
// serving on it sees an untouched stream. Safe for concurrent use.
type muxListener struct {
	net.Listener
	onVerbs func(net.Conn, [4]byte)
	sniff   time.Duration

	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	errMu     sync.Mutex
	err       error
	sniffing  map[net.Conn]struct{} // guarded by errMu: closed by Close
	wg        sync.WaitGroup
}

func newMux(l net.Listener, sniff time.Duration, onVerbs func(net.Conn, [4]byte)) *muxListener {
	// The accept loop below ends at the first error Accept returns: let
	// only closing do that, and retry the rest (EMFILE and the like).
	l = listener.Wrap(l, listener.Config{Name: "rdma/verbs on " + l.Addr().String()})
	m := &muxListener{Listener: l, onVerbs: onVerbs, sniff: sniff, conns: make(chan net.Conn), done: make(chan struct{}), sniffing: map[net.Conn]struct{}{}}
	m.wg.Add(1)
	go m.acceptLoop()
	return m
}

func (m *muxListener) acceptLoop() {
	defer m.wg.Done()
	for {
		nc, err := m.Listener.Accept()
		if err != nil {
			m.errMu.Lock()
			m.err = err
			m.errMu.Unlock()
			m.Close()
			return
		}
		m.errMu.Lock()
		m.sniffing[nc] = struct{}{}
		m.errMu.Unlock()
		m.wg.Add(1)
		go m.route(nc)
	}
}

// route sniffs the protocol of one connection.
func (m *muxListener) route(nc net.Conn) {
	defer m.wg.Done()
	var first [4]byte
	nc.SetReadDeadline(time.Now().Add(m.sniff))
	n, err := io.ReadFull(nc, first[:])
	nc.SetReadDeadline(time.Time{})
	m.errMu.Lock()
	delete(m.sniffing, nc)
	m.errMu.Unlock()
	if err == nil && first == magic {
		m.onVerbs(nc, first)
		return
	}
	if err != nil && n == 0 {
		nc.Close()
		return
	}
	pc := wrapPrefixed(nc, first[:n])
	select {
	case m.conns <- pc:
	case <-m.done:
		nc.Close()
	}
}

// Accept returns the next connection that is not a verbs one.
func (m *muxListener) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case <-m.done:
		m.errMu.Lock()
		defer m.errMu.Unlock()
		if m.err != nil {
			return nil, m.err
		}
		return nil, net.ErrClosed
	}
}

// Close closes the underlying listener; Accept then fails.
func (m *muxListener) Close() error {
	var err error
	m.closeOnce.Do(func() {
		close(m.done)
		err = m.Listener.Close()
		m.errMu.Lock()
		for nc := range m.sniffing {
			nc.Close()
		}
		m.errMu.Unlock()
	})
	return err
}

// wait waits for the accept loop and the routing goroutines (verbs
// connections handed to onVerbs are the handler's to track).
func (m *muxListener) wait() { m.wg.Wait() }

// prefixed replays bytes already read before the rest of the stream.
type prefixed struct {
	net.Conn
	pre []byte
}

func (p *prefixed) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// tcpPrefixed keeps *net.TCPConn's methods (writev for net.Buffers,
// ReadFrom, SetNoDelay) by embedding it, with Read replaying the prefix.
type tcpPrefixed struct {
	*net.TCPConn
	pre []byte
}

func (p *tcpPrefixed) Read(b []byte) (int, error) {
	if len(p.pre) > 0 {
		n := copy(b, p.pre)
		p.pre = p.pre[n:]
		return n, nil
	}
	return p.TCPConn.Read(b)
}

func wrapPrefixed(nc net.Conn, pre []byte) net.Conn {
	pre = append([]byte(nil), pre...)
	if tc, ok := nc.(*net.TCPConn); ok {
		return &tcpPrefixed{TCPConn: tc, pre: pre}
	}
	return &prefixed{Conn: nc, pre: pre}
}
