package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPickRebalance: the rebalancer moves the largest segment that fits
// in the excess (fewest moves, no overshoot), none when none fits, and
// leaves a segment whose move failed alone until its pause ends.
func TestPickRebalance(t *testing.T) {
	now := time.Unix(1000, 0)
	items := []evacItem{{id: 1, size: 4 << 20}, {id: 2, size: 16 << 20}, {id: 3, size: 8 << 20}}
	pick := func(excess int64, failed map[uint64]time.Time) uint64 {
		it, ok := pickRebalance(append([]evacItem(nil), items...), excess, failed, now)
		if !ok {
			return 0
		}
		return it.id
	}
	require.EqualValues(t, 3, pick(10<<20, nil), "the largest that fits")
	require.EqualValues(t, 2, pick(64<<20, nil))
	require.Zero(t, pick(1<<20, nil), "none fits: none moves")
	require.EqualValues(t, 1, pick(10<<20, map[uint64]time.Time{3: now.Add(time.Second)}), "a failed one waits")
	failed := map[uint64]time.Time{3: now.Add(-time.Second)}
	require.EqualValues(t, 3, pick(10<<20, failed), "until its pause ends")
	require.Empty(t, failed, "and is forgotten then")
	_, ok := pickRebalance(nil, 1, nil, now)
	require.False(t, ok)
}
