package verbs

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPollYield: a poller looks at the clock every yieldPolls crossings
// and yields when yieldEvery has passed since its last yield, after it
// released the poll mutex.
func TestPollYield(t *testing.T) {
	var mu sync.Mutex
	var now time.Duration
	yields, reads := 0, 0
	defer func(g func(), c func() time.Duration) { gosched, clock = g, c }(gosched, clock)
	gosched = func() {
		require.True(t, mu.TryLock(), "yielded while holding the poll mutex")
		mu.Unlock()
		yields++
	}
	clock = func() time.Duration { reads++; return now }
	var y pollYield
	cross := func(n int) {
		for range n {
			mu.Lock()
			y.unlock(&mu)
		}
	}
	cross(yieldPolls - 1)
	require.Zero(t, reads, "read the clock before %d crossings", yieldPolls)
	now = yieldEvery
	cross(1)
	require.Equal(t, 1, reads)
	require.Equal(t, 1, yields, "no yield %v after the start", yieldEvery)

	// Fast crossings: the clock has not moved on far enough.
	now += yieldEvery / 2
	cross(yieldPolls)
	require.Equal(t, 2, reads)
	require.Equal(t, 1, yields, "yielded %v after the last yield", yieldEvery/2)
	now += yieldEvery / 2
	cross(yieldPolls)
	require.Equal(t, 2, yields, "no yield %v after the last", yieldEvery)
	require.True(t, mu.TryLock(), "unlock left the poll mutex held")
}
