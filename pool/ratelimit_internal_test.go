package pool

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRateLimitGivesTurnBack: a wait given up (its context ended before
// its turn) gives its turn back, so the waits after it are not held up by
// bytes that never went; a charge for bytes that went stays.
func TestRateLimitGivesTurnBack(t *testing.T) {
	l := &rateLimit{perSec: 1 << 20}
	require.NoError(t, l.wait(t.Context(), 1<<20), "the first goes at once")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	require.ErrorIs(t, l.wait(ctx, 10<<20), context.Canceled)
	l.mu.Lock()
	next := l.next
	l.mu.Unlock()
	require.Less(t, time.Until(next), 2*time.Second, "the next turn is the first one's end, not 10 s later")

	require.ErrorIs(t, l.paid(ctx, 10<<20), context.Canceled)
	l.mu.Lock()
	next = l.next
	l.mu.Unlock()
	require.Greater(t, time.Until(next), 9*time.Second, "the 10 MiB that went are charged")
}
