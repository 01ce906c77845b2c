package alloc_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/faultproxy"
)

// batchSegments returns a fresh segment of size n on each backend: the
// load/store tiers, the rdma tier, an emulated tier and a shared
// attachment.
func batchSegments(t *testing.T, n int64) map[string]*alloc.Segment {
	cfg, c := startPool(t)
	emu := dial(t, cfg.Socket, alloc.WithEmulateLatency("cxl=1us"))
	segs := map[string]*alloc.Segment{}
	for name, alloc1 := range map[string]func() (*alloc.Segment, error){
		"local":    func() (*alloc.Segment, error) { return c.Alloc(t.Context(), n, alloc.WithTier(alloc.TierLocal)) },
		"cxl":      func() (*alloc.Segment, error) { return c.Alloc(t.Context(), n, alloc.WithTier(alloc.TierCXL)) },
		"rdma":     func() (*alloc.Segment, error) { return c.Alloc(t.Context(), n, alloc.WithTier(alloc.TierRDMA)) },
		"emulated": func() (*alloc.Segment, error) { return emu.Alloc(t.Context(), n, alloc.WithTier(alloc.TierCXL)) },
		"shared": func() (*alloc.Segment, error) {
			if _, err := c.Alloc(t.Context(), n, alloc.WithName("batch"), alloc.WithTier(alloc.TierRDMA)); err != nil {
				return nil, err
			}
			return dial(t, cfg.Socket).Attach(t.Context(), "batch", alloc.Shared(alloc.SharedPageSize(512)))
		},
	} {
		seg, err := alloc1()
		require.NoError(t, err, name)
		t.Cleanup(func() { seg.Close() })
		segs[name] = seg
	}
	return segs
}

// TestBatchEachBackend: a WriteBatch then a ReadBatch on every backend
// moves the same bytes as WriteAt and ReadAt would: spans of many sizes
// (empty, unaligned, across pages), reads that overlap each other, and
// the segment's last byte.
func TestBatchEachBackend(t *testing.T) {
	const n = 1 << 20
	for name, seg := range batchSegments(t, n) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			var writes []alloc.Span
			for i, sz := range []int{1, 0, 7, 4096, 513, 64 << 10, 1} {
				off := int64(i) * (100 << 10)
				if i == 6 {
					off = n - 1
				}
				writes = append(writes, alloc.Span{Off: off, Buf: bytes.Repeat([]byte{byte(i + 1)}, sz)})
			}
			require.NoError(t, seg.WriteBatch(ctx, writes))
			var reads []alloc.Span
			for _, w := range writes {
				reads = append(reads, alloc.Span{Off: w.Off, Buf: make([]byte, len(w.Buf))})
			}
			// Overlapping reads are allowed: the second straddles spans 3's end.
			reads = append(reads, alloc.Span{Off: 3*(100<<10) + 4000, Buf: make([]byte, 200)})
			require.NoError(t, seg.ReadBatch(ctx, reads))
			for i, w := range writes {
				require.Equal(t, w.Buf, reads[i].Buf, "span %d", i)
			}
			want := make([]byte, 200)
			_, err := seg.ReadAt(want, 3*(100<<10)+4000)
			require.NoError(t, err)
			require.Equal(t, want, reads[len(reads)-1].Buf)
			require.Equal(t, bytes.Repeat([]byte{4}, 96), want[:96])
		})
	}
}

// TestBatchRefusals: on every backend a batch is checked whole before any
// of it is done. An empty batch is a no-op; more than MaxBatch spans is
// ErrLimit naming the limit; a span out of range among good ones is
// ErrOutOfRange naming it, and the good ones were not written; overlapping
// write spans are ErrInvalid; a closed segment is ErrClosed.
func TestBatchRefusals(t *testing.T) {
	const n = 64 << 10
	for name, seg := range batchSegments(t, n) {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			require.NoError(t, seg.ReadBatch(ctx, nil))
			require.NoError(t, seg.WriteBatch(ctx, []alloc.Span{}))

			big := make([]alloc.Span, alloc.MaxBatch+1)
			for i := range big {
				big[i] = alloc.Span{Off: int64(i), Buf: make([]byte, 1)}
			}
			for _, err := range []error{seg.ReadBatch(ctx, big), seg.WriteBatch(ctx, big)} {
				require.ErrorIs(t, err, alloc.ErrLimit)
				require.Contains(t, err.Error(), "MaxBatch (1024)")
			}
			require.NoError(t, seg.ReadBatch(ctx, big[:alloc.MaxBatch]), "MaxBatch spans are allowed")

			good := bytes.Repeat([]byte{9}, 100)
			for _, bad := range []alloc.Span{
				{Off: n - 10, Buf: make([]byte, 11)},
				{Off: -1, Buf: make([]byte, 1)},
				{Off: n + 1, Buf: nil},
			} {
				spans := []alloc.Span{{Off: 0, Buf: good}, bad, {Off: 200, Buf: good}}
				err := seg.WriteBatch(ctx, spans)
				require.ErrorIs(t, err, alloc.ErrOutOfRange)
				require.Contains(t, err.Error(), "span 1")
				require.ErrorIs(t, seg.ReadBatch(ctx, spans), alloc.ErrOutOfRange)
			}
			got := make([]byte, 300)
			_, err := seg.ReadAt(got, 0)
			require.NoError(t, err)
			require.Equal(t, make([]byte, 300), got, "a refused batch wrote its good spans")

			err = seg.WriteBatch(ctx, []alloc.Span{{Off: 0, Buf: good}, {Off: 1000, Buf: good}, {Off: 99, Buf: good}})
			require.ErrorIs(t, err, alloc.ErrInvalid)
			require.Contains(t, err.Error(), "spans 0 ([0, 100)) and 2 ([99, 199))")
			require.NoError(t, seg.WriteBatch(ctx, []alloc.Span{{Off: 0, Buf: good}, {Off: 100, Buf: good}, {Off: 50, Buf: nil}}),
				"adjacent spans and an empty one do not overlap")

			require.NoError(t, seg.Close())
			require.ErrorIs(t, seg.ReadBatch(ctx, nil), alloc.ErrClosed)
			require.ErrorIs(t, seg.WriteBatch(ctx, []alloc.Span{{Off: 0, Buf: good}}), alloc.ErrClosed)
		})
	}
}

// TestBatchHomeDiesMidBatch: the home's data plane (a proxy in front of
// it) dies while the answers of a batch are streaming back, and takes no
// connection after: ReadBatch and WriteBatch fail with ErrUnavailable once
// the operation timeout passes (a write batch whose spans were sent also
// with ErrIndeterminate), never hang. A context that ends first ends
// the batch with its error.
func TestBatchHomeDiesMidBatch(t *testing.T) {
	cfg, owner := startPool(t)
	var (
		conns   atomic.Int64 // connections since the subtest began
		cut     atomic.Int64 // reply bytes the first dial's connections carry
		replied atomic.Int64 // reply bytes forwarded since the subtest began
		// The client's first dial opens two connections (rdma/tcp's
		// default) and posts the batch on the first; every later one dies.
		budget = func() int {
			if conns.Add(1) <= 2 {
				return int(cut.Load())
			}
			return 1 // dead: not even the handshake completes
		}
		record = func(fromClient bool, p []byte) {
			if !fromClient {
				replied.Add(int64(len(p)))
			}
		}
	)
	through, _ := lazyProxy(t, faultproxy.Config{ReplyBudget: budget, Record: record})
	c := dial(t, cfg.Socket, alloc.WithDataAddr(through), alloc.WithOpTimeout(time.Second), alloc.WithBusyPoll(0))
	seg, err := owner.Alloc(t.Context(), 1<<20, alloc.WithTier(alloc.TierRDMA), alloc.WithName("dies"))
	require.NoError(t, err)
	viaProxy, err := c.Attach(t.Context(), "dies")
	require.NoError(t, err)

	spans := make([]alloc.Span, 32)
	for i := range spans {
		spans[i] = alloc.Span{Off: int64(i) * 4096, Buf: make([]byte, 4096)}
	}
	for _, tc := range []struct {
		name  string
		cut   int // the handshake's reply (12 bytes), then part of the batch's
		want  error
		batch func(context.Context) error
	}{
		{"read", 12 + 3*4096, alloc.ErrUnavailable, func(ctx context.Context) error { return viaProxy.ReadBatch(ctx, spans) }},
		{"write", 12 + 100, alloc.ErrIndeterminate, func(ctx context.Context) error { return viaProxy.WriteBatch(ctx, spans) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conns.Store(0)
			replied.Store(0)
			cut.Store(int64(tc.cut))
			done := make(chan error, 1)
			go func() { done <- tc.batch(context.Background()) }()
			select {
			case err := <-done:
				require.ErrorIs(t, err, alloc.ErrUnavailable)
				require.ErrorIs(t, err, tc.want)
				t.Log(err)
			case <-time.After(time.Minute):
				t.Fatal("the batch still waits for a dead home after a minute")
			}
			require.Greater(t, replied.Load(), int64(2*12), "no answer of the batch came back: it was not cut mid-way")
			require.Less(t, replied.Load(), int64(2*12+32*4096), "the whole batch was answered")
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			require.ErrorIs(t, tc.batch(ctx), context.Canceled)
		})
	}
	require.NoError(t, seg.Free(t.Context()))
}

// TestEmulatedBatchLatency: an emulated tier injects its latency once per
// batch, not once per span: a batch of 16 spans takes well under the time
// of 16 ReadAt calls measured in the same run.
func TestEmulatedBatchLatency(t *testing.T) {
	cfg, _ := startPool(t)
	c := dial(t, cfg.Socket, alloc.WithEmulateLatency("cxl=2ms"))
	seg, err := c.Alloc(t.Context(), 1<<20, alloc.WithTier(alloc.TierCXL), alloc.WithPopulate())
	require.NoError(t, err)
	spans := make([]alloc.Span, 16)
	for i := range spans {
		spans[i] = alloc.Span{Off: int64(i) * 4096, Buf: make([]byte, 64)}
	}
	each, batch := time.Duration(math.MaxInt64), time.Duration(math.MaxInt64)
	for range 3 { // the best of three: a busy machine only adds time
		start := time.Now()
		for _, sp := range spans {
			_, err := seg.ReadAt(sp.Buf, sp.Off)
			require.NoError(t, err)
		}
		each = min(each, time.Since(start))
		start = time.Now()
		require.NoError(t, seg.ReadBatch(t.Context(), spans))
		batch = min(batch, time.Since(start))
	}
	t.Logf("16 ReadAt: %v, one ReadBatch of 16: %v", each, batch)
	require.Less(t, float64(batch), 0.25*float64(each), "the batch took the latency per span")
	require.NoError(t, seg.Free(t.Context()))
}

// TestWriteBatchPastSessionSlots: write batches of MaxBatch spans, more
// than the exactly-once session's slots (rdma.SessionSlots), from several
// goroutines at once on the rdma tier, each span a frame with a ticket of
// its own: they share the slots without waiting for each other's, and
// every span lands.
func TestWriteBatchPastSessionSlots(t *testing.T) {
	_, c := startPool(t)
	const writers = 4
	seg, err := c.Alloc(t.Context(), writers*alloc.MaxBatch*8, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	var wg sync.WaitGroup
	errs := make([]error, writers)
	for w := range writers {
		wg.Go(func() {
			spans := make([]alloc.Span, alloc.MaxBatch)
			for i := range spans {
				off := int64(w*alloc.MaxBatch+i) * 8
				spans[i] = alloc.Span{Off: off, Buf: binary.LittleEndian.AppendUint64(nil, uint64(off))}
			}
			errs[w] = seg.WriteBatch(t.Context(), spans)
		})
	}
	wg.Wait()
	for w, err := range errs {
		require.NoError(t, err, "writer %d", w)
	}
	all := make([]byte, seg.Size())
	_, err = seg.ReadAt(all, 0)
	require.NoError(t, err)
	for off := 0; off < len(all); off += 8 {
		require.Equal(t, uint64(off), binary.LittleEndian.Uint64(all[off:]), "word at %d", off)
	}
	require.NoError(t, seg.Free(t.Context()))
}

// lazyProxy returns a WithDataAddr function that puts a fault-injecting
// proxy configured by cfg in front of the first data-plane address the
// client dials (cfg.Target is set to it) and sends every dial through it,
// and a function that returns that proxy (nil before the first dial); the
// proxy closes with the test.
func lazyProxy(t *testing.T, cfg faultproxy.Config) (through func(addr string) string, started func() *faultproxy.Proxy) {
	var (
		mu    sync.Mutex
		proxy *faultproxy.Proxy
	)
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if proxy != nil {
			proxy.Close()
		}
	})
	through = func(addr string) string {
		mu.Lock()
		defer mu.Unlock()
		if proxy == nil {
			cfg.Target = addr
			var err error
			proxy, err = faultproxy.Start(cfg)
			require.NoError(t, err)
		}
		return proxy.Addr()
	}
	started = func() *faultproxy.Proxy {
		mu.Lock()
		defer mu.Unlock()
		return proxy
	}
	return through, started
}
