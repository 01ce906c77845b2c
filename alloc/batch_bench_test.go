package alloc_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/bench"
)

// BenchmarkReadBatch compares, on the rdma tier (loopback to the local
// daemon's data plane), one ReadBatch of 32 × 4 KiB spans with 32
// goroutines each calling ReadAt for 4 KiB, the two alternated in every
// iteration. Metrics: reads/s of each, "ratio" = batch reads/s over
// goroutine reads/s (target >= 0.8), and the process CPU time (user+sys,
// getrusage) per read of each and their ratio, "cpu-ratio" (target < 1).
// The daemon runs in the test's process, so the CPU figures hold its time
// too, the same work per read in both; the difference is the client's.
func BenchmarkReadBatch(b *testing.B) {
	_, c := startPool(b)
	const (
		spans  = 32
		size   = 4 << 10
		rounds = 8 // batches, and reads per goroutine, per iteration
		n      = 4 << 20
	)
	seg, err := c.Alloc(b.Context(), n, alloc.WithTier(alloc.TierRDMA), alloc.WithPopulate())
	require.NoError(b, err)
	defer seg.Free(b.Context())
	batch := make([]alloc.Span, spans)
	for i := range batch {
		batch[i] = alloc.Span{Off: int64(i) * size * 3 % n, Buf: make([]byte, size)}
	}
	bufs := make([][]byte, spans)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	cpu := func() time.Duration {
		d, err := bench.SelfCPU()
		if err != nil {
			b.Skip(err)
		}
		return d
	}
	var wallBatch, wallEach, cpuBatch, cpuEach time.Duration
	for b.Loop() {
		start, c0 := time.Now(), cpu()
		for range rounds {
			if err := seg.ReadBatch(b.Context(), batch); err != nil {
				b.Fatal(err)
			}
		}
		mid, c1 := time.Now(), cpu()
		var wg sync.WaitGroup
		for g := range spans {
			wg.Go(func() {
				for r := range rounds {
					if _, err := seg.ReadAt(bufs[g], int64(g*rounds+r)*size%n); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		end, c2 := time.Now(), cpu()
		wallBatch += mid.Sub(start)
		wallEach += end.Sub(mid)
		cpuBatch += c1 - c0
		cpuEach += c2 - c1
	}
	reads := float64(b.N * spans * rounds)
	b.ReportMetric(reads/wallBatch.Seconds(), "batch-reads/s")
	b.ReportMetric(reads/wallEach.Seconds(), "goroutine-reads/s")
	b.ReportMetric(float64(wallEach)/float64(wallBatch), "ratio")
	b.ReportMetric(float64(cpuBatch.Nanoseconds())/reads/1e3, "batch-cpu-µs/read")
	b.ReportMetric(float64(cpuEach.Nanoseconds())/reads/1e3, "goroutine-cpu-µs/read")
	b.ReportMetric(float64(cpuBatch)/float64(cpuEach), "cpu-ratio")
}
