package alloc_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/testfs"
)

// BenchmarkAllocFreeFsync measures what durable metadata costs, and that a
// segment in volatile memory does not pay it: three daemons run side by
// side and every iteration does one Alloc + Free of 64 KiB on the cxl tier
// of each, in turn (in a random order each time):
//
//   - pmem: the default (fsync), on a devdax device of a pmem region (the
//     lab guest's sysfs tree, a file on /dev/shm standing in for the
//     device), whose records are fsynced at every commit, as every
//     segment's were before records followed their memory's durability;
//   - volatile: the default, on the emulated CXL device (volatile memory),
//     whose records are committed without an fsync;
//   - nosync: --metadata-fsync=false (the unsafe baseline), emulated CXL.
//
// Metrics: the p50 of each in µs, "volatile-ratio" (volatile / nosync,
// target <= 1.5) and "pmem-ratio" (pmem / nosync); then 8 clients allocate
// and free concurrently on each daemon, giving "allocs/s" of each and
// their ratios to nosync's (concurrent commits share an fsync). The devdax device's extents are 2 MiB, which Create
// zeroes, so the pmem side also pays for zeroing 2 MiB.
func BenchmarkAllocFreeFsync(b *testing.B) {
	type side struct {
		name    string
		clients []*alloc.Client
		d       []time.Duration
		rate    float64
	}
	const clients = 8
	start := func(name string, fsync, pmem bool) *side {
		cfg := pooltest.Config(b)
		cfg.EmulateCXL = 256 * size.MiB
		cfg.MetadataFsync = fsync
		if pmem {
			cfg.SysfsRoot = "../cxl/testdata/qemu-devdax"
			cfg.DevRoot = pooltest.ShmDir(b)
			cfg.AllowDevdaxFD = true
			testfs.DevdaxStandIns(b, cfg.SysfsRoot, cfg.DevRoot)
		}
		pooltest.Start(b, cfg)
		s := &side{name: name}
		for range clients {
			c, err := alloc.Dial(b.Context(), cfg.Socket)
			require.NoError(b, err)
			b.Cleanup(func() { c.Close() })
			s.clients = append(s.clients, c)
		}
		return s
	}
	pmem, volatile, nosync := start("pmem", true, true), start("volatile", true, false), start("nosync", false, false)
	sides := []*side{pmem, volatile, nosync}
	pair := func(ctx context.Context, c *alloc.Client) error {
		seg, err := c.Alloc(ctx, 64<<10, alloc.WithTier(alloc.TierCXL))
		if err != nil {
			return err
		}
		return seg.Free(ctx)
	}
	ctx := b.Context()
	b.ResetTimer()
	// Each iteration takes the sides in a random order, so that each
	// follows the pmem side's fsync (and whatever the filesystem journal
	// does after it) equally often.
	order := slices.Clone(sides)
	for b.Loop() {
		rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		for _, s := range order {
			t0 := time.Now()
			if err := pair(ctx, s.clients[0]); err != nil {
				b.Fatal(err)
			}
			s.d = append(s.d, time.Since(t0))
		}
	}
	b.StopTimer()
	const perClient = 200
	for _, s := range sides {
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
	for _, s := range sides {
		b.ReportMetric(p50(s.d), s.name+"-p50-µs")
		b.ReportMetric(s.rate, s.name+"-allocs/s")
	}
	b.ReportMetric(p50(volatile.d)/p50(nosync.d), "volatile-ratio")
	b.ReportMetric(p50(pmem.d)/p50(nosync.d), "pmem-ratio")
	b.ReportMetric(volatile.rate/nosync.rate, "volatile-concurrent-ratio")
	b.ReportMetric(pmem.rate/nosync.rate, "pmem-concurrent-ratio")
}
