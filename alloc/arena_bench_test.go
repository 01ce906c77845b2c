package alloc_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
)

func benchArena(b *testing.B, tier alloc.Tier) *alloc.Arena {
	cfg := pooltest.Config(b)
	pooltest.Start(b, cfg)
	c, err := alloc.Dial(b.Context(), cfg.Socket)
	require.NoError(b, err)
	b.Cleanup(func() { c.Close() })
	a, err := alloc.NewArena(c, alloc.ArenaTier(tier), alloc.ArenaSegmentSize(16<<20))
	require.NoError(b, err)
	b.Cleanup(func() { a.Close(context.Background()) })
	return a
}

// heapSink keeps the baseline's allocations from being optimized away.
var heapSink []byte

// BenchmarkArenaAllocFree64 is Alloc+Free of a 64-byte object on one
// goroutine (target >= 10 million pairs per second), against a baseline
// measured in the same run: a 64-byte Go heap allocation, which the
// collector then has to reclaim. Metrics: "pairs/s" for the arena, "ratio"
// arena pairs/s over heap allocations/s.
func BenchmarkArenaAllocFree64(b *testing.B) {
	a := benchArena(b, alloc.TierCXL)
	r, err := a.Alloc(64) // the first slab comes from the daemon outside the timing
	require.NoError(b, err)
	require.NoError(b, a.Free(r))
	var tArena, tHeap time.Duration
	const batch = 1000
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		for range batch {
			r, err := a.Alloc(64)
			if err != nil {
				b.Fatal(err)
			}
			if err := a.Free(r); err != nil {
				b.Fatal(err)
			}
		}
		mid := time.Now()
		for range batch {
			heapSink = make([]byte, 64)
		}
		tArena += mid.Sub(start)
		tHeap += time.Since(mid)
	}
	pairs := float64(b.N) * batch / tArena.Seconds()
	b.ReportMetric(pairs, "pairs/s")
	b.ReportMetric(pairs/(float64(b.N)*batch/tHeap.Seconds()), "ratio")
}

// BenchmarkArenaAllocFree64Parallel is the same on every P at once.
func BenchmarkArenaAllocFree64Parallel(b *testing.B) {
	a := benchArena(b, alloc.TierCXL)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r, err := a.Alloc(64)
			if err != nil {
				b.Error(err)
				return
			}
			if err := a.Free(r); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkArenaChurn keeps 100k live 64-byte objects and replaces a
// random one per iteration, so slots come from many slabs.
func BenchmarkArenaChurn(b *testing.B) {
	a := benchArena(b, alloc.TierCXL)
	refs := make([]alloc.Ref, 100_000)
	for i := range refs {
		r, err := a.Alloc(64)
		require.NoError(b, err)
		refs[i] = r
	}
	b.ResetTimer()
	i := uint32(1)
	for b.Loop() {
		i = i*1664525 + 1013904223
		k := int(i>>8) % len(refs)
		if err := a.Free(refs[k]); err != nil {
			b.Fatal(err)
		}
		r, err := a.Alloc(64)
		if err != nil {
			b.Fatal(err)
		}
		refs[k] = r
	}
}

// BenchmarkArenaGetMany reads 32 objects of 1 KiB from an rdma arena on one
// goroutine: sub-benchmark "GetMany" in one call, "ReadAt" one call per
// object, the baseline in the same run. Metric: objects/s.
func BenchmarkArenaGetMany(b *testing.B) {
	a := benchArena(b, alloc.TierRDMA)
	const n, size = 32, 1024
	gets := make([]alloc.ArenaGet, n)
	for i := range gets {
		r, err := a.Alloc(size)
		require.NoError(b, err)
		_, err = a.WriteAt(r, make([]byte, size), 0)
		require.NoError(b, err)
		gets[i] = alloc.ArenaGet{Ref: r, Buf: make([]byte, 0, size)}
	}
	b.Run("GetMany", func(b *testing.B) {
		for b.Loop() {
			for i := range gets {
				gets[i].Buf = gets[i].Buf[:0]
			}
			if err := a.GetMany(b.Context(), gets); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "objects/s")
	})
	b.Run("ReadAt", func(b *testing.B) {
		buf := make([]byte, size)
		for b.Loop() {
			for _, g := range gets {
				if _, err := a.ReadAt(g.Ref, buf, 0); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.N)*n/b.Elapsed().Seconds(), "objects/s")
	})
}
