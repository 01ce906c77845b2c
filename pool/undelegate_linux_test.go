package pool

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestReapWithdrawsDelegations: when a daemon's reap forgets a client id
// whose lease ran out, the homes that delegated it a credential withdraw
// it and close the data-plane connections opened with it, which would
// otherwise act for whoever binds the id at that daemon next.
//
// The home fails the first withdrawals it is asked in one case (as a busy
// or cut-off one does): the origin asks again until it answers. In
// another it applies the withdrawal late, after the same identity bound
// the client id again at the origin and was delegated a credential: that
// one, and its connections, stay.
func TestReapWithdrawsDelegations(t *testing.T) {
	t.Run("answered", func(t *testing.T) { testReapWithdrawsDelegations(t, 0, false) })
	t.Run("failed twice", func(t *testing.T) { testReapWithdrawsDelegations(t, 2, false) })
	t.Run("applied after the client came back", func(t *testing.T) { testReapWithdrawsDelegations(t, 0, true) })
}

func testReapWithdrawsDelegations(t *testing.T, failures int64, late bool) {
	sc := newSimCluster(t, simHostConfig{hosts: 2, leaseTTL: 2 * time.Second})
	var withdrawals atomic.Int64
	held, hold, applied := make(chan struct{}), make(chan struct{}), make(chan struct{})
	release := sync.OnceFunc(func() { close(hold) })
	t.Cleanup(release) // a failed check does not leave the handler waiting
	sc.hosts[1].cfg.sim.grpc = append(sc.hosts[1].cfg.sim.grpc, grpc.ChainUnaryInterceptor(
		func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			d, ok := req.(*poolv1.DelegateRequest)
			if !ok || !d.Withdraw {
				return next(ctx, req)
			}
			if withdrawals.Add(1) <= failures {
				return nil, status.Error(codes.Unavailable, "the test fails this withdrawal")
			}
			if late {
				close(held)
				<-hold
				defer close(applied)
			}
			return next(ctx, req)
		}))
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
	if late {
		<-held
		require.NoError(t, origin.pool.auth.bind("app", "uid:1000"))
		origin.pool.openSession("s-app2", "app", "", "app", 1, 1000)
		again := origin.delegatedCred(ctx, home.cfg.Node, "app")
		require.NotNil(t, again)
		require.NotEqual(t, cred, again, "the new binding is delegated a credential of its own")
		conn2, err := tcp.Dial(ctx, home.pool.dp.addr, tcp.WithCredential(again), tcp.WithConns(1))
		require.NoError(t, err)
		defer conn2.Close()
		require.ErrorIs(t, conn2.Read(ctx, region, 0, make([]byte, 8)), rdma.ErrAccessDenied)
		release()
		<-applied
		require.NoError(t, home.pool.auth.authenticate(again), "the late withdrawal leaves the new binding's credential")
		require.ErrorIs(t, conn2.Read(ctx, region, 0, make([]byte, 8)), rdma.ErrAccessDenied, "and its connection open")
		require.Error(t, home.pool.auth.authenticate(cred), "the old binding's credential went with the new one's delegation")
		require.Equal(t, int64(1), withdrawals.Load())
		return
	}
	require.Eventually(t, func() bool { return home.pool.auth.authenticate(cred) != nil }, time.Minute, 50*time.Millisecond,
		"the home withdraws the credential it delegated to app")
	require.True(t, errors.Is(conn.Read(ctx, region, 0, make([]byte, 8)), rdma.ErrClosed), "and closes its connection")
	require.Equal(t, failures+1, withdrawals.Load(), "the origin asked until the home answered, and no more")
}
