package alloc_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
)

// TestCallsFailWhileDaemonAway: while poold is down, calls without a
// deadline fail with ErrUnavailable (after the dial timeout) instead of
// waiting for it forever; when a daemon is back on the same socket and data
// directory, the same Client reconnects by itself and still owns its
// segment, bytes included.
func TestCallsFailWhileDaemonAway(t *testing.T) {
	cfg := pooltest.Config(t)
	d := pooltest.Start(t, cfg)
	c := dial(t, cfg.Socket, alloc.WithClientID("away"), alloc.WithDialTimeout(300*time.Millisecond))
	ctx := context.Background()
	seg, err := c.Alloc(ctx, 4096, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	want := bytes.Repeat([]byte{7}, 4096)
	_, err = seg.WriteAt(want, 0)
	require.NoError(t, err)
	require.NoError(t, d.Close())

	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"alloc", func() error { _, err := c.Alloc(ctx, 4096); return err }},
		{"tiers", func() error { _, err := c.Tiers(ctx); return err }},
		{"open", func() error { _, err := c.Open(ctx, seg.ID()); return err }},
		{"free by id", func() error { return c.FreeByID(ctx, seg.ID()) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := make(chan error, 1)
			go func() { done <- tc.call() }()
			select {
			case err := <-done:
				require.ErrorIs(t, err, alloc.ErrUnavailable)
			case <-time.After(time.Minute):
				t.Fatal("the call is still waiting for the daemon after a minute")
			}
		})
	}

	pooltest.Start(t, cfg)
	var again *alloc.Segment
	require.Eventually(t, func() bool {
		again, err = c.Open(ctx, seg.ID())
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "the client did not reconnect")
	got := make([]byte, len(want))
	_, err = again.ReadAt(got, 0)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.NoError(t, again.Free(ctx))
}
