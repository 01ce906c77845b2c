package tcp

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// recorder is an Observe hook that keeps what it sees.
type recorder struct {
	mu  sync.Mutex
	obs []Observation
}

func (r *recorder) observe(o Observation) {
	r.mu.Lock()
	r.obs = append(r.obs, o)
	r.mu.Unlock()
}

func (r *recorder) take() []Observation {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.obs
	r.obs = nil
	return out
}

func TestObserve(t *testing.T) {
	var rec recorder
	s := startServer(t, ServerConfig{Observe: rec.observe})
	_, r := s.export(t, 3, 1<<16)
	c := dial(t, s.addr)
	ctx := t.Context()
	wrongKey := r
	wrongKey.Key[0] ^= 1

	tests := []struct {
		name string
		do   func() error
		want Observation
	}{
		{"read", func() error { return c.Read(ctx, r, 0, make([]byte, 4096)) },
			Observation{Op: rdma.OpRead, Bytes: 4096, Status: StatusOK}},
		{"write", func() error { return c.Write(ctx, r, 8, make([]byte, 100)) },
			Observation{Op: rdma.OpWrite, Bytes: 100, Status: StatusOK}},
		{"cas", func() error { _, _, err := c.CompareAndSwap64(ctx, r, 8, 0, 1); return err },
			Observation{Op: rdma.OpCompareAndSwap, Bytes: 8, Status: StatusOK}},
		{"fadd", func() error { _, err := c.FetchAdd64(ctx, r, 16, 1); return err },
			Observation{Op: rdma.OpFetchAdd, Bytes: 8, Status: StatusOK}},
		{"read out of range", func() error { return c.Read(ctx, r, 1<<16, make([]byte, 1)) },
			Observation{Op: rdma.OpRead, Status: StatusOutOfRange}},
		{"write with a wrong key", func() error { return c.Write(ctx, wrongKey, 0, make([]byte, 64)) },
			Observation{Op: rdma.OpWrite, Status: StatusAccessDenied}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.do()
			require.Equal(t, tt.want.Status == StatusOK, err == nil, "err: %v", err)
			// The hook runs after the response is queued, so it may trail
			// the client's completion by a moment.
			var got []Observation
			require.Eventually(t, func() bool { got = append(got, rec.take()...); return len(got) > 0 }, 5*time.Second, time.Millisecond)
			require.Len(t, got, 1)
			require.GreaterOrEqual(t, got[0].Duration, time.Duration(0))
			got[0].Duration = 0
			require.Equal(t, tt.want, got[0])
		})
	}
}

func TestOpStatusString(t *testing.T) {
	for s, want := range map[OpStatus]string{
		StatusOK: "ok", StatusAccessDenied: "access_denied", StatusOutOfRange: "out_of_range",
		StatusSegmentLost: "segment_lost", StatusLeaseExpired: "lease_expired", StatusUnaligned: "unaligned",
		StatusUnsupported: "unsupported", OpStatus(99): "status_99",
	} {
		require.Equal(t, want, s.String())
	}
}

// BenchmarkObserveRead4KDepth16 measures what ServerConfig.Observe costs on
// the path of BenchmarkRead4KDepth16: the same reads against a server
// without the hook (the baseline) and one whose hook does what poold's
// metrics do per op (two Prometheus counters and a histogram),
// interleaved in rounds in the same run:
//
//	go test -run '^$' -bench ObserveRead4KDepth16 -benchtime 2s ./rdma/tcp
//
// "ratio" is hook reads/s over baseline reads/s.
func BenchmarkObserveRead4KDepth16(b *testing.B) {
	const (
		size  = 4 << 10
		depth = 16
	)
	ops := prometheus.NewCounter(prometheus.CounterOpts{Name: "ops"})
	bytes := prometheus.NewCounter(prometheus.CounterOpts{Name: "bytes"})
	dur := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "dur", Buckets: prometheus.ExponentialBuckets(250e-9, 4, 10)})
	var seen atomic.Uint64
	hook := func(o Observation) {
		seen.Add(1)
		ops.Inc()
		bytes.Add(float64(o.Bytes))
		dur.Observe(o.Duration.Seconds())
	}
	plain := startServer(b, ServerConfig{})
	hooked := startServer(b, ServerConfig{Observe: hook})
	_, rp := plain.export(b, 1, 64<<20)
	_, rh := hooked.export(b, 1, 64<<20)
	cp, ch := dial(b, plain.addr), dial(b, hooked.addr)
	bufs := make([][]byte, depth)
	for i := range bufs {
		bufs[i] = make([]byte, size)
	}
	parallelReads(b, cp, rp, bufs, 1000) // warm up both
	parallelReads(b, ch, rh, bufs, 1000)

	b.StopTimer()
	b.ReportAllocs()
	b.ResetTimer()
	var base, with time.Duration
	n := 0
	for _, k := range rounds(b.N, 20_000) {
		k = max(k, 1000)
		base += parallelReads(b, cp, rp, bufs, k)
		b.StartTimer()
		with += parallelReads(b, ch, rh, bufs, k)
		b.StopTimer()
		n += k
	}
	rate, baseRate := float64(n)/with.Seconds(), float64(n)/base.Seconds()
	b.ReportMetric(rate, "reads/s")
	b.ReportMetric(baseRate, "no-hook-reads/s")
	b.ReportMetric(rate/baseRate, "ratio")
	report(b, "4 KiB reads at depth 16 with an Observe hook: %.0f reads/s; without: %.0f reads/s; ratio %.3f; n=%d", rate, baseRate, rate/baseRate, n)
	require.Positive(b, seen.Load())
}
