package tcp

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// fwdConfig is the server configuration of the forwarding tests: no busy
// polling (the test hosts are small and shared), quiet logs, and a
// ForwardTimeout that a loaded -race run does not trip by accident.
func fwdConfig() ServerConfig {
	return ServerConfig{BusyPoll: -1, ForwardTimeout: 10 * time.Second}
}

// home is one in-process data plane exporting one segment: a copy or a
// shard of a redundant segment.
type home struct {
	srv *testServer
	mem []byte
	r   rdma.Region
}

// startHomes starts n data planes, each exporting segment seg of size
// bytes.
func startHomes(t *testing.T, n int, seg uint64, size int) []*home {
	t.Helper()
	hs := make([]*home, n)
	for i := range hs {
		srv := startServer(t, fwdConfig())
		mem, r := srv.export(t, seg, size)
		hs[i] = &home{srv: srv, mem: mem, r: r}
	}
	return hs
}

// failures records OnFail calls.
type failures struct {
	mu    sync.Mutex
	calls map[int]int
	errs  []error
}

func (f *failures) onFail(target int, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = make(map[int]int)
	}
	f.calls[target]++
	f.errs = append(f.errs, err)
}

func (f *failures) count() map[int]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[int]int, len(f.calls))
	for k, v := range f.calls {
		m[k] = v
	}
	return m
}

// targets dials every home of hs as the forwarding side does and returns
// them as forward targets.
func targets(t *testing.T, hs []*home, opts ...Option) []ForwardTarget {
	t.Helper()
	ts := make([]ForwardTarget, len(hs))
	for i, h := range hs {
		ts[i] = ForwardTarget{Conn: dial(t, h.srv.addr, append([]Option{WithConns(2), WithBusyPoll(-1)}, opts...)...), Region: h.r}
	}
	return ts
}

// TestForwardCopy: four clients write, CAS and FADD a primary with two
// backups concurrently, on overlapping bytes; afterwards both backups hold
// exactly the primary's bytes, and the counter every client added to holds
// the number of acknowledged adds.
func TestForwardCopy(t *testing.T) {
	const size = 64 << 10
	hs := startHomes(t, 3, 1, size)
	p := hs[0]
	var fails failures
	require.NoError(t, p.srv.Forward(1, &Forwarding{Mode: ForwardCopy, Targets: targets(t, hs[1:]), OnFail: fails.onFail}))

	const workers, rounds = 4, 300
	var adds atomic.Uint64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := dial(t, p.srv.addr, WithConns(2), WithBusyPoll(-1))
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			buf := make([]byte, 4096)
			for range rounds {
				switch rng.IntN(4) {
				case 0, 1:
					n := 1 + rng.IntN(len(buf))
					off := 64 + rng.IntN(size-64-n)
					for i := range buf[:n] {
						buf[i] = byte(rng.Uint32())
					}
					if err := cl.Write(t.Context(), p.r, int64(off), buf[:n]); err != nil {
						t.Error(err)
						return
					}
				case 2:
					if _, err := cl.FetchAdd64(t.Context(), p.r, 0, 1); err != nil {
						t.Error(err)
						return
					}
					adds.Add(1)
				case 3:
					off := int64(8 * (1 + rng.IntN(7)))
					prev, err := cl.FetchAdd64(t.Context(), p.r, off, 0)
					if err == nil {
						_, _, err = cl.CompareAndSwap64(t.Context(), p.r, off, prev, prev*31+uint64(w))
					}
					if err != nil {
						t.Error(err)
						return
					}
				}
			}
		}()
	}
	within(t, "forwarding writers", wg.Wait)
	require.Empty(t, fails.count(), "no target failed: %v", fails.errs)
	require.Equal(t, adds.Load(), binary.NativeEndian.Uint64(p.mem[0:8]), "every acknowledged add counted once")
	for i, b := range hs[1:] {
		require.True(t, equalBytes(p.mem, b.mem), "backup %d differs from the primary", i)
	}
}

// equalBytes compares without printing megabytes on failure.
func equalBytes(a, b []byte) bool { return string(a) == string(b) }

// TestXor: XOR combines the payload with the segment's bytes, exactly
// once with a ticket even when the ticket is posted again.
func TestXor(t *testing.T) {
	srv := startServer(t, fwdConfig())
	mem, r := srv.export(t, 1, 8192)
	for i := range mem {
		mem[i] = byte(i)
	}
	sess := rdma.NewSession()
	cl := dial(t, srv.addr, WithSession(sess), WithBusyPoll(-1))
	x := make([]byte, 1000)
	for i := range x {
		x[i] = 0xA5
	}
	// Unaligned at both ends: the bytes around it stay.
	require.NoError(t, cl.Xor(t.Context(), r, 3, x))
	for i := range 1010 {
		want := byte(i)
		if i >= 3 && i < 1003 {
			want ^= 0xA5
		}
		require.Equal(t, want, mem[i], "byte %d", i)
	}

	tk, err := sess.Acquire(t.Context())
	require.NoError(t, err)
	op := &rdma.Op{Kind: rdma.OpXor, Region: r, Offset: 5000, Buf: []byte{1, 2, 3}, Once: tk}
	require.NoError(t, cl.Do(t.Context(), op))
	// The same ticket again (as after a lost answer): answered, not applied.
	require.NoError(t, cl.Do(t.Context(), op))
	tk.Release()
	require.Equal(t, []byte{byte(5000%256) ^ 1, byte(5001%256) ^ 2, byte(5002%256) ^ 3}, mem[5000:5003])

	// Out of range and via Do, split past MaxPayload is not needed here.
	err = cl.Xor(t.Context(), r, 8190, []byte{1, 2, 3})
	require.ErrorIs(t, err, rdma.ErrOutOfRange)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	require.NoError(t, cl.Do(ctx, &rdma.Op{Kind: rdma.OpXor, Region: r, Offset: 0, Buf: []byte{0xFF}}))
	require.Equal(t, byte(0xFF), mem[0])
}
