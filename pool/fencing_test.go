package pool

import (
	"bytes"
	"crypto/rand"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// newServingPool is a core whose rdma tier is served on a loopback data
// plane, on a clock the test moves.
func newServingPool(t *testing.T) (*core, *time.Time) {
	cfg := testConfig(t)
	cfg.ExportSize = 16 * size.MiB
	cfg.DataListen = "127.0.0.1:0"
	return servingPool(t, cfg)
}

// servingPool is newServingPool on cfg: again on the same configuration,
// a restart.
func servingPool(t *testing.T, cfg Config) (*core, *time.Time) {
	log := slog.New(slog.DiscardHandler)
	_, devs, err := discover(cfg, log)
	require.NoError(t, err)
	dp, err := newDataPlane(cfg.DataListen, tcp.ServerConfig{Logger: log, BusyPoll: -1}, dataSecurity{}, nil)
	require.NoError(t, err)
	p, err := newCore(cfg, log, devs, dp, nil)
	require.NoError(t, err)
	dp.serve()
	t.Cleanup(func() { require.NoError(t, p.close()) })
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	return p, &now
}

// region is what a client holds to reach an rdma segment.
func region(t *testing.T, r *record) rdma.Region {
	require.False(t, r.Key.IsZero(), "segment %d has no rdma key", r.ID)
	return rdma.Region{Segment: r.ID, Key: r.Key, Epoch: r.Epoch}
}

// TestFencing: a client whose lease ends loses its segment even while it
// keeps reading (reads are not keep-alives); the memory goes to another
// client; every write, atomic and read the old client retries is refused
// with ErrLeaseExpired, and the new owner's bytes are intact. A live
// segment whose epoch was raised refuses writes with the old epoch.
func TestFencing(t *testing.T) {
	p, now := newServingPool(t)
	ctx := t.Context()
	p.openSession("s-old", "old", "old", 1, 0)
	oldC, err := p.callerFor("s-old")
	require.NoError(t, err)
	const n = 64 << 10
	r1, err := p.Alloc(ctx, oldC, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err)
	// Each client reaches its own segments with its own credential.
	dial := func(session, client string) *tcp.Client {
		c, err := tcp.Dial(ctx, p.dp.addr, tcp.WithCredential(p.auth.issue(session, client, client)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := dial("s-old", "old")
	old := region(t, r1)
	require.NoError(t, c.Write(ctx, old, 0, bytes.Repeat([]byte{0xAA}, n)))

	// The old client's session ends (a partition, a pause); it goes on
	// reading through the data plane, which does not renew its lease.
	p.closeSession("s-old")
	for range 3 {
		*now = now.Add(p.cfg.LeaseTTL / 2)
		_ = c.Read(ctx, old, 0, make([]byte, 8))
		p.reap()
	}
	_, err = p.Stat(r1.ID)
	require.Error(t, err, "the lease ran out although the client kept reading")

	// The same memory goes to a new client.
	p.openSession("s-new", "new", "new", 2, 0)
	newC, err := p.callerFor("s-new")
	require.NoError(t, err)
	r2, err := p.Alloc(ctx, newC, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err)
	require.Equal(t, [2]any{r1.Device, r1.Offset}, [2]any{r2.Device, r2.Offset}, "the extent is reused")
	require.NotEqual(t, r1.ID, r2.ID)
	want := make([]byte, n)
	rand.Read(want)
	fresh := region(t, r2)
	cNew := dial("s-new", "new")
	require.NoError(t, cNew.Write(ctx, fresh, 0, want))
	require.ErrorIs(t, c.Read(ctx, fresh, 0, make([]byte, 8)), rdma.ErrAccessDenied, "the old client's credential does not reach the new owner's segment")

	for _, tc := range []struct {
		name string
		op   func() error
	}{
		{"write", func() error { return c.Write(ctx, old, 0, bytes.Repeat([]byte{0xAA}, n)) }},
		{"cas", func() error { _, _, err := c.CompareAndSwap64(ctx, old, 0, 0, 1); return err }},
		{"fadd", func() error { _, err := c.FetchAdd64(ctx, old, 8, 1); return err }},
		{"read", func() error { return c.Read(ctx, old, 0, make([]byte, 8)) }},
	} {
		t.Run("old owner "+tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.op(), rdma.ErrLeaseExpired)
		})
	}
	got := make([]byte, n)
	require.NoError(t, cNew.Read(ctx, fresh, 0, got))
	require.Equal(t, want, got, "the new owner's bytes are intact")

	// The epoch check itself: a raised epoch fences writes carrying the
	// old one, and reads go on.
	require.NoError(t, p.dp.srv.SetEpoch(r2.ID, r2.Epoch+1))
	require.ErrorIs(t, cNew.Write(ctx, fresh, 0, []byte{1}), rdma.ErrLeaseExpired)
	_, err = cNew.FetchAdd64(ctx, fresh, 0, 1)
	require.ErrorIs(t, err, rdma.ErrLeaseExpired)
	require.NoError(t, cNew.Read(ctx, fresh, 0, got))
	require.Equal(t, want, got)
	next := fresh
	next.Epoch++
	require.NoError(t, cNew.Write(ctx, next, 0, want[:8]))

	// A free fences the segment too.
	require.NoError(t, p.Free(newC, r2.ID, ""))
	require.ErrorIs(t, cNew.Write(ctx, next, 0, want[:8]), rdma.ErrLeaseExpired)
}

// TestPeerLease: the segments a peer poold placed here outlive its last
// session for PeerLeaseTTL, not LeaseTTL: a partition between the hosts
// ends that session, and the memory may hold the only copy of a segment
// the peer serves again once the partition heals. An application's
// segment is reclaimed one LeaseTTL after its session ends, as before;
// a restart keeps the same two leases for the owners it finds.
func TestPeerLease(t *testing.T) {
	p, now := newServingPool(t)
	cfg := p.cfg
	require.Greater(t, cfg.PeerLeaseTTL, 4*cfg.LeaseTTL, "the default peer lease is well beyond a client's")
	ctx := t.Context()
	alloc := func(p *core, session, client string) *record {
		p.openSession(session, client, client, 1, 0)
		c, err := p.callerFor(session)
		require.NoError(t, err)
		r, err := p.Alloc(ctx, c, allocRequest{Size: 64 << 10, Tier: poolv1.Tier_TIER_RDMA})
		require.NoError(t, err)
		return r
	}
	held := func(p *core, id uint64) bool {
		_, err := p.Stat(id)
		return err == nil
	}
	// passes moves the clock on by d, in steps of a quarter lease, reaping
	// at each as the daemon does.
	passes := func(p *core, now *time.Time, d time.Duration) {
		for step := cfg.LeaseTTL / 4; d > 0; d -= step {
			*now = now.Add(min(step, d))
			p.reap()
		}
	}

	app, peer := alloc(p, "s-app", "app"), alloc(p, "s-peer", peerClientPrefix+"b")
	p.closeSession("s-app")
	p.closeSession("s-peer")
	passes(p, now, 2*cfg.LeaseTTL)
	require.False(t, held(p, app.ID), "the application's segment is reclaimed one lease after its session")
	require.True(t, held(p, peer.ID), "the peer's segment outlives a client's lease")
	passes(p, now, cfg.PeerLeaseTTL-3*cfg.LeaseTTL)
	require.True(t, held(p, peer.ID), "the peer's segment is held until its peer lease ends")
	passes(p, now, 2*cfg.LeaseTTL)
	require.False(t, held(p, peer.ID), "the peer's segment is reclaimed one peer lease after its session")

	// A restart: the owners found in the store get the same leases.
	app, peer = alloc(p, "s-app2", "app"), alloc(p, "s-peer2", peerClientPrefix+"b")
	require.NoError(t, p.close())
	p, now = servingPool(t, cfg)
	*now = time.Now() // the restored leases run from the restart, on the real clock
	passes(p, now, 2*(cfg.LeaseTTL+restartGrace))
	require.False(t, held(p, app.ID), "after a restart, the application's segment is reclaimed one lease (and the restart's grace) on")
	require.True(t, held(p, peer.ID), "after a restart, the peer's segment outlives a client's lease")
	passes(p, now, cfg.PeerLeaseTTL)
	require.False(t, held(p, peer.ID))
}
