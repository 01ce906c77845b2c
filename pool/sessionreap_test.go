package pool

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
)

// TestSessionAcrossReap: a client whose lease lapsed reconnects, and the
// reap that reclaims its last segment runs between its new session's bind
// and the session's start. That reap forgets the client id's binding (it
// holds nothing now), yet the new session serves the client: it is not
// refused on every call as a session of another identity's.
func TestSessionAcrossReap(t *testing.T) {
	cfg := testConfig(t)
	var d *Daemon
	second := make(chan struct{})
	cfg.sim.sessionBound = func(id string) {
		select {
		case <-second:
		default:
			return // the first session
		}
		// The lease of the first session runs out meanwhile; the daemon's
		// reaper (every LeaseTTL/4) reclaims the segment.
		require.Eventually(t, func() bool {
			return !slices.ContainsFunc(d.pool.List(), func(r record) bool { return r.Owner == id })
		}, 10*time.Second, 5*time.Millisecond, "the lapsed lease is not reaped")
	}
	var err error
	d, err = Start(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	dial := func() *session.Conn {
		s, err := session.Dial(t.Context(), "unix", cfg.Socket, session.Options{ClientID: "app"})
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return s
	}
	alloc := func(s *session.Conn) error {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		cctx, _, err := s.Call(ctx)
		require.NoError(t, err)
		_, err = s.API().Alloc(cctx, &poolv1.AllocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL})
		return errs.FromStatus(err)
	}
	first := dial()
	require.NoError(t, alloc(first))
	require.NoError(t, first.Close())
	close(second)
	s := dial()
	require.NoError(t, alloc(s), "the session opened across the reap serves its client")
	require.NotEmpty(t, d.pool.credentials().identity("app"), "the client id is bound again")
}
