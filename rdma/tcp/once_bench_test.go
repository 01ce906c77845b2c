package tcp

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// BenchmarkOnceOverhead: what exactly-once costs. For 4 KiB writes and
// fetch-and-adds at 1 and 16 in flight it alternates rounds of the plain
// call (Write, FetchAdd64: what a caller without retries uses) with rounds
// of the exactly-once path (Session.Acquire, Do with the ticket, Release:
// what alloc does), and reports the median over the rounds of the time
// ratio once/plain.
//
//	go test -run '^$' -bench BenchmarkOnceOverhead -benchtime 40000x ./rdma/tcp
func BenchmarkOnceOverhead(b *testing.B) {
	s := startServer(b, ServerConfig{})
	_, r := s.export(b, 1, 1<<20)
	sess := rdma.NewSession()
	cl := dial(b, s.addr, WithSession(sess))
	ctx := context.Background()
	for _, kind := range []rdma.OpKind{rdma.OpWrite, rdma.OpFetchAdd} {
		for _, depth := range []int{1, 16} {
			b.Run(fmt.Sprintf("%s/inflight=%d", kind, depth), func(b *testing.B) {
				run := func(once bool, n int) time.Duration {
					start := time.Now()
					var wg sync.WaitGroup
					for g := range depth {
						wg.Go(func() {
							op := rdma.Op{Kind: kind, Region: r, Offset: int64(g * 4096), Buf: make([]byte, 4096), Delta: 1}
							for range n / depth {
								var err error
								switch {
								case once:
									t, aerr := sess.Acquire(ctx)
									require.NoError(b, aerr)
									op.Once = t
									err = cl.Do(ctx, &op)
									t.Release()
								case kind == rdma.OpWrite:
									err = cl.Write(ctx, r, op.Offset, op.Buf)
								default:
									_, err = cl.FetchAdd64(ctx, r, op.Offset, 1)
								}
								if err != nil {
									b.Error(err)
									return
								}
							}
						})
					}
					wg.Wait()
					return time.Since(start)
				}
				run(false, 1000) // warm up
				run(true, 1000)
				// The median of per-round ratios: on a shared host a burst
				// of other load hits one round, not the whole comparison.
				var plain, once time.Duration
				var ratios []float64
				for _, n := range rounds(b.N, 1000) {
					p, o := run(false, n), run(true, n)
					plain, once = plain+p, once+o
					ratios = append(ratios, float64(o)/float64(p))
				}
				slices.Sort(ratios)
				med := ratios[len(ratios)/2]
				b.ReportMetric(med, "once/plain")
				report(b, "%s at %d in flight: plain %.0f ops/s, exactly-once %.0f ops/s, median round time ratio once/plain %.3f (n=%d, %d rounds)",
					kind, depth, float64(b.N)/plain.Seconds(), float64(b.N)/once.Seconds(), med, b.N, len(ratios))
			})
		}
	}
}
