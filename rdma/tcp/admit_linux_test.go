//go:build linux

package tcp

import (
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/logsample"
	"github.com/farmem/farmem/internal/syncbuf"
	"github.com/farmem/farmem/rdma"
)

// refusalCounter counts ServerConfig.Refused calls by reason.
type refusalCounter [numRefusals]atomic.Int64

func (rc *refusalCounter) hook(r Refusal) { rc[r].Add(1) }

// waitRefused waits until at least n refusals of reason r were counted.
func (rc *refusalCounter) waitRefused(t *testing.T, r Refusal, n int64) {
	t.Helper()
	require.Eventually(t, func() bool { return rc[r].Load() >= n }, 20*time.Second, 5*time.Millisecond,
		"refusals %s: %d, want %d", r, rc[r].Load(), n)
}

// idleConns opens n connections to addr from the loopback address src that
// never send a hello; they are closed when the test ends. A connection the
// server resets before the dial returns is left out.
func idleConns(t *testing.T, addr, src string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range n {
		c, err := d.DialContext(t.Context(), "tcp", addr)
		if errors.Is(err, syscall.ECONNRESET) {
			continue
		}
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return conns
}

// reads checks that c reads seg's first bytes.
func reads(t *testing.T, c *Client, r regionMem) {
	t.Helper()
	buf := make([]byte, 64)
	require.NoError(t, c.Read(t.Context(), r.Region, 0, buf))
	require.Equal(t, r.mem[:64], buf)
}

func TestHandshakesPerSource(t *testing.T) {
	var rc refusalCounter
	s := startServer(t, ServerConfig{MaxHandshakesPerSource: 4, MaxHandshakes: 64, Refused: rc.hook})
	r := exportFilled(t, s)
	before := dial(t, s.addr, WithConns(1))

	// A flood from 127.0.0.2: four hold handshake slots, the rest are
	// refused at accept.
	idleConns(t, s.addr, "127.0.0.2", 40)
	rc.waitRefused(t, RefusedSourceLimit, 36)

	// Clients from 127.0.0.1, connected before or dialing now, are served.
	reads(t, before, r)
	reads(t, dial(t, s.addr, WithConns(2)), r)

	// Another connection from the flooding source is told it is refused
	// (when the reset does not overtake the connect).
	var nc net.Conn
	for nc == nil {
		if cs := idleConns(t, s.addr, "127.0.0.2", 1); len(cs) > 0 {
			nc = cs[0]
		}
	}
	var b [replySize]byte
	_, err := io.ReadFull(nc, b[:])
	require.NoError(t, err, "a refused connection gets a busy reply")
	rep, err := decodeReply(b[:])
	require.NoError(t, err)
	require.Equal(t, replyBusy, rep.code)
	rc.waitRefused(t, RefusedSourceLimit, 37)
	require.Zero(t, rc[RefusedHandshakeLimit].Load()+rc[RefusedMaxConns].Load())
}

func TestHandshakesGlobal(t *testing.T) {
	var rc refusalCounter
	s := startServer(t, ServerConfig{MaxHandshakes: 6, MaxHandshakesPerSource: 3, HandshakeTimeout: time.Hour, Refused: rc.hook})
	r := exportFilled(t, s)
	before := dial(t, s.addr, WithConns(1))

	// Two sources fill the six slots; a third source's idle connections
	// and a new client's dial are refused, the connected client is served.
	flood := idleConns(t, s.addr, "127.0.0.2", 3)
	idleConns(t, s.addr, "127.0.0.3", 3)
	idleConns(t, s.addr, "127.0.0.4", 5)
	rc.waitRefused(t, RefusedHandshakeLimit, 5)
	_, err := Dial(t.Context(), s.addr, WithConns(1))
	require.ErrorContains(t, err, "handshake limits")
	reads(t, before, r)

	// Once a flood's connections go, their slots are free again.
	for _, c := range flood {
		c.Close()
	}
	rc.waitRefused(t, RefusedHangup, 3)
	reads(t, dial(t, s.addr, WithConns(1)), r)
}

func TestMaxConnsCountsHandshakes(t *testing.T) {
	var rc refusalCounter
	s := startServer(t, ServerConfig{MaxConns: 4, Refused: rc.hook})
	r := exportFilled(t, s)
	c := dial(t, s.addr, WithConns(2))
	idleConns(t, s.addr, "127.0.0.2", 2)
	idleConns(t, s.addr, "127.0.0.3", 3)
	rc.waitRefused(t, RefusedMaxConns, 3)
	_, err := Dial(t.Context(), s.addr, WithConns(1))
	require.ErrorContains(t, err, "connection limit")
	reads(t, c, r)
}

// regionMem is an exported segment and its memory.
type regionMem struct {
	rdma.Region
	mem []byte
}

// exportFilled exports a 4 KiB segment holding a pattern.
func exportFilled(t *testing.T, s *testServer) regionMem {
	mem, r := s.export(t, 1, 4096)
	for i := range mem {
		mem[i] = byte(i * 7)
	}
	return regionMem{Region: r, mem: mem}
}

// TestHandshakeMemory checks that a connection that never authenticates
// holds no per-connection buffer: 2000 of them cost less than a quarter
// of ReadBufferSize each, in heap and goroutine stacks together.
func TestHandshakeMemory(t *testing.T) {
	const n = 2000
	s := startServer(t, ServerConfig{MaxHandshakes: n, MaxHandshakesPerSource: n, MaxConns: 2 * n, HandshakeTimeout: time.Hour})
	inUse := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc + ms.StackInuse
	}
	waitShaking := func(want int) {
		require.Eventually(t, func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.handshakes == want
		}, 20*time.Second, 5*time.Millisecond)
	}
	// The client side's sockets are measured too; open and close a batch
	// first so the baseline includes the runtime's per-fd tables grown.
	base := idleConns(t, s.addr, "127.0.0.2", n)
	waitShaking(n)
	for _, c := range base {
		c.Close()
	}
	waitShaking(0)
	m0 := inUse()
	idleConns(t, s.addr, "127.0.0.3", n)
	waitShaking(n)
	m1 := inUse()
	per := (int64(m1) - int64(m0)) / n
	t.Logf("%d idle unauthenticated connections: %d bytes each (client side included); ReadBufferSize is %d", n, per, s.cfg.ReadBufferSize)
	require.Less(t, per, int64(s.cfg.ReadBufferSize/4))
}

// TestFrameTimeout checks that an authenticated client stalled mid-frame is
// disconnected after FrameTimeout, while one idle between frames is not.
func TestFrameTimeout(t *testing.T) {
	const ft = 200 * time.Millisecond
	s := startServer(t, ServerConfig{FrameTimeout: ft})
	r := exportFilled(t, s)
	handshaken := func() net.Conn {
		nc, err := net.Dial("tcp", s.addr)
		require.NoError(t, err)
		t.Cleanup(func() { nc.Close() })
		_, err = nc.Write(appendHello(nil, hello{version: Version}))
		require.NoError(t, err)
		var b [replySize]byte
		_, err = io.ReadFull(nc, b[:])
		require.NoError(t, err)
		return nc
	}
	var req [reqHeaderSize]byte
	encodeRequest(req[:], &reqHeader{op: opRead, id: 1, seg: r.Segment, key: r.Key, length: 64})

	for _, tc := range []struct {
		name string
		send []byte // sent before the stall
	}{
		{"header", req[:reqHeaderSize/2]},
		{"payload", func() []byte {
			var w [reqHeaderSize]byte
			encodeRequest(w[:], &reqHeader{op: opWrite, id: 2, seg: r.Segment, key: r.Key, epoch: 1, length: 4096, payloadLen: 4096})
			return append(w[:], make([]byte, 100)...)
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := handshaken()
			_, err := nc.Write(tc.send)
			require.NoError(t, err)
			within(t, "server closing a stalled frame", func() {
				_, err = io.Copy(io.Discard, nc)
			})
			require.NoError(t, err, "the server closes the connection")
		})
	}

	t.Run("idle", func(t *testing.T) {
		nc := handshaken()
		time.Sleep(3 * ft)
		_, err := nc.Write(req[:])
		require.NoError(t, err)
		var resp [respHeaderSize + 64]byte
		nc.SetReadDeadline(time.Now().Add(20 * time.Second))
		_, err = io.ReadFull(nc, resp[:])
		require.NoError(t, err, "a connection idle between frames is served")
		require.Equal(t, r.mem[:64], resp[respHeaderSize:])
	})
}

// TestRefusalLogSampled: a flood of 300 refused connections within one
// logsample.Interval logs one line for its reason; the next one, an
// Interval later, says how many were held back.
func TestRefusalLogSampled(t *testing.T) {
	var logs syncbuf.Buffer
	var rc refusalCounter
	log := slog.New(slog.NewTextHandler(&logs, nil))
	// The first connection holds the source's one handshake slot
	// throughout.
	s := startServer(t, ServerConfig{MaxHandshakesPerSource: 1, HandshakeTimeout: time.Minute, Logger: log, Refused: rc.hook})
	t0 := time.Unix(1000, 0)
	s.refusalLog.SetClock(func() time.Time { return t0 })
	idleConns(t, s.addr, "127.0.0.2", 301)
	rc.waitRefused(t, RefusedSourceLimit, 300)
	lines := strings.Count(logs.String(), "reason=source_limit")
	t.Logf("300 refusals: %d log lines", lines)
	require.Equal(t, 1, lines)

	s.refusalLog.SetClock(func() time.Time { return t0.Add(logsample.Interval) })
	idleConns(t, s.addr, "127.0.0.2", 1)
	rc.waitRefused(t, RefusedSourceLimit, 301)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "suppressed_since_last=299") }, 10*time.Second, 5*time.Millisecond, logs.String())
}

// TestConnsPerTenant: once half of MaxConns are open, one tenant's
// authenticated connections are at most MaxConnsPerTenant (its principals
// together; a principal without a tenant counts alone): one more is
// answered BUSY after its hello, while another tenant still connects, and
// a connection that closes makes room. Below half, a lone tenant opens
// more (a client opens one per core).
func TestConnsPerTenant(t *testing.T) {
	var rc refusalCounter
	tenants := map[string]string{"mallory-1": "cn:mallory", "mallory-2": "cn:mallory", "bob": "cn:bob", "peer": ""}
	s := startServer(t, ServerConfig{MaxConns: 12, MaxConnsPerTenant: 2, Refused: rc.hook,
		Identify: func(cred []byte, _ *x509.Certificate) (string, string, error) {
			tenant, ok := tenants[string(cred)]
			if !ok {
				return "", "", rdma.ErrAccessDenied
			}
			return string(cred), tenant, nil
		}})
	r := exportFilled(t, s)
	connect := func(cred string, n int) (*Client, error) {
		return Dial(t.Context(), s.addr, WithCredential([]byte(cred)), WithConns(n))
	}
	held := dial(t, s.addr, WithCredential([]byte("mallory-1")), WithConns(4))
	reads(t, held, r)
	reads(t, dial(t, s.addr, WithCredential([]byte("bob")), WithConns(2)), r)
	_, err := connect("mallory-2", 1)
	require.ErrorContains(t, err, "tenant", "cn:mallory holds 4 of the 6 open, half of 12")
	rc.waitRefused(t, RefusedTenantLimit, 1)
	reads(t, dial(t, s.addr, WithCredential([]byte("peer")), WithConns(2)), r)
	require.NoError(t, held.Close())
	require.Eventually(t, func() bool {
		c, err := connect("mallory-2", 2)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 20*time.Second, 10*time.Millisecond, "room once cn:mallory's closed")
}

// TestStagedPayloadGrowsAsItArrives: a staged payload (an XOR, here) is
// buffered as its bytes arrive, not at the length its header announces: a
// connection that sends the header of a 16 MiB XOR and nothing more costs
// the daemon a first step of 1 MiB, not 16 MiB, while it waits up to
// FrameTimeout.
func TestStagedPayloadGrowsAsItArrives(t *testing.T) {
	const conns, size = 8, MaxPayload
	cfg := ServerConfig{BusyPoll: -1, FrameTimeout: time.Minute}
	cfg.Identify = func(cred []byte, _ *x509.Certificate) (string, string, error) { return string(cred), "", nil }
	s := startServer(t, cfg)
	_, r := s.export(t, 1, size)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range conns {
		nc := rawConn(t, s.addr)
		_, err := nc.Write(appendHello(nil, hello{version: Version, cred: []byte("app"), session: [sessionIDSize]byte{byte(i)}}))
		require.NoError(t, err)
		require.Equal(t, replyAccept, readReply(t, nc).code)
		h := reqHeader{id: 1, op: opXor, seg: 1, key: r.Key, epoch: 1, length: size, payloadLen: size}
		_, err = nc.Write(append(requestFrame(t, &h), 1)) // the header and one byte
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		waiting := 0
		for c := range s.conns {
			if c.streaming.Load() != nil {
				waiting++
			}
		}
		return waiting == conns
	}, 20*time.Second, 5*time.Millisecond, "every connection waits for its payload")
	runtime.ReadMemStats(&after)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("heap grew by %d KiB for %d headers of 16 MiB XORs", grew>>10, conns)
	require.Less(t, grew, int64(conns)*(2*stagedStep), "buffered ahead of the bytes that came")
}
