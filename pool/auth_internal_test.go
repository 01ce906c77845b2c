package pool

import (
	"testing"

	"github.com/stretchr/testify/require"
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
