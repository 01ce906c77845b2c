package alloc_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
)

// BenchmarkAllocFreeFsync measures what durable metadata costs: two daemons
// run side by side, one fsyncing every commit (the default) and one with
// --metadata-fsync=false (the unsafe baseline), and every iteration does one
// Alloc + Free of 64 KiB on each, alternating. Metrics: the p50 of each in
// µs and "p50-ratio" (fsync / baseline); then 8 clients allocate and free
// concurrently on each daemon, giving "allocs/s" of each and
// "concurrent-ratio" (fsync / baseline throughput; concurrent commits
// share an fsync).
func BenchmarkAllocFreeFsync(b *testing.B) {
	type side struct {
		clients []*alloc.Client
		d       []time.Duration
		rate    float64
	}
	const clients = 8
	start := func(fsync bool) *side {
		cfg := pooltest.Config(b)
		cfg.EmulateCXL = 256 * size.MiB
		cfg.MetadataFsync = fsync
		pooltest.Start(b, cfg)
		s := &side{}
		for range clients {
			c, err := alloc.Dial(b.Context(), cfg.Socket)
			require.NoError(b, err)
			b.Cleanup(func() { c.Close() })
			s.clients = append(s.clients, c)
		}
		return s
	}
	durable, baseline := start(true), start(false)
	pair := func(ctx context.Context, c *alloc.Client) error {
		seg, err := c.Alloc(ctx, 64<<10, alloc.WithTier(alloc.TierCXL))
		if err != nil {
			return err
		}
		return seg.Free(ctx)
	}
	ctx := b.Context()
	b.ResetTimer()
	for b.Loop() {
		for _, s := range []*side{durable, baseline} {
			t0 := time.Now()
			if err := pair(ctx, s.clients[0]); err != nil {
				b.Fatal(err)
			}
			s.d = append(s.d, time.Since(t0))
		}
	}
	b.StopTimer()
	const perClient = 200
	for _, s := range []*side{durable, baseline} {
		var wg sync.WaitGroup
		errc := make(chan error, clients)
		t0 := time.Now()
		for _, c := range s.clients {
			wg.Go(func() {
				for range perClient {
					if err := pair(ctx, c); err != nil {
						errc <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errc)
		require.NoError(b, <-errc)
		s.rate = clients * perClient / time.Since(t0).Seconds()
	}
	p50 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2].Microseconds())
	}
	b.ReportMetric(p50(durable.d), "fsync-p50-µs")
	b.ReportMetric(p50(baseline.d), "nosync-p50-µs")
	b.ReportMetric(p50(durable.d)/p50(baseline.d), "p50-ratio")
	b.ReportMetric(durable.rate, "fsync-allocs/s")
	b.ReportMetric(baseline.rate, "nosync-allocs/s")
	b.ReportMetric(durable.rate/baseline.rate, "concurrent-ratio")
}
