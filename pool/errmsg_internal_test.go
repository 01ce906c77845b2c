package pool

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// TestAnswersBlameNoPoold: the daemon's answers about a far node it cannot
// reach, or about a segment changing under a request, match
// ErrUnavailable (clients retry on it) and say what happened, but never
// ask whether poold runs: the daemon that answers them is up.
func TestAnswersBlameNoPoold(t *testing.T) {
	p := newTestPool(t, testConfig(t)) // gossips with nobody
	t.Cleanup(func() { p.close() })
	p.openSession("s", "errmsg-client", "", "errmsg", 1, 0)
	client, err := p.callerFor("s")
	require.NoError(t, err)
	homes := make([]homeRef, 6)
	homes[0].State = poolv1.HomeState_HOME_STATE_LOST
	homes[2].Node, homes[2].State = "n3", poolv1.HomeState_HOME_STATE_UNREACHABLE
	p.mu.Lock()
	p.segs[7] = &record{ID: 7, Size: 4 << 20, Owner: "errmsg-client", Redundancy: redundancy{Data: 4, Parity: 2}, Homes: homes}
	p.mu.Unlock()
	ended, cancel := context.WithCancel(t.Context())
	cancel()
	for _, tc := range []struct {
		name string
		err  func() error
		want error
	}{
		{"lost shard write, its home unreachable", func() error {
			_, err := p.lostShardSubject(client, &poolv1.WriteLostShardRequest{Id: 7, Shard: 2, Data: []byte("x")})
			return err
		}, errs.ErrHomeUnreachable},
		{"session with a node, no gossip", func() error {
			_, err := p.homeSession(t.Context(), "n2", "target")
			return err
		}, errs.ErrHomeUnreachable},
		{"wait for a move that goes on", func() error {
			require.True(t, p.moving.begin(7))
			defer p.moving.end(7)
			return p.moving.awaitIdle(ended, 7)
		}, errs.ErrSegmentChanging},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err()
			t.Log(err)
			require.ErrorIs(t, err, errs.ErrUnavailable)
			require.ErrorIs(t, err, tc.want)
			require.NotContains(t, err.Error(), "is poold running")
		})
	}
}
