package alloc_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/faultproxy"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/pool"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func dial(t testing.TB, socket string, opts ...alloc.DialOption) *alloc.Client {
	t.Helper()
	c, err := alloc.Dial(t.Context(), socket, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close()) })
	return c
}

func startPool(t testing.TB) (pool.Config, *alloc.Client) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	return cfg, dial(t, cfg.Socket)
}

func TestAllocEachTier(t *testing.T) {
	_, c := startPool(t)
	ctx := t.Context()
	for _, tc := range []struct {
		tier     alloc.Tier
		want     alloc.Tier
		emulated bool
		kind     string
	}{
		{alloc.TierCXL, alloc.TierCXL, true, "emulated"},
		{alloc.TierLocal, alloc.TierLocal, false, "dram"},
		{alloc.TierAny, alloc.TierCXL, true, "emulated"},
		{alloc.TierRDMA, alloc.TierRDMA, true, "loopback"},
	} {
		t.Run(tc.tier.String(), func(t *testing.T) {
			seg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(tc.tier))
			require.NoError(t, err)
			require.Equal(t, tc.want, seg.Tier())
			require.Equal(t, tc.emulated, seg.Emulated())
			require.Equal(t, tc.kind, seg.Kind())
			require.Equal(t, int64(1<<20), seg.Size())
			b, ok := seg.Bytes()
			all := make([]byte, 1<<20)
			_, err = seg.ReadAt(all, 0)
			require.NoError(t, err)
			require.Equal(t, make([]byte, 1<<20), all, "new segments are zero")
			msg := []byte("far memory")
			n, err := seg.WriteAt(msg, 4096)
			require.NoError(t, err)
			require.Equal(t, len(msg), n)
			if tc.tier == alloc.TierRDMA {
				require.False(t, ok, "rdma segments are not load/store")
			} else {
				require.True(t, ok)
				require.Len(t, b, 1<<20)
				require.Equal(t, msg, b[4096:4096+len(msg)], "WriteAt and Bytes see the same memory")
			}
			got := make([]byte, len(msg))
			_, err = seg.ReadAt(got, 4096)
			require.NoError(t, err)
			require.Equal(t, msg, got)

			require.NoError(t, seg.Store64(8, 41))
			v, err := seg.Add64(8, 1)
			require.NoError(t, err)
			require.Equal(t, uint64(42), v)
			ok, err = seg.CompareAndSwap64(8, 42, 7)
			require.NoError(t, err)
			require.True(t, ok)
			ok, err = seg.CompareAndSwap64(8, 42, 9)
			require.NoError(t, err)
			require.False(t, ok)
			v, err = seg.Load64(8)
			require.NoError(t, err)
			require.Equal(t, uint64(7), v)

			require.NoError(t, seg.Free(ctx))
			require.ErrorIs(t, seg.Free(ctx), alloc.ErrClosed)
			_, err = seg.ReadAt(got, 0)
			require.ErrorIs(t, err, alloc.ErrClosed)
			_, ok = seg.Bytes()
			require.False(t, ok)
		})
	}
}

// TestReaderAtContract: every backend (mapped cxl and local, remote rdma,
// a shared attachment, and latency emulation wrapped around mapped and
// remote) answers the same way at and past the segment's ends, for
// unaligned atomics, and once closed.
func TestReaderAtContract(t *testing.T) {
	cfg, c := startPool(t)
	emu := dial(t, cfg.Socket, alloc.WithEmulateLatency("cxl=1us,rdma=1us"))
	for _, tc := range []struct {
		name string
		open func(t *testing.T) *alloc.Segment
	}{
		{"cxl", allocOn(c, alloc.TierCXL)},
		{"local", allocOn(c, alloc.TierLocal)},
		{"rdma", allocOn(c, alloc.TierRDMA)},
		{"emulated-cxl", allocOn(emu, alloc.TierCXL)},
		{"emulated-rdma", allocOn(emu, alloc.TierRDMA)},
		{"shared", func(t *testing.T) *alloc.Segment {
			_, err := c.Alloc(t.Context(), 100, alloc.WithName("contract"), alloc.WithTier(alloc.TierRDMA))
			require.NoError(t, err)
			seg, err := c.Attach(t.Context(), "contract", alloc.Shared())
			require.NoError(t, err)
			require.NotNil(t, seg.Shared())
			return seg
		}},
	} {
		t.Run(tc.name, func(t *testing.T) { testReaderAtContract(t, tc.open(t)) })
	}
}

// allocOn allocates a 100-byte segment on tier with c.
func allocOn(c *alloc.Client, tier alloc.Tier) func(t *testing.T) *alloc.Segment {
	return func(t *testing.T) *alloc.Segment {
		seg, err := c.Alloc(t.Context(), 100, alloc.WithTier(tier))
		require.NoError(t, err)
		return seg
	}
}

func testReaderAtContract(t *testing.T, seg *alloc.Segment) {
	p := make([]byte, 10)
	n, err := seg.ReadAt(p, 95)
	require.Equal(t, 5, n)
	require.ErrorIs(t, err, io.EOF)
	n, err = seg.ReadAt(p, 100)
	require.Equal(t, 0, n)
	require.ErrorIs(t, err, io.EOF)
	_, err = seg.ReadAt(p, 101)
	require.ErrorIs(t, err, alloc.ErrOutOfRange)
	_, err = seg.ReadAt(p, -1)
	require.ErrorIs(t, err, alloc.ErrOutOfRange)
	n, err = seg.WriteAt(p, 95)
	require.Equal(t, 0, n)
	require.ErrorIs(t, err, alloc.ErrOutOfRange)
	_, err = seg.WriteAt(p, math.MaxInt64)
	require.ErrorIs(t, err, alloc.ErrOutOfRange)
	_, err = seg.Load64(4)
	require.ErrorIs(t, err, alloc.ErrUnaligned)
	_, err = seg.Add64(96, 1)
	require.ErrorIs(t, err, alloc.ErrOutOfRange)
	_, err = seg.Load64(math.MaxInt64 - 7)
	require.ErrorIs(t, err, alloc.ErrOutOfRange)
	_, err = seg.CompareAndSwap64(-8, 0, 1)
	require.ErrorIs(t, err, alloc.ErrOutOfRange)

	n, err = seg.WriteAt([]byte("contract"), 88)
	require.NoError(t, err)
	require.Equal(t, 8, n)
	v, err := seg.Add64(88, 1)
	require.NoError(t, err)
	require.NoError(t, seg.Store64(80, v))
	swapped, err := seg.CompareAndSwap64(80, v, v+1)
	require.NoError(t, err)
	require.True(t, swapped)
	got, err := seg.Load64(80)
	require.NoError(t, err)
	require.Equal(t, v+1, got)

	require.NoError(t, seg.Close())
	requireClosed(t, seg)
}

// requireClosed checks that every call on seg fails with ErrClosed and
// Bytes has nothing.
func requireClosed(t *testing.T, seg *alloc.Segment) {
	t.Helper()
	p := make([]byte, 8)
	_, err := seg.ReadAt(p, 0)
	require.ErrorIs(t, err, alloc.ErrClosed)
	_, err = seg.WriteAt(p, 0)
	require.ErrorIs(t, err, alloc.ErrClosed)
	_, err = seg.Load64(0)
	require.ErrorIs(t, err, alloc.ErrClosed)
	require.ErrorIs(t, seg.Store64(0, 1), alloc.ErrClosed)
	_, err = seg.CompareAndSwap64(0, 0, 1)
	require.ErrorIs(t, err, alloc.ErrClosed)
	_, err = seg.Add64(0, 1)
	require.ErrorIs(t, err, alloc.ErrClosed)
	_, ok := seg.Bytes()
	require.False(t, ok)
}

func TestBadRequests(t *testing.T) {
	_, c := startPool(t)
	ctx := t.Context()
	for _, tc := range []struct {
		name string
		size int64
		opts []alloc.AllocOption
		want error
	}{
		{"zero size", 0, nil, alloc.ErrInvalid},
		{"negative size", -5, nil, alloc.ErrInvalid},
		{"huge size", math.MaxInt64, nil, alloc.ErrInvalid},
		{"larger than every tier", 1 << 40, nil, alloc.ErrNoCapacity},
		{"larger than cxl", 100 << 20, []alloc.AllocOption{alloc.WithTier(alloc.TierCXL)}, alloc.ErrNoCapacity},
		{"unknown tier", 4096, []alloc.AllocOption{alloc.WithTier(alloc.Tier(17))}, alloc.ErrInvalid},
		{"larger than rdma", 100 << 20, []alloc.AllocOption{alloc.WithTier(alloc.TierRDMA)}, alloc.ErrNoCapacity},
		{"name with space", 4096, []alloc.AllocOption{alloc.WithName("a b")}, alloc.ErrInvalid},
		{"name too long", 4096, []alloc.AllocOption{alloc.WithName(string(bytes.Repeat([]byte("n"), 300)))}, alloc.ErrLimit}, // max-name-len
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Alloc(ctx, tc.size, tc.opts...)
			require.ErrorIs(t, err, tc.want)
			require.NotEmpty(t, err.Error())
		})
	}
	_, err := alloc.ParseTier("fast")
	require.ErrorIs(t, err, alloc.ErrInvalid)
	require.ErrorContains(t, err, `unknown tier "fast"; use local, cxl, rdma or any`)
	for _, tier := range []alloc.Tier{alloc.TierAny, alloc.TierLocal, alloc.TierCXL, alloc.TierRDMA} {
		got, err := alloc.ParseTier(strings.ToUpper(tier.String()))
		require.NoError(t, err)
		require.Equal(t, tier, got)
	}
	require.Equal(t, "tier(17)", alloc.Tier(17).String())

	// Nothing leaked: both tiers still have all their capacity.
	tiers, err := c.Tiers(ctx)
	require.NoError(t, err)
	for _, ti := range tiers {
		require.Equal(t, ti.Capacity, ti.Free, ti.Tier.String())
	}
}

func TestFallbackIsExplicit(t *testing.T) {
	_, c := startPool(t)
	ctx := t.Context()
	// cxl is 64 MiB: a 48 MiB segment fits once; the second one needs the fallback.
	first, err := c.Alloc(ctx, 48<<20, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	defer first.Free(ctx)
	_, err = c.Alloc(ctx, 48<<20, alloc.WithTier(alloc.TierCXL))
	require.ErrorIs(t, err, alloc.ErrNoCapacity)
	require.Contains(t, err.Error(), "cxl")
	second, err := c.Alloc(ctx, 48<<20, alloc.WithTier(alloc.TierCXL), alloc.WithFallback(alloc.TierLocal))
	require.NoError(t, err)
	require.Equal(t, alloc.TierLocal, second.Tier())
	require.NoError(t, second.Free(ctx))
}

func TestNamedAttachAndIsolation(t *testing.T) {
	cfg, owner := startPool(t)
	other := dial(t, cfg.Socket)
	ctx := t.Context()

	shared, err := owner.Alloc(ctx, 4096, alloc.WithName("shared-table"))
	require.NoError(t, err)
	_, err = owner.Alloc(ctx, 4096, alloc.WithName("shared-table"))
	require.ErrorIs(t, err, alloc.ErrExists)
	_, err = shared.WriteAt([]byte("hello"), 0)
	require.NoError(t, err)

	seen, err := other.Attach(ctx, "shared-table")
	require.NoError(t, err)
	got := make([]byte, 5)
	_, err = seen.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, "hello", string(got))
	require.NoError(t, seen.Store64(8, 99))
	v, err := shared.Load64(8)
	require.NoError(t, err)
	require.Equal(t, uint64(99), v, "two processes' mappings share memory")

	_, err = other.Attach(ctx, "no-such-name")
	require.ErrorIs(t, err, alloc.ErrNotFound)
}

func TestForeignSegmentDenied(t *testing.T) {
	cfg, owner := startPool(t)
	seg, err := owner.Alloc(t.Context(), 4096)
	require.NoError(t, err)
	// A second client guesses the id: it may neither map nor free it.
	intruder := dial(t, cfg.Socket)
	err = intruder.FreeByID(t.Context(), seg.ID())
	require.ErrorIs(t, err, alloc.ErrAccessDenied)
	err = intruder.FreeByID(t.Context(), 987654)
	require.ErrorIs(t, err, alloc.ErrNotFound)
	require.NoError(t, seg.Free(t.Context()))
}

func TestLeaseReclaimsAfterClose(t *testing.T) {
	cfg, watcher := startPool(t)
	ctx := t.Context()
	c, err := alloc.Dial(ctx, cfg.Socket)
	require.NoError(t, err)
	_, err = c.Alloc(ctx, 8<<20, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	named, err := c.Alloc(ctx, 4096, alloc.WithTier(alloc.TierCXL), alloc.WithName("keep"))
	require.NoError(t, err)
	_ = named
	require.NoError(t, c.Close())

	// The unnamed segment comes back within the TTL (1s) plus a reaper tick; the named one stays.
	require.Eventually(t, func() bool {
		tiers, err := watcher.Tiers(ctx)
		require.NoError(t, err)
		for _, ti := range tiers {
			if ti.Tier == alloc.TierCXL {
				return ti.Segments == 1 && ti.Capacity-ti.Free == 4096
			}
		}
		return false
	}, 5*time.Second, 50*time.Millisecond)
	_, err = watcher.Attach(ctx, "keep")
	require.NoError(t, err)
}

func TestStableIdentityKeepsSegments(t *testing.T) {
	cfg, _ := startPool(t)
	ctx := t.Context()
	c1, err := alloc.Dial(ctx, cfg.Socket, alloc.WithClientID("app-7"))
	require.NoError(t, err)
	seg, err := c1.Alloc(ctx, 4096)
	require.NoError(t, err)
	id := seg.ID()
	require.NoError(t, c1.Close())

	// Come back within the lease with the same identity: the segment is still ours.
	c2 := dial(t, cfg.Socket, alloc.WithClientID("app-7"))
	time.Sleep(1500 * time.Millisecond) // past the 1s TTL: the new session holds the lease
	require.NoError(t, c2.FreeByID(ctx, id))
}

func TestConcurrentUse(t *testing.T) {
	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierRDMA} {
		t.Run(tier.String(), func(t *testing.T) { testConcurrentUse(t, tier) })
	}
}

func testConcurrentUse(t *testing.T, tier alloc.Tier) {
	_, c := startPool(t)
	ctx := t.Context()
	seg, err := c.Alloc(ctx, 1<<16, alloc.WithTier(tier))
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			buf := bytes.Repeat([]byte{byte(g)}, 512)
			got := make([]byte, 512)
			for i := range 200 {
				_, err := seg.Add64(0, 1)
				require.NoError(t, err)
				off := int64(8 + g*512*8 + (i%8)*512)
				_, err = seg.WriteAt(buf, off)
				require.NoError(t, err)
				_, err = seg.ReadAt(got, off)
				require.NoError(t, err)
				require.Equal(t, buf, got)
			}
			s, err := c.Alloc(ctx, 4096)
			require.NoError(t, err)
			require.NoError(t, s.Free(ctx))
		})
	}
	wg.Wait()
	v, err := seg.Load64(0)
	require.NoError(t, err)
	require.Equal(t, uint64(8*200), v)
}

func TestFreeDuringReads(t *testing.T) {
	_, c := startPool(t)
	ctx := t.Context()
	seg, err := c.Alloc(ctx, 1<<20)
	require.NoError(t, err)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			p := make([]byte, 4096)
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := seg.ReadAt(p, 0); err != nil {
					require.True(t, errors.Is(err, alloc.ErrClosed) || errors.Is(err, alloc.ErrSegmentLost), err)
					return
				}
			}
		})
	}
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, seg.Free(ctx))
	close(stop)
	wg.Wait()
}

func TestDialWithoutDaemon(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := alloc.Dial(ctx, pooltest.SocketPath(t))
	require.Error(t, err)
	require.Contains(t, err.Error(), "poold")
	_, err = alloc.Dial(ctx, "localhost:7950")
	require.ErrorIs(t, err, alloc.ErrInvalid)
	_, err = alloc.Dial(ctx, "tcp://127.0.0.1:1")
	require.Error(t, err)
}

// TestReclaimedWhileAway cuts a live remote client off its daemon for
// longer than the lease TTL: the daemon reclaims its unnamed segment and,
// when the client is back, tells it so first, and the segment's operations
// then fail at once with ErrLeaseExpired saying why, while its named
// segment is still its own.
func TestReclaimedWhileAway(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Listen = "127.0.0.1:0"
	pooltest.TLS(t, &cfg)
	d := pooltest.Start(t, cfg)
	var cut atomic.Bool
	proxy, err := faultproxy.Start(faultproxy.Config{Target: d.ListenAddr(), ReplyBudget: func() int {
		if cut.Load() {
			return 1 // not even a TLS handshake gets through
		}
		return 0
	}})
	require.NoError(t, err)
	defer proxy.Close()
	c := dial(t, "tcp://"+proxy.Addr(), alloc.WithTLS(pooltest.ClientTLS(t, "away-app")))
	ctx := t.Context()
	seg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	kept, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA), alloc.WithName("kept-while-away"))
	require.NoError(t, err)
	_, err = seg.WriteAt([]byte("before"), 0)
	require.NoError(t, err)

	cut.Store(true)
	proxy.KillAll()
	watcher := dial(t, cfg.Socket)
	rdmaSegments := func() int64 {
		tiers, err := watcher.Tiers(ctx)
		if err != nil { // not FailNow: Eventually calls this on another goroutine
			return -1
		}
		for _, ti := range tiers {
			if ti.Tier == alloc.TierRDMA {
				return ti.Segments
			}
		}
		return -1
	}
	require.Eventually(t, func() bool { return rdmaSegments() == 1 }, 10*time.Second, 20*time.Millisecond,
		"the daemon reclaims the unnamed segment of a client away for longer than the lease (1s)")
	cut.Store(false)

	require.Eventually(t, func() bool {
		_, err := seg.ReadAt(make([]byte, 6), 0)
		return errors.Is(err, alloc.ErrLeaseExpired) && strings.Contains(err.Error(), "lease ran out")
	}, 10*time.Second, 20*time.Millisecond, "the returning client is told that its segment was reclaimed")
	_, err = seg.WriteAt([]byte("after"), 0)
	require.ErrorIs(t, err, alloc.ErrLeaseExpired)
	require.NoError(t, seg.Free(ctx), "freeing a reclaimed segment only lets go of it here")
	_, err = kept.WriteAt([]byte("still mine"), 0)
	require.NoError(t, err)
	require.NoError(t, kept.Free(ctx))
}

func TestClosedClient(t *testing.T) {
	cfg, _ := startPool(t)
	c, err := alloc.Dial(t.Context(), cfg.Socket)
	require.NoError(t, err)
	seg, err := c.Alloc(t.Context(), 4096)
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close())
	_, err = c.Alloc(t.Context(), 4096)
	require.ErrorIs(t, err, alloc.ErrClosed)
	_, err = seg.ReadAt(make([]byte, 1), 0)
	require.ErrorIs(t, err, alloc.ErrClosed)
}

func TestRemoteClientOverTCP(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Listen = "127.0.0.1:0"
	pooltest.TLS(t, &cfg)
	d := pooltest.Start(t, cfg)
	c := dial(t, "tcp://"+d.ListenAddr(), alloc.WithTLS(pooltest.ClientTLS(t, "remote-app")))
	ctx := t.Context()
	seg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	_, err = seg.WriteAt([]byte("over tcp"), 100)
	require.NoError(t, err)
	got := make([]byte, 8)
	_, err = seg.ReadAt(got, 100)
	require.NoError(t, err)
	require.Equal(t, "over tcp", string(got))
	require.NoError(t, seg.Free(ctx))

	_, err = c.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierCXL))
	require.ErrorIs(t, err, alloc.ErrNotSupported)
	tiers, err := c.Tiers(ctx)
	require.NoError(t, err)
	for _, ti := range tiers {
		require.Equal(t, ti.Capacity, ti.Free, "the failed map freed its segment: %s", ti.Tier)
	}
}
