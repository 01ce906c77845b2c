package pool

import (
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// TestGrantsMigration: a named record written before grants existed gets,
// at start, its owner's identity as creator and the identities of the
// clients that had attached it as grants, committed once; so sharing that
// worked goes on, and another identity is refused. A record whose owner's
// identity is unknown (an administrator's) admits only administrators and
// its past attachers.
func TestGrantsMigration(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	for id, ident := range map[string]string{"app": "uid:1000", "reader": "cn:reader", "other": "cn:other"} {
		require.NoError(t, p.auth.bind(id, ident))
	}
	p.openSession("s1", "app", "app", 1, 1000)
	app, err := p.callerFor("s1")
	require.NoError(t, err)
	shared, err := p.Alloc(t.Context(), app, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "shared"})
	require.NoError(t, err)
	orphan, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "orphan"})
	require.NoError(t, err)
	require.NoError(t, p.close())

	// Rewrite both as an older poold wrote them: no grant fields, and the
	// reader attached.
	st, err := openStore(cfg.DataDir, false)
	require.NoError(t, err)
	for _, r := range []*record{shared, orphan} {
		r.Creator, r.Allow, r.AllowFree, r.Grants = "", nil, nil, false
		r.Attached = []string{"reader"}
		require.NoError(t, st.put(r))
	}
	require.NoError(t, st.close())

	p = newTestPool(t, cfg)
	defer p.close()
	got, err := p.Stat(shared.ID)
	require.NoError(t, err)
	require.Equal(t, "uid:1000", got.Creator)
	require.Equal(t, []string{"cn:reader"}, got.Allow)
	require.True(t, got.Grants)
	got, err = p.Stat(orphan.ID)
	require.NoError(t, err)
	require.Empty(t, got.Creator)
	require.Equal(t, []string{"cn:reader"}, got.Allow)

	err = p.st.fileFor(shared).db.View(func(tx *bolt.Tx) error {
		r, _, err := decodeRecord(tx.Bucket(bucketSegments).Get(idKey(shared.ID)))
		require.NoError(t, err)
		require.Equal(t, "uid:1000", r.Creator, "the migration is committed")
		return nil
	})
	require.NoError(t, err)

	as := func(clientID, ident string) caller {
		return caller{client: &client{id: clientID}, ident: ident}
	}
	for _, name := range []string{"shared", "orphan"} {
		_, err = p.Attach(as("reader-2", "cn:reader"), name)
		require.NoError(t, err, "a past attacher's identity keeps access to %s", name)
		_, err = p.Attach(as("other", "cn:other"), name)
		require.ErrorIs(t, err, errs.ErrAccessDenied, name)
	}
	_, err = p.Attach(as("app-2", "uid:1000"), "shared")
	require.NoError(t, err, "the owner's identity is the creator")
	_, err = p.Attach(admin(), "orphan")
	require.NoError(t, err)
}
