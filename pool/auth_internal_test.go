package pool

import (
	"errors"
	"log/slog"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestDataPlaneTenants: the data plane counts a principal's reply-cache
// sessions against the identity its credential was issued for, so one
// identity's client ids share one tenant; a delegated credential's
// identity is its own across the cluster when a certificate proved it,
// and scoped to the delegating peer otherwise (a uid names someone only
// on its host). A principal without a live credential has none.
func TestDataPlaneTenants(t *testing.T) {
	var a auth
	a.issue("s-1", "mallory-1", "cn:mallory")
	a.issue("s-2", "mallory-2", "cn:mallory")
	a.issue("s-3", "bob", "uid:1000")
	_, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000")
	require.NoError(t, err)
	_, err = a.delegate("s-peer-b", "poold/b", "app", "uid:1000")
	require.NoError(t, err)
	_, err = a.delegate("s-peer-a", "poold/a", "mallory-3", "cn:mallory")
	require.NoError(t, err)
	a.issue("s-4", "poold/c", "cn:c") // peer c's own session, which forwards
	a.issue("s-5", "c-named", "cn:c") // a client whose certificate names node c
	a.issue("s-6", "open-1", identityInsecure)
	_, err = a.delegate("s-peer-a", "poold/a", "open-2", identityInsecure)
	require.NoError(t, err)

	for principal, want := range map[string]string{
		"mallory-1":         "cn:mallory",
		"mallory-2":         "cn:mallory",
		"poold/a/mallory-3": "cn:mallory",
		"bob":               "uid:1000",
		"poold/a/app":       "poold/a uid:1000",
		"poold/b/app":       "poold/b uid:1000",
		"nobody-here":       "",
		"poold/c":           "", // its own share, not one with c-named
		"c-named":           "cn:c",
		"open-1":            "", // --insecure proves no identity
		"poold/a/open-2":    "",
	} {
		require.Equal(t, want, a.tenant(principal), principal)
	}
	a.revokeSession("s-1")
	require.Empty(t, a.tenant("mallory-1"), "a revoked credential names no tenant")
}

// TestDelegateRebound: a home asked again for the credential of a peer's
// client id returns the one it issued while the peer proves the same
// identity for it; once the peer proves another (the id was reaped there
// and bound anew), the old credential is withdrawn and a new one names
// the new identity.
func TestDelegateRebound(t *testing.T) {
	var a auth
	c1, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000")
	require.NoError(t, err)
	again, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000")
	require.NoError(t, err)
	require.Equal(t, c1, again)
	c2, err := a.delegate("s-peer-a", "poold/a", "app", "uid:2000")
	require.NoError(t, err)
	require.NotEqual(t, c1, c2)
	require.NoError(t, a.authenticate(c2))
	require.Error(t, a.authenticate(c1), "the credential of the old identity is withdrawn")
	require.Equal(t, "poold/a uid:2000", a.tenant("poold/a/app"))
	require.Equal(t, 1, a.delegated["s-peer-a"], "the peer session holds one delegated credential")
}

// TestDelegateReboundCutsConnections: the data-plane connections opened
// with a delegated credential are closed once the peer's client id is
// delegated for another identity, whether the old credential was still
// live or went with an earlier session of the peer; a new credential for
// the same identity leaves them open.
func TestDelegateReboundCutsConnections(t *testing.T) {
	var a auth
	srv := tcp.NewServer(tcp.ServerConfig{Identify: a.identify, Tenant: a.tenant, Logger: slog.New(slog.DiscardHandler)})
	a.disconnect = srv.Disconnect
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(l)
	defer srv.Close()
	mem := make([]byte, 4096)
	key, err := srv.Export(1, mem, 1)
	require.NoError(t, err)
	region := rdma.Region{Segment: 1, Key: key, Epoch: 1}
	ctx := t.Context()
	connect := func(cred []byte) *tcp.Client {
		c, err := tcp.Dial(ctx, l.Addr().String(), tcp.WithCredential(cred), tcp.WithConns(1))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.Read(ctx, region, 0, make([]byte, 8)))
		return c
	}
	closed := func(c *tcp.Client) bool {
		return errors.Is(c.Read(ctx, region, 0, make([]byte, 8)), rdma.ErrClosed)
	}

	c1, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000")
	require.NoError(t, err)
	first := connect(c1)
	// The peer's session ends and comes back: a new credential, the
	// same identity; the connection stays.
	a.revokeSession("s-peer-a")
	c2, err := a.delegate("s-peer-a2", "poold/a", "app", "uid:1000")
	require.NoError(t, err)
	require.NotEqual(t, c1, c2)
	require.False(t, closed(first), "a new credential of the same identity keeps its connections")
	second := connect(c2)

	// The id is bound to another identity there: both earlier
	// connections go, the one of a withdrawn session's credential too.
	c3, err := a.delegate("s-peer-a2", "poold/a", "app", "uid:2000")
	require.NoError(t, err)
	require.True(t, closed(first), "the connection of an earlier session's credential of uid:1000")
	require.True(t, closed(second), "the connection of uid:1000's live credential")
	connect(c3)

	// The peer's earlier session is still open at the home (half-open,
	// say) when the id is delegated for another identity over a new
	// one: the old identity's credential over it is withdrawn too, and
	// its connection cut.
	k1, err := a.delegate("s-peer-b1", "poold/b", "app", "uid:1000")
	require.NoError(t, err)
	old := connect(k1)
	k2, err := a.delegate("s-peer-b2", "poold/b", "app", "uid:2000")
	require.NoError(t, err)
	require.Error(t, a.authenticate(k1), "the old identity's credential over the earlier session is withdrawn")
	require.True(t, closed(old))
	principal, tenant, err := a.identify(k2, nil)
	require.NoError(t, err)
	require.Equal(t, [2]string{"poold/b/app", "poold/b uid:2000"}, [2]string{principal, tenant}, "the tenant is the presented credential's")

	// --insecure proves no identity: a new credential for it keeps the
	// connections of the earlier one; one for a proved identity cuts them.
	o1, err := a.delegate("s-peer-a2", "poold/a", "open", identityInsecure)
	require.NoError(t, err)
	open := connect(o1)
	a.revokeSession("s-peer-a2")
	_, err = a.delegate("s-peer-a3", "poold/a", "open", identityInsecure)
	require.NoError(t, err)
	require.False(t, closed(open), "--insecure's connections stay")
	_, err = a.delegate("s-peer-a3", "poold/a", "open", "uid:3000")
	require.NoError(t, err)
	require.True(t, closed(open), "and go once the name is delegated for a proved identity")
}

// TestDelegateOverEndedSession: a delegated credential asked for over a
// peer session that ended before it was issued is not left live (the
// session's end withdrew the credentials it knew of).
func TestDelegateOverEndedSession(t *testing.T) {
	p := newTestPool(t, testConfig(t))
	defer p.close()
	sessionCaller(t, p, "s-peer", "poold/a", 1, 0)
	live, err := p.delegate("s-peer", "poold/a", "app", "uid:1000")
	require.NoError(t, err)
	require.NoError(t, p.auth.authenticate(live))
	// The peer's stream ends (server.go: closeSession, then revokeSession).
	p.closeSession("s-peer")
	p.auth.revokeSession("s-peer")
	require.Error(t, p.auth.authenticate(live))
	late, err := p.delegate("s-peer", "poold/a", "app", "uid:1000")
	require.ErrorIs(t, err, errs.ErrLeaseExpired)
	require.Nil(t, late)
	require.Empty(t, p.auth.delegated, "nothing counted for the ended session")
	for k, c := range p.auth.creds {
		require.NotEqual(t, "s-peer", c.session, "credential %x of the ended session is live", k)
	}
}
