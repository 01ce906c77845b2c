package alloc_test

import (
	"fmt"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
)

// sink keeps summing loops from being optimized away.
var sink uint64

func sum(b []byte) uint64 {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
	var s uint64
	for _, w := range words {
		s += w
	}
	return s
}

// BenchmarkSeqRead compares a sequential read through Segment.Bytes of an
// emulated-CXL segment with the same loop over a plain anonymous mapping,
// alternating the two in every iteration. Metric "ratio" is segment
// throughput / anonymous throughput (target >= 0.95).
func BenchmarkSeqRead(b *testing.B) {
	const n = 256 << 20
	cfg := pooltest.Config(b)
	cfg.EmulateCXL = 512 * size.MiB
	pooltest.Start(b, cfg)
	c, err := alloc.Dial(b.Context(), cfg.Socket)
	require.NoError(b, err)
	defer c.Close()
	seg, err := c.Alloc(b.Context(), n, alloc.WithTier(alloc.TierCXL), alloc.WithPopulate())
	require.NoError(b, err)
	segMem, _ := seg.Bytes()
	anon, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_POPULATE)
	require.NoError(b, err)
	defer unix.Munmap(anon)
	for i := range anon {
		anon[i] = byte(i)
	}
	copy(segMem, anon)
	var tSeg, tAnon time.Duration
	b.SetBytes(2 * n)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		sink += sum(segMem)
		mid := time.Now()
		sink += sum(anon)
		tSeg += mid.Sub(start)
		tAnon += time.Since(mid)
	}
	b.ReportMetric(float64(tAnon)/float64(tSeg), "ratio")
	b.ReportMetric(float64(n)*float64(b.N)/tSeg.Seconds()/1e9, "segment-GB/s")
	b.ReportMetric(float64(n)*float64(b.N)/tAnon.Seconds()/1e9, "anon-GB/s")
}

//go:noinline
func plainCopy(dst, src []byte) int { return copy(dst, src) }

// BenchmarkReadAt64 compares Segment.ReadAt of 64 bytes with copy from a
// plain slice, interleaved. Metric "ratio" is ReadAt cost / copy cost
// (target <= 2). On the emulated CXL tier ReadAt guards against memory
// faults (a truncated file); local DRAM cannot fault and is not guarded.
func BenchmarkReadAt64(b *testing.B) {
	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierLocal} {
		b.Run(tier.String(), func(b *testing.B) { benchReadAt64(b, tier) })
	}
}

func benchReadAt64(b *testing.B, tier alloc.Tier) {
	_, c := startPool(b)
	const n = 1 << 20
	seg, err := c.Alloc(b.Context(), n, alloc.WithTier(tier), alloc.WithPopulate())
	require.NoError(b, err)
	plain := make([]byte, n)
	p := make([]byte, 64)
	const batch = 1024
	var tRead, tCopy time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		off := int64(i*4096) % (n - 64)
		start := time.Now()
		for j := range batch {
			seg.ReadAt(p, off+int64(j&63))
		}
		mid := time.Now()
		for j := range batch {
			plainCopy(p, plain[off+int64(j&63):])
		}
		tRead += mid.Sub(start)
		tCopy += time.Since(mid)
	}
	b.ReportMetric(float64(tRead)/float64(tCopy), "ratio")
	b.ReportMetric(float64(tRead.Nanoseconds())/float64(b.N*batch), "readat-ns")
	b.ReportMetric(float64(tCopy.Nanoseconds())/float64(b.N*batch), "copy-ns")
}

// BenchmarkAllocFree measures Alloc + Free of a 1 MiB segment through the
// daemon with 10 and with 100,000 other live segments, reporting the p50
// of each pair in µs. The ratio of the two p50s is the growth (target <= 2).
func BenchmarkAllocFree(b *testing.B) {
	for _, live := range []int{10, 100_000} {
		b.Run(byLive(live), func(b *testing.B) {
			cfg := pooltest.Config(b)
			cfg.EmulateCXL = 2 * size.GiB
			cfg.DataDir = b.TempDir()
			pooltest.Start(b, cfg)
			c, err := alloc.Dial(b.Context(), cfg.Socket)
			require.NoError(b, err)
			defer c.Close()
			pooltest.Fill(b, cfg.Socket, live, 4096, poolv1.Tier_TIER_CXL)
			var d []time.Duration
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				seg, err := c.Alloc(b.Context(), 1<<20, alloc.WithTier(alloc.TierCXL))
				if err != nil {
					b.Fatal(err)
				}
				if err := seg.Free(b.Context()); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(start))
			}
			slices.Sort(d)
			b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), "p99-µs")
		})
	}
}

func byLive(n int) string { return fmt.Sprintf("live=%d", n) }
