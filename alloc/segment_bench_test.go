package alloc_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
)

// BenchmarkSegmentIO times one 64-byte ReadAt, WriteAt and Add64 on a
// segment of each backend: mapped (cxl: guarded against faults; local:
// not) and remote (rdma, over loopback to the local daemon's data plane).
// It is the per-call cost of Segment's dispatch plus the access itself;
// compare two builds with benchstat.
func BenchmarkSegmentIO(b *testing.B) {
	_, c := startPool(b)
	const n = 1 << 20
	p := make([]byte, 64)
	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierLocal, alloc.TierRDMA} {
		seg, err := c.Alloc(b.Context(), n, alloc.WithTier(tier), alloc.WithPopulate())
		require.NoError(b, err)
		b.Run(tier.String()+"/ReadAt64", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, err := seg.ReadAt(p, int64(i*64)%n); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tier.String()+"/WriteAt64", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, err := seg.WriteAt(p, int64(i*64)%n); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(tier.String()+"/Add64", func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				if _, err := seg.Add64(int64(i*64)%n, 1); err != nil {
					b.Fatal(err)
				}
			}
		})
		require.NoError(b, seg.Free(b.Context()))
	}
}
