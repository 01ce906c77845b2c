package main

import (
	"encoding/json"
	"regexp"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
)

// TestSegmentsSharers: `memctl segments` counts a shared segment's
// attachments (alloc.Shared) that its home's directory heard from.
func TestSegmentsSharers(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	ctx := t.Context()
	var segs []*alloc.Segment
	for i := range 3 {
		c, err := alloc.Dial(ctx, cfg.Socket)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		if i == 0 {
			_, err = c.Alloc(ctx, 4096, alloc.WithName("board"), alloc.WithTier(alloc.TierRDMA))
			require.NoError(t, err)
			_, err = c.Alloc(ctx, 4096, alloc.WithName("plain"), alloc.WithTier(alloc.TierRDMA))
			require.NoError(t, err)
		}
		if i == 2 {
			break // a client that does not attach
		}
		s, err := c.Attach(ctx, "board", alloc.Shared())
		require.NoError(t, err)
		_, err = s.Load64(0)
		require.NoError(t, err)
		segs = append(segs, s)
	}

	out, _, code := memctl(t, cfg.Socket, "segments", "-o", "json")
	require.Zero(t, code)
	var list []segmentJSON
	require.NoError(t, json.Unmarshal([]byte(out), &list))
	got := map[string]uint32{}
	for _, s := range list {
		got[s.Name] = s.Sharers
	}
	require.Equal(t, map[string]uint32{"board": 2, "plain": 0}, got)

	out, _, code = memctl(t, cfg.Socket, "segments")
	require.Zero(t, code)
	require.Contains(t, out, "SHARERS")
	require.Regexp(t, regexp.MustCompile(`(?m)^\d+\s+board\s.*\s2\s+\S+$`), out)
	require.Regexp(t, regexp.MustCompile(`(?m)^\d+\s+plain\s.*\s-\s+\S+$`), out)
	for _, s := range segs {
		require.NoError(t, s.Shared().Detach(ctx))
	}
}
