package pool

import (
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/rdma"
)

// TestSwitchMoveVolatile: a segment demoted from this host's volatile
// memory keeps its record in the volatile file; the switch-over of its
// move within the rdma tier commits the record there and the intent,
// switched, in segments.db, and a restarted daemon takes the move up as
// switched.
func TestSwitchMoveVolatile(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	r := &record{ID: 9, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 4096, Owner: "app", Epoch: 1,
		Key: rdma.Key{1}, Home: "b", HomeID: 90, DataAddr: "127.0.0.1:1", Volatile: true}
	require.NoError(t, p.st.put(r))
	in := intent{ID: 9, From: "b", FromID: 90, To: "c", ToID: 900}
	require.NoError(t, p.st.putIntent(in))
	next := *r
	next.Home, next.HomeID, next.Key = "c", 900, rdma.Key{2}
	require.NoError(t, p.st.switchMove(&next, in))
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	defer p.close()
	in.Switched = true
	require.Equal(t, []intent{in}, p.leftMoves)
	rec, err := p.Stat(9)
	require.NoError(t, err)
	require.Equal(t, "c", rec.Home)
	require.True(t, rec.Volatile, "still in the volatile file")
}
