package pool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
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
	require.NoError(t, p.st.switchMove(&next, in)())
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

// TestMappers: who maps a load/store segment, as a demotion counts them:
// each client handed its descriptor until it lets go, while it holds a
// session or its lease runs; no descriptor is handed out while the
// segment moves; and after a restart its owner and attachers, presumed to
// map it until they let go or one lease has passed without them.
func TestMappers(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	p.openSession("s-app", "app", "", "app", 1, 0)
	p.openSession("s-reader", "reader", "", "reader", 2, 0)
	// Two clients of one identity: the reader may attach what app made.
	app, reader := caller{client: p.clients["app"], ident: "cn:app"}, caller{client: p.clients["reader"], ident: "cn:app"}
	r, err := p.Alloc(t.Context(), app, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "mapped"})
	require.NoError(t, err)
	_, err = p.Attach(reader, "mapped")
	require.NoError(t, err)
	for _, c := range []caller{app, reader} {
		b, err := p.Backing(c, r.ID)
		require.NoError(t, err)
		b.File.Close()
	}
	mappers := func(except caller) []string {
		p.mu.Lock()
		defer p.mu.Unlock()
		var ids []string
		for _, m := range p.mappersOf(r.ID, except) {
			ids = append(ids, m.client)
		}
		return ids
	}
	require.Equal(t, []string{"reader"}, mappers(app))
	require.Equal(t, []string{"app", "reader"}, mappers(admin()))

	require.True(t, p.moving.begin(r.ID))
	_, err = p.Backing(reader, r.ID)
	require.ErrorIs(t, err, errs.ErrLimit, "no descriptor while it moves")
	p.moving.end(r.ID)

	p.Unmapped(reader, r.ID)
	require.Empty(t, mappers(app), "the reader let go")
	p.closeSession("s-app")
	p.closeSession("s-reader")
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	defer p.close()
	require.Equal(t, []string{"app", "reader"}, mappers(admin()), "presumed after a restart")
	p.Unmapped(caller{client: &client{id: "reader"}}, r.ID)
	require.Equal(t, []string{"app"}, mappers(admin()))
	start := p.started
	p.now = func() time.Time { return start.Add(cfg.LeaseTTL + restartGrace + time.Second) }
	p.reap()
	require.Empty(t, mappers(admin()), "the owner stayed away past its lease")
}
