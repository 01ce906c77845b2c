package alloc_test

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
)

// scanSize is the rdma segment BenchmarkSeqScan and BenchmarkRandomRead
// read: 64 MiB unless given (go test ... -args -scan-size 1GiB).
var scanSize = size.Size(64 * size.MiB)

func init() {
	flag.Var(&scanSize, "scan-size", "the rdma segment BenchmarkSeqScan and BenchmarkRandomRead read")
}

// scanPool starts a pool whose rdma tier holds a scanSize segment and
// allocates it, read-ahead on; the second segment is the same memory
// opened again, which does not read ahead (see Segment.Prefetch).
func scanPool(b *testing.B) (c *alloc.Client, ahead, plain *alloc.Segment) {
	cfg := pooltest.Config(b)
	cfg.ExportSize = scanSize + 64*size.MiB
	pooltest.Start(b, cfg)
	c = dial(b, cfg.Socket)
	ahead, err := c.Alloc(b.Context(), int64(scanSize), alloc.WithTier(alloc.TierRDMA), alloc.WithPopulate())
	require.NoError(b, err)
	b.Cleanup(func() { ahead.Free(b.Context()) })
	plain, err = c.Open(b.Context(), ahead.ID())
	require.NoError(b, err)
	require.Equal(b, int64(-1), alloc.ReadAheadWindow(plain))
	require.Equal(b, int64(0), alloc.ReadAheadWindow(ahead))
	// Touch every page at the home first, so that the first pass timed
	// does not pay its page faults alone.
	readRange(b, plain, make([]byte, 1<<20), 0, plain.Size())
	return c, ahead, plain
}

// readRange reads [from, to) of seg in ReadAt calls of len(p) bytes and
// returns the time it took.
func readRange(b *testing.B, seg *alloc.Segment, p []byte, from, to int64) time.Duration {
	start := time.Now()
	for off := from; off < to; off += int64(len(p)) {
		if _, err := seg.ReadAt(p, off); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(start)
}

// BenchmarkSeqScan reads a whole rdma segment (loopback to the local
// daemon's data plane; -scan-size, 64 MiB by default) front to back on one
// goroutine three ways: 4 KiB ReadAt calls with the read-ahead on, the
// same with it off, and 1 MiB ReadAt calls (the tier's streaming
// bandwidth, read-ahead off). The three alternate on every 64 MiB of the
// segment, so drift on a shared machine hits them alike; the read-ahead
// starts a new stream on each. Metrics: the three bandwidths, "ratio" =
// read-ahead 4 KiB ÷ 1 MiB streaming (target ≥ 0.5) and "speedup" =
// read-ahead ÷ plain 4 KiB, and the share of bytes read ahead in vain.
func BenchmarkSeqScan(b *testing.B) {
	c, ahead, plain := scanPool(b)
	small, big := make([]byte, 4<<10), make([]byte, 1<<20)
	const region = 64 << 20
	var tAhead, tPlain, tStream time.Duration
	for b.Loop() {
		for from := int64(0); from < ahead.Size(); from += region {
			to := min(from+region, ahead.Size())
			tAhead += readRange(b, ahead, small, from, to)
			tPlain += readRange(b, plain, small, from, to)
			tStream += readRange(b, plain, big, from, to)
		}
	}
	bytes := float64(b.N) * float64(scanSize)
	mbs := func(d time.Duration) float64 { return bytes / d.Seconds() / 1e6 }
	b.ReportMetric(mbs(tAhead), "readahead-MB/s")
	b.ReportMetric(mbs(tPlain), "plain-MB/s")
	b.ReportMetric(mbs(tStream), "1MiB-MB/s")
	b.ReportMetric(float64(tStream)/float64(tAhead), "ratio")
	b.ReportMetric(float64(tPlain)/float64(tAhead), "speedup")
	st := c.Stats()
	b.ReportMetric(float64(st.PrefetchWastedBytes)/float64(max(st.PrefetchedBytes, 1)), "wasted-share")
}

// BenchmarkRandomRead reads 4 KiB at random offsets of the same segment,
// one at a time, each offset once with the read-ahead on and once with it
// off, in alternating order, so drift on a shared machine hits both.
// Metrics: the mean latency of each, "ratio" = on ÷ off (target ≤ 1.05),
// and the bytes the detector read ahead (it should find no stream: 0).
func BenchmarkRandomRead(b *testing.B) {
	c, ahead, plain := scanPool(b)
	p := make([]byte, 4<<10)
	rng := rand.New(rand.NewPCG(1, 2))
	var spent [2]time.Duration // on, off
	reads := 0
	for b.Loop() {
		for range 256 {
			off := rng.Int64N(int64(scanSize)/int64(len(p))) * int64(len(p))
			for k := range 2 {
				which := (k + reads) % 2
				seg := []*alloc.Segment{ahead, plain}[which]
				start := time.Now()
				if _, err := seg.ReadAt(p, off); err != nil {
					b.Fatal(err)
				}
				spent[which] += time.Since(start)
			}
			reads++
		}
	}
	b.ReportMetric(spent[0].Seconds()/float64(reads)*1e6, "on-µs/read")
	b.ReportMetric(spent[1].Seconds()/float64(reads)*1e6, "off-µs/read")
	b.ReportMetric(float64(spent[0])/float64(spent[1]), "ratio")
	b.ReportMetric(float64(c.Stats().PrefetchedBytes), "readahead-bytes")
}
