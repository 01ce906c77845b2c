package pool

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestReapWithdrawsDelegations: when a daemon's reap forgets a client id
// whose lease ran out, the homes that delegated it a credential withdraw
// it and close the data-plane connections opened with it, which would
// otherwise act for whoever binds the id at that daemon next.
func TestReapWithdrawsDelegations(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 2, leaseTTL: 2 * time.Second})
	origin, home, kept, _ := startOwnerAndHome(t, sc)
	ctx := t.Context()

	require.NoError(t, origin.pool.auth.bind("app", "uid:1000"))
	origin.pool.openSession("s-app", "app", "", "app", 1, 1000)
	cred := origin.delegatedCred(ctx, home.cfg.Node, "app")
	require.NotNil(t, cred)
	conn, err := tcp.Dial(ctx, home.pool.dp.addr, tcp.WithCredential(cred), tcp.WithConns(1))
	require.NoError(t, err)
	defer conn.Close()
	region := rdma.Region{Segment: kept.HomeID, Key: kept.Key, Epoch: kept.Epoch}
	require.ErrorIs(t, conn.Read(ctx, region, 0, make([]byte, 8)), rdma.ErrAccessDenied, "connected: the segment is not app's")

	// The client goes (its session ends as the server ends it) and its
	// lease runs out at the origin.
	origin.pool.closeSession("s-app")
	origin.pool.auth.revokeSession("s-app")
	require.Eventually(t, func() bool { return origin.pool.auth.identity("app") == "" }, time.Minute, 50*time.Millisecond, "the origin reaps app")
	require.Eventually(t, func() bool { return home.pool.auth.authenticate(cred) != nil }, time.Minute, 50*time.Millisecond,
		"the home withdraws the credential it delegated to app")
	require.True(t, errors.Is(conn.Read(ctx, region, 0, make([]byte, 8)), rdma.ErrClosed), "and closes its connection")
}
