package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMoveRate: a daemon with a move rate (--move-rate) paces the copy of
// a move it directs: a segment moved at the least rate counts all its
// bytes against it (the pacer's schedule ends at least the segment's size
// at that rate after the move began), and arrives whole at its new home.
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
	rate.mu.Lock()
	next := rate.next
	rate.mu.Unlock()
	require.GreaterOrEqual(t, next.Sub(began), time.Duration(float64(handoverSize)/float64(minMoveRate)*float64(time.Second)),
		"the copy's bytes went through the pacer")
	r, err := oh.daemon().pool.Stat(seg.ID())
	require.NoError(t, err)
	require.NotEqual(t, from, r.Home, "moved")
	got := make([]byte, handoverSize)
	_, err = seg.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, before, got)
}
