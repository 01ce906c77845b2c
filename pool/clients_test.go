package pool_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
)

// status asks a daemon for its Status as an administrator (no session).
func status(t *testing.T, socket string) *poolv1.StatusResponse {
	t.Helper()
	conn, err := session.Channel("unix", socket)
	require.NoError(t, err)
	defer conn.Close()
	st, err := poolv1.NewPoolClient(conn).Status(t.Context(), &poolv1.StatusRequest{})
	require.NoError(t, err)
	return st
}

func opsOf(st *poolv1.StatusResponse, tier poolv1.Tier) *poolv1.TierOps {
	for _, o := range st.Ops {
		if o.Tier == tier {
			return o
		}
	}
	return nil
}

func TestStatusClientsAndOps(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	ctx := t.Context()

	st := status(t, cfg.Socket)
	require.Empty(t, st.Clients, "no client yet")
	require.Len(t, st.Ops, 3, "every tier is listed, at zero, before its first operation")
	for _, o := range st.Ops {
		require.Zero(t, o.Allocations+o.Frees+o.Reads+o.Writes+o.Atomics, "%s", o.Tier)
	}

	c, err := alloc.Dial(ctx, cfg.Socket, alloc.WithClientName("app-a"), alloc.WithClientID("app-a-1"))
	require.NoError(t, err)
	defer c.Close()
	var segs []*alloc.Segment
	for _, a := range []struct {
		tier alloc.Tier
		size int64
		opts []alloc.AllocOption
	}{
		{alloc.TierCXL, 1 << 20, nil},
		{alloc.TierLocal, 2 << 20, nil},
		{alloc.TierRDMA, 1 << 20, nil},
		{alloc.TierCXL, 1 << 20, []alloc.AllocOption{alloc.WithName("kept")}},
	} {
		s, err := c.Alloc(ctx, a.size, append(a.opts, alloc.WithTier(a.tier))...)
		require.NoError(t, err)
		segs = append(segs, s)
	}
	remote := segs[2]
	_, err = remote.WriteAt(make([]byte, 4096), 0)
	require.NoError(t, err)
	_, err = remote.ReadAt(make([]byte, 1000), 0)
	require.NoError(t, err)
	_, err = remote.Add64(0, 1)
	require.NoError(t, err)
	require.NoError(t, segs[1].Free(ctx))

	st = status(t, cfg.Socket)
	require.Len(t, st.Clients, 1)
	ci := st.Clients[0]
	require.Equal(t, "app-a-1", ci.Id)
	require.Equal(t, "app-a", ci.Name)
	require.Equal(t, int64(os.Getpid()), ci.Pid)
	require.Equal(t, uint32(os.Getuid()), ci.Uid)
	require.Equal(t, int64(1), ci.Sessions)
	require.Equal(t, int64(3), ci.Segments)
	require.Equal(t, int64(3<<20), ci.Bytes)
	require.Zero(t, ci.LeaseExpiresUnixMs, "a client with a session holds its lease")

	cxl, local, rdma := opsOf(st, poolv1.Tier_TIER_CXL), opsOf(st, poolv1.Tier_TIER_LOCAL), opsOf(st, poolv1.Tier_TIER_RDMA)
	require.Equal(t, int64(2), cxl.Allocations)
	require.Equal(t, int64(1), local.Allocations)
	require.Equal(t, int64(1), local.Frees)
	require.Equal(t, int64(1), rdma.Allocations)
	require.Equal(t, int64(1), rdma.Writes)
	require.Equal(t, int64(4096), rdma.WriteBytes)
	require.Equal(t, int64(1), rdma.Reads)
	require.Equal(t, int64(1000), rdma.ReadBytes)
	require.Equal(t, int64(1), rdma.Atomics)
	require.Zero(t, cxl.Reads+cxl.Writes, "loads and stores to mapped memory never reach the daemon")

	// Gone: its lease runs, then its unpinned segments go and the named
	// one stays, still listed under its owner.
	closed := time.Now()
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool {
		st := status(t, cfg.Socket)
		return len(st.Clients) == 1 && st.Clients[0].Sessions == 0
	}, 10*time.Second, 10*time.Millisecond)
	ci = status(t, cfg.Socket).Clients[0]
	if ci.LeaseExpiresUnixMs != 0 { // not yet reclaimed
		require.GreaterOrEqual(t, ci.LeaseExpiresUnixMs, closed.UnixMilli())
	}
	require.Eventually(t, func() bool {
		st := status(t, cfg.Socket)
		return len(st.Clients) == 1 && st.Clients[0].Segments == 1
	}, 10*time.Second, 20*time.Millisecond)
	ci = status(t, cfg.Socket).Clients[0]
	require.Equal(t, "app-a-1", ci.Id)
	require.Equal(t, int64(1<<20), ci.Bytes)
	require.Zero(t, ci.LeaseExpiresUnixMs)
	st = status(t, cfg.Socket)
	require.Equal(t, int64(2), opsOf(st, poolv1.Tier_TIER_CXL).Frees+opsOf(st, poolv1.Tier_TIER_RDMA).Frees, "reclaims count as frees")

	// An administrator's segment has no owner and is no client's.
	conn, err := session.Channel("unix", cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	_, err = poolv1.NewPoolClient(conn).Alloc(context.Background(), &poolv1.AllocRequest{Size: 1 << 20, Persist: true})
	require.NoError(t, err)
	require.Len(t, status(t, cfg.Socket).Clients, 1)
}
