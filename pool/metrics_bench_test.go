package pool

import (
	"testing"
	"time"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// BenchmarkObserveDataPlane is what poold's metrics add to each served
// data-plane operation: the hook alone, and with the two clock reads the
// server makes for it. Compare with a 4 KiB read at depth 16 (a few µs,
// BenchmarkRead4KDepth16 in rdma/tcp).
//
//	go test -run '^$' -bench ObserveDataPlane ./pool
func BenchmarkObserveDataPlane(b *testing.B) {
	m := newMetrics()
	o := tcp.Observation{Op: rdma.OpRead, Bytes: 4096, Duration: 1500 * time.Nanosecond, Status: tcp.StatusOK}
	b.Run("hook", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m.observeDataPlane(o)
		}
	})
	b.Run("clock+hook", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			start := time.Now()
			o.Duration = time.Since(start)
			m.observeDataPlane(o)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				m.observeDataPlane(o)
			}
		})
	})
}
