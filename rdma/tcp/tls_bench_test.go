package tcp

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/farmem/farmem/rdma"
)

// costSide is one data plane of BenchmarkTLSCost: a client and the region
// it reads.
type costSide struct {
	c *Client
	r rdma.Region
}

// BenchmarkTLSCost measures the data plane over TLS beside plaintext in
// the same run, each round on both in turn (b.N rounds; run with
// -benchtime=5x or more on a busy host): 4 KiB read p50 at one in flight
// (target TLS/plain ≤ 1.2), 4 KiB reads/s at 16 in flight (≥ 0.8) and
// 1 MiB read bandwidth at 4 in flight (≥ 0.7). Buffers are reused; ratios
// are the medians of the rounds' ratios.
func BenchmarkTLSCost(b *testing.B) {
	srvTLS, cliTLS := tlsConfigs(b)
	sides := make([]costSide, 2) // plaintext, tls
	for i, cfg := range []ServerConfig{{}, {TLS: srvTLS}} {
		s := startServer(b, cfg)
		_, r := s.export(b, 1, 64<<20)
		var opts []Option
		if cfg.TLS != nil {
			opts = append(opts, WithTLS(cliTLS))
		}
		sides[i] = costSide{c: dial(b, s.addr, opts...), r: r}
	}
	large := make([][]byte, 4)
	for i := range large {
		large[i] = make([]byte, 1<<20)
	}
	lat, rate, bw := costRounds(b, sides, large)
	ratio := medianRatio
	b.ReportMetric(median(lat[0]), "plain-p50-ns")
	b.ReportMetric(median(lat[1]), "tls-p50-ns")
	b.ReportMetric(ratio(lat), "p50-ratio")
	b.ReportMetric(ratio(rate), "rate-ratio")
	b.ReportMetric(ratio(bw), "bw-ratio")
	report(b, "TLS vs plaintext, medians of %d rounds: 4 KiB read p50 %v vs %v, ratio %.2f (target ≤ 1.2); 4 KiB reads/s at 16 in flight %.0f vs %.0f, ratio %.2f (target ≥ 0.8); 1 MiB reads %.0f vs %.0f MiB/s, ratio %.2f (target ≥ 0.7)",
		b.N, time.Duration(median(lat[1])), time.Duration(median(lat[0])), ratio(lat),
		median(rate[1]), median(rate[0]), ratio(rate), median(bw[1]), median(bw[0]), ratio(bw))
}

// medianRatio is the median over rounds of side 1's value over side 0's.
func medianRatio(m [2][]float64) float64 {
	rs := make([]float64, len(m[0]))
	for i := range rs {
		rs[i] = m[1][i] / m[0][i]
	}
	return median(rs)
}

// costRounds runs b.N rounds of a side-by-side measurement, each round on
// every side in turn (alternating which goes first), and returns per side
// and round: the 4 KiB read p50 at one in flight (ns), 4 KiB reads/s at 16
// in flight, and, when large holds buffers, 1 MiB reads/s at len(large) in
// flight. Buffers are reused.
func costRounds(b *testing.B, sides []costSide, large [][]byte) (lat, rate, bw [2][]float64) {
	small := make([][]byte, 16)
	for i := range small {
		small[i] = make([]byte, 4<<10)
	}
	const (
		latOps  = 2000
		rateOps = 20_000
		bulkOps = 100
	)
	ctx := context.Background()
	b.ResetTimer()
	for round := range b.N {
		for k := range 2 {
			i := (round + k) % 2 // alternate which side goes first
			s := sides[i]
			d := make([]time.Duration, 0, latOps)
			for range latOps {
				t0 := time.Now()
				if err := s.c.Read(ctx, s.r, 0, small[0]); err != nil {
					b.Fatal(err)
				}
				d = append(d, time.Since(t0))
			}
			lat[i] = append(lat[i], float64(p50(d)))
			rate[i] = append(rate[i], rateOps/parallelReads(b, s.c, s.r, small, rateOps).Seconds())
			if len(large) > 0 {
				bw[i] = append(bw[i], bulkOps/parallelReads(b, s.c, s.r, large, bulkOps).Seconds())
			}
		}
	}
	b.StopTimer()
	return lat, rate, bw
}

// median returns the median of v (v is reordered).
func median(v []float64) float64 {
	slices.Sort(v)
	return v[len(v)/2]
}
