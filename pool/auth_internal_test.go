package pool

import (
	"encoding/binary"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

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
	_, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 0)
	require.NoError(t, err)
	_, err = a.delegate("s-peer-b", "poold/b", "app", "uid:1000", 0)
	require.NoError(t, err)
	_, err = a.delegate("s-peer-a", "poold/a", "mallory-3", "cn:mallory", 0)
	require.NoError(t, err)
	a.issue("s-4", "poold/c", "cn:c") // peer c's own session, which forwards
	a.issue("s-5", "c-named", "cn:c") // a client whose certificate names node c
	a.issue("s-6", "open-1", identityInsecure)
	_, err = a.delegate("s-peer-a", "poold/a", "open-2", identityInsecure, 0)
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
	c1, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 0)
	require.NoError(t, err)
	again, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 0)
	require.NoError(t, err)
	require.Equal(t, c1, again)
	c2, err := a.delegate("s-peer-a", "poold/a", "app", "uid:2000", 0)
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
	connect, closed := dataPlaneOf(t, &a)

	c1, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 0)
	require.NoError(t, err)
	first := connect(c1)
	// The peer's session ends and comes back: a new credential, the
	// same identity; the connection stays.
	a.revokeSession("s-peer-a")
	c2, err := a.delegate("s-peer-a2", "poold/a", "app", "uid:1000", 0)
	require.NoError(t, err)
	require.NotEqual(t, c1, c2)
	require.False(t, closed(first), "a new credential of the same identity keeps its connections")
	second := connect(c2)

	// The id is bound to another identity there: both earlier
	// connections go, the one of a withdrawn session's credential too.
	c3, err := a.delegate("s-peer-a2", "poold/a", "app", "uid:2000", 0)
	require.NoError(t, err)
	require.True(t, closed(first), "the connection of an earlier session's credential of uid:1000")
	require.True(t, closed(second), "the connection of uid:1000's live credential")
	connect(c3)

	// The peer's earlier session is still open at the home (half-open,
	// say) when the id is delegated for another identity over a new
	// one: the old identity's credential over it is withdrawn too, and
	// its connection cut.
	k1, err := a.delegate("s-peer-b1", "poold/b", "app", "uid:1000", 0)
	require.NoError(t, err)
	old := connect(k1)
	k2, err := a.delegate("s-peer-b2", "poold/b", "app", "uid:2000", 0)
	require.NoError(t, err)
	require.Error(t, a.authenticate(k1), "the old identity's credential over the earlier session is withdrawn")
	require.True(t, closed(old))
	principal, tenant, err := a.identify(k2, nil)
	require.NoError(t, err)
	require.Equal(t, [2]string{"poold/b/app", "poold/b uid:2000"}, [2]string{principal, tenant}, "the tenant is the presented credential's")

	// --insecure proves no identity: a new credential for it keeps the
	// connections of the earlier one; one for a proved identity cuts them.
	o1, err := a.delegate("s-peer-a2", "poold/a", "open", identityInsecure, 0)
	require.NoError(t, err)
	open := connect(o1)
	a.revokeSession("s-peer-a2")
	_, err = a.delegate("s-peer-a3", "poold/a", "open", identityInsecure, 0)
	require.NoError(t, err)
	require.False(t, closed(open), "--insecure's connections stay")
	_, err = a.delegate("s-peer-a3", "poold/a", "open", "uid:3000", 0)
	require.NoError(t, err)
	require.True(t, closed(open), "and go once the name is delegated for a proved identity")
}

// dataPlaneOf serves a data plane on loopback whose credentials are a's
// and returns how to connect to it with a credential (the connection reads
// once) and whether a connection was closed since.
func dataPlaneOf(t *testing.T, a *auth) (connect func(cred []byte) *tcp.Client, closed func(*tcp.Client) bool) {
	srv := tcp.NewServer(tcp.ServerConfig{Identify: a.identify, Tenant: a.tenant, Logger: slog.New(slog.DiscardHandler)})
	a.disconnect = srv.Disconnect
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	key, err := srv.Export(1, make([]byte, 4096), 1)
	require.NoError(t, err)
	region := rdma.Region{Segment: 1, Key: key, Epoch: 1}
	ctx := t.Context()
	connect = func(cred []byte) *tcp.Client {
		c, err := tcp.Dial(ctx, l.Addr().String(), tcp.WithCredential(cred), tcp.WithConns(1))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		require.NoError(t, c.Read(ctx, region, 0, make([]byte, 8)))
		return c
	}
	closed = func(c *tcp.Client) bool {
		return errors.Is(c.Read(ctx, region, 0, make([]byte, 8)), rdma.ErrClosed)
	}
	return connect, closed
}

// TestDelegateBindings: the peer says which of its bindings of a client
// id it asks for. A home delegates each binding a credential of its own,
// refuses a request for a binding older than one it delegated over the
// same session (it came late), and a withdrawal of a binding takes back
// that one's credentials and older ones, but cuts no connection while a
// later binding's credential stands; a withdrawal naming no binding (an
// older peer) takes back all and cuts all.
func TestDelegateBindings(t *testing.T) {
	var a auth
	connect, closed := dataPlaneOf(t, &a)

	c1, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 10)
	require.NoError(t, err)
	again, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 10)
	require.NoError(t, err)
	require.Equal(t, c1, again, "asked again for the same binding")
	first := connect(c1)

	// The peer reaped binding 10, and the same identity bound the id
	// again: a credential of its own, and the old one's connection,
	// which acts for the same identity, stays.
	c2, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 20)
	require.NoError(t, err)
	require.NotEqual(t, c1, c2)
	require.Error(t, a.authenticate(c1), "the old binding's credential is withdrawn")
	require.False(t, closed(first))
	second := connect(c2)

	// The withdrawal of binding 10, and a request for it, arrive late.
	a.undelegate("poold/a", "app", 10)
	_, err = a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 10)
	require.ErrorIs(t, err, errs.ErrLeaseExpired, "a request for an older binding over the same session")
	require.NoError(t, a.authenticate(c2), "binding 20's credential stands")
	require.False(t, closed(second), "and its connection")
	require.False(t, closed(first))
	require.Equal(t, 1, a.delegated["s-peer-a"], "the peer session holds one delegated credential")

	// The withdrawal of binding 20 takes it back and cuts both.
	a.undelegate("poold/a", "app", 20)
	require.Error(t, a.authenticate(c2))
	require.True(t, closed(first))
	require.True(t, closed(second))

	// A withdrawal naming no binding takes back every one.
	c3, err := a.delegate("s-peer-a", "poold/a", "app", "uid:1000", 30)
	require.NoError(t, err)
	third := connect(c3)
	a.undelegate("poold/a", "app", 0)
	require.Error(t, a.authenticate(c3))
	require.True(t, closed(third))
	require.Empty(t, a.delegated["s-peer-a"])
}

// TestBindingNumbers: each binding of a client id is numbered above the
// ones before it, also after the binding is forgotten and made again.
func TestBindingNumbers(t *testing.T) {
	var a auth
	require.NoError(t, a.bind("app", "uid:1000"))
	require.NoError(t, a.bind("other", "uid:2000"))
	ident, first := a.binding("app")
	require.Equal(t, "uid:1000", ident)
	_, other := a.binding("other")
	require.Greater(t, other, first)
	require.NoError(t, a.bind("app", "uid:1000"))
	_, same := a.binding("app")
	require.Equal(t, first, same, "a session of the same binding")
	require.Equal(t, first, a.forget("app"))
	require.Zero(t, a.forget("app"), "forgotten already")
	require.NoError(t, a.bind("app", "uid:1000"))
	_, next := a.binding("app")
	require.Greater(t, next, other)
}

// TestBindingNumbersAcrossRestart: a restarted daemon numbers its
// bindings above every number its previous run gave, also when its clock
// is behind the previous run's (here: a mark an hour ahead of the clock),
// and keeps the mark for the run after it.
func TestBindingNumbersAcrossRestart(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	require.NoError(t, p.auth.bind("app", "uid:1000"))
	ahead := uint64(time.Now().Add(time.Hour).UnixNano())
	require.NoError(t, p.st.update(func(tx *bolt.Tx) error {
		return putBindingMark(tx, binary.BigEndian.AppendUint64(nil, ahead))
	}, false))
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	_, loaded := p.auth.binding("app")
	require.Greater(t, loaded, ahead, "a binding loaded at start")
	require.NoError(t, p.auth.bind("new", "uid:1000"))
	_, made := p.auth.binding("new")
	require.Greater(t, made, loaded)
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	defer p.close()
	_, again := p.auth.binding("app")
	require.Greater(t, again, made, "the next run starts above this one's")
}

// TestDelegateOverEndedSession: a delegated credential asked for over a
// peer session that ended before it was issued is not left live (the
// session's end withdrew the credentials it knew of).
func TestDelegateOverEndedSession(t *testing.T) {
	p := newTestPool(t, testConfig(t))
	defer p.close()
	sessionCaller(t, p, "s-peer", "poold/a", 1, 0)
	live, err := p.delegate("s-peer", "poold/a", "app", "uid:1000", 0)
	require.NoError(t, err)
	require.NoError(t, p.auth.authenticate(live))
	// The peer's stream ends (server.go: closeSession, then revokeSession).
	p.closeSession("s-peer")
	p.auth.revokeSession("s-peer")
	require.Error(t, p.auth.authenticate(live))
	late, err := p.delegate("s-peer", "poold/a", "app", "uid:1000", 0)
	require.ErrorIs(t, err, errs.ErrLeaseExpired)
	require.Nil(t, late)
	require.Empty(t, p.auth.delegated, "nothing counted for the ended session")
	for k, c := range p.auth.creds {
		require.NotEqual(t, "s-peer", c.session, "credential %x of the ended session is live", k)
	}
}
