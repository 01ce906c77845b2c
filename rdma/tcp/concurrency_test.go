package tcp

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// TestConcurrentClients runs several clients with many goroutines each; every
// goroutine owns a slice of the segment and checks what it wrote, and all
// of them bump one shared counter with FADD and CAS. In plaintext and over
// TLS.
func TestConcurrentClients(t *testing.T) {
	overBoth(t, func(t *testing.T, cfg ServerConfig, opts []Option) {
		cfg.MaxInflightPerConn = 8
		s := startServer(t, cfg)
		const (
			clients    = 3
			goroutines = 8
			rounds     = 200
			chunk      = 1024
		)
		mem, r := s.export(t, 1, 8+clients*goroutines*chunk)
		var wg sync.WaitGroup
		errs := make(chan error, clients*goroutines)
		for ci := range clients {
			c := dial(t, s.addr, append(opts, WithMaxInflight(4))...)
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx := context.Background()
					off := int64(8 + (ci*goroutines+g)*chunk)
					w := make([]byte, chunk)
					rd := make([]byte, chunk)
					for i := range rounds {
						for j := range w {
							w[j] = byte(ci + g + i + j)
						}
						if err := c.Write(ctx, r, off, w); err != nil {
							errs <- err
							return
						}
						if err := c.Read(ctx, r, off, rd); err != nil {
							errs <- err
							return
						}
						if !bytes.Equal(w, rd) {
							errs <- fmt.Errorf("client %d goroutine %d round %d: read back different bytes", ci, g, i)
							return
						}
						if i%2 == 0 {
							if _, err := c.FetchAdd64(ctx, r, 0, 1); err != nil {
								errs <- err
								return
							}
							continue
						}
						for {
							cur := make([]byte, 8)
							if err := c.Read(ctx, r, 0, cur); err != nil {
								errs <- err
								return
							}
							old := binary.NativeEndian.Uint64(cur)
							_, ok, err := c.CompareAndSwap64(ctx, r, 0, old, old+1)
							if err != nil {
								errs <- err
								return
							}
							if ok {
								break
							}
						}
					}
				}()
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		require.EqualValues(t, clients*goroutines*rounds, binary.NativeEndian.Uint64(mem[0:]))
	})
}

// hammer runs ops against r from several goroutines until stop is closed and
// returns the errors they saw.
func hammer(c *Client, r rdma.Region, size int, stop <-chan struct{}) func() []error {
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		seen []error
	)
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			ctx := context.Background()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				switch (g + i) % 4 {
				case 0:
					err = c.Read(ctx, r, 0, buf)
				case 1:
					err = c.Write(ctx, r, int64(size-len(buf)), buf)
				case 2:
					_, err = c.FetchAdd64(ctx, r, 0, 1)
				case 3:
					err = c.Read(ctx, r, 0, make([]byte, size))
				}
				if err != nil {
					mu.Lock()
					seen = append(seen, err)
					mu.Unlock()
					if errors.Is(err, rdma.ErrClosed) {
						return
					}
					time.Sleep(time.Millisecond)
				}
			}
		}()
	}
	return func() []error {
		wg.Wait()
		return seen
	}
}

// TestRevokeDuringOps revokes (or fences) a segment under load: Revoke
// returns, later ops get ErrAccessDenied (ErrLeaseExpired after Fence), and
// the memory is not touched after Revoke returned.
func TestRevokeDuringOps(t *testing.T) {
	for _, tc := range []struct {
		name     string
		withdraw func(*Server) error
		want     error
	}{
		{"revoke", func(s *Server) error { return s.Revoke(1) }, rdma.ErrAccessDenied},
		{"fence", func(s *Server) error { return s.Fence(1) }, rdma.ErrLeaseExpired},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, ServerConfig{})
			const size = 256 << 10
			mem, r := s.export(t, 1, size)
			c := dial(t, s.addr)
			stop := make(chan struct{})
			wait := hammer(c, r, size, stop)
			time.Sleep(50 * time.Millisecond)

			within(t, tc.name+" under load", func() { require.NoError(t, tc.withdraw(s.Server)) })
			snapshot := bytes.Clone(mem)
			// Scribble over the memory as the daemon would after unmapping and
			// reusing it; no late op may overwrite this.
			time.Sleep(20 * time.Millisecond)
			require.Equal(t, snapshot, mem, "memory changed after %s returned", tc.name)
			close(stop)
			errs := wait()
			for _, err := range errs {
				require.ErrorIs(t, err, tc.want)
			}
			err := c.Read(t.Context(), r, 0, make([]byte, 8))
			require.ErrorIs(t, err, tc.want)
		})
	}
}

// TestRevokeCutsStreamingWrite: a client that sent a WRITE header and only
// part of its payload must not hold Revoke up.
func TestRevokeCutsStreamingWrite(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 1, 1<<20)
	nc := rawConn(t, s.addr)
	handshake(t, nc)
	frame := requestFrame(t, &reqHeader{id: 1, op: opWrite, seg: 1, key: r.Key, epoch: 1, length: 1 << 20, payloadLen: 1 << 20})
	_, err := nc.Write(append(frame, bytes.Repeat([]byte{0xAB}, 1000)...))
	require.NoError(t, err)
	// Wait until the server has copied the first bytes in: it is streaming.
	require.Eventually(t, func() bool { return mem[999] == 0xAB }, 10*time.Second, time.Millisecond)
	within(t, "Revoke with a stalled WRITE payload", func() { require.NoError(t, s.Revoke(1)) })
	expectClosed(t, nc)
}

// TestServerCloseWhileBusy: clients in the middle of ops see ErrClosed and
// no call hangs, in plaintext and over TLS.
func TestServerCloseWhileBusy(t *testing.T) {
	overBoth(t, func(t *testing.T, cfg ServerConfig, opts []Option) {
		cfg.Logger = quietLogger()
		s := NewServer(cfg)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		served := make(chan error, 1)
		go func() { served <- s.Serve(l) }()
		mem := mapMem(t, 256<<10)
		key, err := s.Export(1, mem, 0)
		require.NoError(t, err)
		r := rdma.Region{Segment: 1, Key: key}

		c := dial(t, l.Addr().String(), opts...)
		stop := make(chan struct{})
		wait := hammer(c, r, len(mem), stop)
		time.Sleep(50 * time.Millisecond)
		within(t, "server Close under load", func() { require.NoError(t, s.Close()) })
		require.NoError(t, <-served)
		var errs []error
		within(t, "clients after server Close", func() { errs = wait() })
		close(stop)
		require.NotEmpty(t, errs)
		for _, err := range errs {
			require.True(t, isClosedish(err), "unexpected error %v", err)
		}
		err = c.Read(t.Context(), r, 0, make([]byte, 8))
		require.ErrorIs(t, err, rdma.ErrClosed)
		require.NoError(t, s.Revoke(1))
		require.NoError(t, s.Close(), "Close is idempotent")
	})
}

// TestClientCloseWhileBusy: Close fails the ops in flight with ErrClosed.
func TestClientCloseWhileBusy(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 1, 256<<10)
	c, err := Dial(t.Context(), s.addr)
	require.NoError(t, err)
	stop := make(chan struct{})
	wait := hammer(c, r, len(mem), stop)
	time.Sleep(30 * time.Millisecond)
	within(t, "client Close under load", func() { require.NoError(t, c.Close()) })
	var errs []error
	within(t, "callers after client Close", func() { errs = wait() })
	close(stop)
	for _, err := range errs {
		require.ErrorIs(t, err, rdma.ErrClosed)
	}
	require.ErrorIs(t, c.Write(t.Context(), r, 0, []byte("x")), rdma.ErrClosed)
	require.ErrorIs(t, c.Do(t.Context(), &rdma.Op{Kind: rdma.OpRead, Region: r, Buf: make([]byte, 1)}), rdma.ErrClosed)
}

// stallServer accepts the handshake and then holds every request until
// release is closed, answering them afterwards (late responses).
type stallServer struct {
	addr    string
	got     chan reqHeader
	release chan struct{}
}

func startStallServer(t *testing.T) *stallServer {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ss := &stallServer{addr: l.Addr().String(), got: make(chan reqHeader, 64), release: make(chan struct{})}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		nc, err := l.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		if _, _, err := readHello(nc); err != nil {
			return
		}
		var rb [replySize]byte
		encodeReply(rb[:], reply{version: Version, maxPayload: MaxPayload})
		nc.Write(rb[:])
		var held []reqHeader
		for {
			var hb [reqHeaderSize]byte
			nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
			if _, err := io.ReadFull(nc, hb[:]); err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					select {
					case <-ss.release:
						for _, h := range held {
							var out [respHeaderSize]byte
							encodeResponse(out[:], &respHeader{id: h.id, payloadLen: h.length})
							nc.Write(out[:])
							nc.Write(bytes.Repeat([]byte{0xEE}, int(h.length)))
						}
						held = nil
						// From now on answer every request at once.
						nc.SetReadDeadline(time.Time{})
						ss.answer(nc)
						return
					default:
						continue
					}
				}
				return
			}
			var h reqHeader
			if decodeRequest(hb[:], &h) != nil {
				return
			}
			io.CopyN(io.Discard, nc, int64(h.payloadLen))
			held = append(held, h)
			ss.got <- h
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return ss
}

// answer answers each request at once: READs with 0xEE bytes, others empty.
func (ss *stallServer) answer(nc net.Conn) {
	for {
		var hb [reqHeaderSize]byte
		if _, err := io.ReadFull(nc, hb[:]); err != nil {
			return
		}
		var h reqHeader
		if decodeRequest(hb[:], &h) != nil {
			return
		}
		io.CopyN(io.Discard, nc, int64(h.payloadLen))
		var out [respHeaderSize]byte
		n := 0
		if h.op == opRead {
			n = int(h.length)
		}
		encodeResponse(out[:], &respHeader{id: h.id, payloadLen: uint32(n)})
		if _, err := nc.Write(append(out[:], bytes.Repeat([]byte{0xEE}, n)...)); err != nil {
			return
		}
	}
}

// TestCancel: a cancelled or timed-out op returns ctx's error while the server
// sits on it, and the late response is never copied into the caller's
// buffer.
func TestCancel(t *testing.T) {
	ss := startStallServer(t)
	c, err := Dial(t.Context(), ss.addr, WithConns(1))
	require.NoError(t, err)
	defer c.Close()
	r := rdma.Region{Segment: 1}

	t.Run("already cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		require.ErrorIs(t, c.Read(ctx, r, 0, make([]byte, 8)), context.Canceled)
	})

	buf := make([]byte, 4096)
	t.Run("deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, c.Read(ctx, r, 0, buf), context.DeadlineExceeded)
	})
	<-ss.got

	t.Run("cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() {
			_, err := c.FetchAdd64(ctx, r, 0, 1)
			done <- err
		}()
		<-ss.got
		cancel()
		require.ErrorIs(t, <-done, context.Canceled)
	})

	t.Run("batch", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
		defer cancel()
		ops := []*rdma.Op{
			{Kind: rdma.OpWrite, Region: r, Buf: []byte("abc")},
			{Kind: rdma.OpRead, Region: r, Buf: make([]byte, 10)},
		}
		require.ErrorIs(t, c.Do(ctx, ops...), context.DeadlineExceeded)
		for _, op := range ops {
			require.ErrorIs(t, op.Err, context.DeadlineExceeded)
		}
	})

	// Let the late responses arrive, then prove the connection still works
	// and that the abandoned buffer was left alone.
	close(ss.release)
	require.Eventually(t, func() bool {
		// The stall server answers only held requests; a fresh op would
		// hang, so poll the client's slot table instead.
		return c.conns[0].inflight() == 0
	}, 10*time.Second, time.Millisecond)
	require.Equal(t, make([]byte, 4096), buf, "a late response was copied into an abandoned buffer")

	// The stream is still in sync.
	got := make([]byte, 3)
	require.NoError(t, c.Read(t.Context(), r, 0, got))
	require.Equal(t, []byte{0xEE, 0xEE, 0xEE}, got)
}

// TestCancelLeader: a caller that reads its own response (idle connection)
// and whose ctx is cancelled while it waits returns promptly, leaves the
// stream in sync, and its buffer alone.
func TestCancelLeader(t *testing.T) {
	ss := startStallServer(t)
	c, err := Dial(t.Context(), ss.addr, WithConns(1))
	require.NoError(t, err)
	defer c.Close()
	r := rdma.Region{Segment: 1}
	buf := make([]byte, 100)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Read(ctx, r, 0, buf) }()
	<-ss.got
	cancel()
	var err2 error
	within(t, "cancelled leader", func() { err2 = <-done })
	require.ErrorIs(t, err2, context.Canceled)

	close(ss.release)
	require.Eventually(t, func() bool { return c.conns[0].inflight() == 0 }, 10*time.Second, time.Millisecond)
	require.Equal(t, make([]byte, 100), buf)
	got := make([]byte, 5)
	require.NoError(t, c.Read(t.Context(), r, 0, got))
	require.Equal(t, bytes.Repeat([]byte{0xEE}, 5), got)
}

// TestRandomDeadlines runs ops with deadlines short enough that many expire
// at every stage of an op's life, against a real server. Nothing may hang,
// every error must be the deadline, successful reads must return what the
// goroutine last wrote successfully, and (under -race) no buffer may be
// touched after its call returned: each goroutine reuses its buffers at once.
// In plaintext and over TLS (whose reads a deadline interrupts mid-record).
func TestRandomDeadlines(t *testing.T) {
	overBoth(t, func(t *testing.T, cfg ServerConfig, opts []Option) {
		s := startServer(t, cfg)
		const (
			goroutines = 8
			chunk      = 8 << 10
		)
		_, r := s.export(t, 1, goroutines*chunk)
		// One connection: the server applies one connection's requests in order,
		// so a write abandoned in flight lands before the goroutine's next one.
		c := dial(t, s.addr, append(opts, WithConns(1), WithMaxInflight(4))...)
		var (
			wg       sync.WaitGroup
			timeouts atomic.Int64
		)
		errs := make(chan error, goroutines)
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				off := int64(g * chunk)
				w := make([]byte, chunk)
				rd := make([]byte, chunk)
				var known byte // value of the whole chunk, 0 = unknown
				for i := range 300 {
					timeout := time.Duration(1<<(i%13)) * time.Microsecond // 1 µs .. 4 ms
					ctx, cancel := context.WithTimeout(context.Background(), timeout)
					var err error
					if i%2 == 0 {
						v := byte(i%250 + 1)
						for j := range w {
							w[j] = v
						}
						err = c.Write(ctx, r, off, w)
						known = 0
						if err == nil {
							known = v
						}
						clear(w) // reuse the buffer at once
					} else {
						err = c.Read(ctx, r, off, rd)
						if err == nil && known != 0 && !bytes.Equal(rd, bytes.Repeat([]byte{known}, chunk)) {
							err = fmt.Errorf("goroutine %d read back the wrong bytes", g)
						}
						clear(rd)
					}
					cancel()
					if errors.Is(err, context.DeadlineExceeded) {
						timeouts.Add(1)
					} else if err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		within(t, "ops with random deadlines", wg.Wait)
		t.Logf("%d of %d ops timed out", timeouts.Load(), goroutines*300)
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
		// The connection pool is healthy afterwards.
		require.NoError(t, c.Read(t.Context(), r, 0, make([]byte, 8)))
		for _, cc := range c.conns {
			require.Eventually(t, func() bool { return cc.inflight() == 0 }, 10*time.Second, time.Millisecond)
		}
	})
}

// TestAbandonedOpsKeepSlots makes sure cancelled ops do not leak slots:
// after many timeouts the connection still has all its slots.
func TestAbandonedOpsKeepSlots(t *testing.T) {
	ss := startStallServer(t)
	c, err := Dial(t.Context(), ss.addr, WithConns(1), WithMaxInflight(4))
	require.NoError(t, err)
	defer c.Close()
	var n atomic.Int32
	for range 8 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
		err := c.Read(ctx, rdma.Region{}, 0, make([]byte, 1))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		n.Add(1)
	}
	close(ss.release)
	require.Eventually(t, func() bool { return c.conns[0].inflight() == 0 }, 10*time.Second, time.Millisecond)
}

// TestConnSpread checks how a Client picks a connection for a new op: the
// first live one until it holds 8 ops (so 16 in flight, as memctl bench
// and a busy server issue them, go over two connections, each served by
// its own goroutine at both ends), then the next, and the least loaded
// once every one holds that many; a closed one never.
func TestConnSpread(t *testing.T) {
	const slots = 64
	conn := func(idx int) *cliConn {
		c := &cliConn{idx: idx, free: make(chan uint32, slots)}
		for range slots {
			c.free <- 0
		}
		return c
	}
	take := func(c *cliConn, n int) {
		for range n {
			<-c.free
		}
	}
	a, b, c := conn(0), conn(1), conn(2)
	cl := &Client{conns: []*cliConn{a, b, c}}
	pick := func() int {
		t.Helper()
		got, err := cl.conn()
		require.NoError(t, err)
		return got.idx
	}
	require.Equal(t, 0, pick())
	take(a, 7)
	require.Equal(t, 0, pick(), "below 8 in flight ops stay on the first connection")
	take(a, 1)
	require.Equal(t, 1, pick(), "at 8 the next connection takes the op")
	take(b, 8)
	require.Equal(t, 2, pick())
	take(c, 10)
	take(a, 1)
	require.Equal(t, 1, pick(), "every connection at 8 or more: the least loaded")
	b.closed.Store(true)
	require.Equal(t, 0, pick(), "never a closed connection")
}

// TestBatchStaysOnOneConnection: the ops of one Do go on one connection
// whatever their number, so a batch keeps its order on the wire however
// far past the spread threshold it goes (spreading applies between calls).
func TestBatchStaysOnOneConnection(t *testing.T) {
	s := startServer(t, ServerConfig{})
	_, r := s.export(t, 1, 1<<20)
	c := dial(t, s.addr, WithConns(3))
	answered := func() []uint64 {
		var n []uint64
		for _, cc := range c.conns {
			n = append(n, cc.answered.Load())
		}
		return n
	}
	for round := range 5 {
		ops := make([]*rdma.Op, 5*spreadThreshold)
		for i := range ops {
			ops[i] = &rdma.Op{Kind: rdma.OpRead, Region: r, Offset: int64(i) << 12, Buf: make([]byte, 4<<10)}
		}
		before := answered()
		require.NoError(t, c.Do(t.Context(), ops...))
		var on []int
		for i, n := range answered() {
			if n != before[i] {
				require.EqualValues(t, len(ops), n-before[i], "round %d: connection %d answered part of the batch", round, i)
				on = append(on, i)
			}
		}
		require.Len(t, on, 1, "round %d: the batch went over connections %v", round, on)
	}
}
