package listener

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/logsample"
)

// TestRefusalsSampled: a hundred slots refused within a logsample.Interval,
// from two sources, log one warning; the next refusal, an Interval later,
// logs one that says how many were held back. Every refusal reaches
// OnRefuse.
func TestRefusalsSampled(t *testing.T) {
	var logs bytes.Buffer
	refused := 0
	s, err := NewSlots(Limits{Name: "metrics", Total: 2, PerSource: 1, OnRefuse: func(string) { refused++ },
		Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))})
	require.NoError(t, err)
	t0 := time.Unix(1000, 0)
	s.warn.SetClock(func() time.Time { return t0 })
	require.True(t, s.Acquire("a"))
	require.True(t, s.Acquire("b"))
	for i := range 100 {
		require.False(t, s.Acquire([]string{"a", "b"}[i%2]))
	}
	require.Equal(t, 1, strings.Count(logs.String(), "refused a connection: limit reached"), logs.String())
	require.Contains(t, logs.String(), "suppressed_since_last=0")

	s.warn.SetClock(func() time.Time { return t0.Add(logsample.Interval) })
	require.False(t, s.Acquire("a"))
	require.Equal(t, 101, refused)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 2)
	require.Contains(t, lines[1], "source=a")
	require.Contains(t, lines[1], "suppressed_since_last=99")
}
