package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
)

// TestMoveRate: a daemon with a move rate (--move-rate) paces the copy of
// a move it directs: a segment moved at the least rate counts all its
// bytes against it (the pacer's schedule ends at least the segment's size
// at that rate after the move began), and arrives whole at its new home;
// so does a segment demoted from the local tier.
func TestMoveRate(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 3, leaseTTL: 10 * time.Second})
	oh := sc.hosts[2]
	oh.cfg.MoveRate = minMoveRate
	c, seg, before := startHandover(t, sc, oh)
	from := seg.Node()
	began := time.Now()
	require.NoError(t, c.Move(t.Context(), seg))
	rate := oh.daemon().pool.moveRate
	require.NotNil(t, rate, "the daemon paces its moves")
	paced := func(since time.Time) time.Duration {
		rate.mu.Lock()
		defer rate.mu.Unlock()
		return rate.next.Sub(since)
	}
	least := time.Duration(float64(handoverSize) / float64(minMoveRate) * float64(time.Second))
	require.GreaterOrEqual(t, paced(began), least, "the copy's bytes went through the pacer")
	r, err := oh.daemon().pool.Stat(seg.ID())
	require.NoError(t, err)
	require.NotEqual(t, from, r.Home, "moved")
	got := make([]byte, handoverSize)
	_, err = seg.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, before, got)

	// A demotion from the local tier too.
	local, err := c.Alloc(t.Context(), handoverSize, alloc.WithTier(alloc.TierLocal))
	require.NoError(t, err)
	_, err = local.WriteAt(before, 0)
	require.NoError(t, err)
	began = time.Now()
	require.NoError(t, c.Move(t.Context(), local, alloc.ToTier(alloc.TierRDMA)))
	require.GreaterOrEqual(t, paced(began), least, "the demotion's bytes went through the pacer")
	_, err = local.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, before, got)
}
