package logsample

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// at returns a clock stopped at t.
func at(t time.Time) func() time.Time { return func() time.Time { return t } }

// TestSampler: a flood of one key within an Interval lets one line
// through, the next line after it says how many were held back, and each
// key has its own budget.
func TestSampler(t *testing.T) {
	var s Sampler[string]
	t0 := time.Unix(1000, 0)
	s.SetClock(at(t0))
	n, ok := s.Take("a")
	require.True(t, ok)
	require.Zero(t, n)
	for i := range 999 {
		s.SetClock(at(t0.Add(time.Duration(i) * time.Millisecond)))
		_, ok := s.Take("a")
		require.False(t, ok)
	}
	n, ok = s.Take("b")
	require.True(t, ok, "each key has its own budget")
	require.Zero(t, n)
	s.SetClock(at(t0.Add(Interval)))
	n, ok = s.Take("a")
	require.True(t, ok)
	require.Equal(t, 999, n)
	_, ok = s.Take("a")
	require.False(t, ok)
}

// TestSamplerKeysBounded: a flood of distinct keys remembers at most
// maxKeys of them and, once they are taken, lets through one more line per
// Interval for all the others; keys an Interval old make room again.
func TestSamplerKeysBounded(t *testing.T) {
	var s Sampler[string]
	t0 := time.Unix(1000, 0)
	s.SetClock(at(t0))
	lines := 0
	for i := range 10 * maxKeys {
		if _, ok := s.Take(fmt.Sprint(i)); ok {
			lines++
		}
	}
	require.Equal(t, maxKeys+1, lines)
	require.Len(t, s.keys, maxKeys)

	s.SetClock(at(t0.Add(Interval)))
	n, ok := s.Take("new")
	require.True(t, ok, "the stale keys were forgotten")
	require.Zero(t, n)
	require.Len(t, s.keys, 1)
}

// TestSamplerFlush: Flush hands over the count of lines held back and
// forgets it, without opening the key's budget early; other keys keep
// theirs.
func TestSamplerFlush(t *testing.T) {
	var s Sampler[string]
	t0 := time.Unix(1000, 0)
	s.SetClock(at(t0))
	require.Zero(t, s.Flush("a"), "an unknown key held nothing back")
	for range 10 {
		s.Take("a")
		s.Take("b")
	}
	require.Equal(t, 9, s.Flush("a"))
	require.Zero(t, s.Flush("a"))
	_, ok := s.Take("a")
	require.False(t, ok, "a flush does not open the budget within the Interval")
	s.SetClock(at(t0.Add(Interval)))
	n, ok := s.Take("a")
	require.True(t, ok)
	require.Equal(t, 1, n, "only the line held back after the flush")
	n, ok = s.Take("b")
	require.True(t, ok)
	require.Equal(t, 9, n)
}
