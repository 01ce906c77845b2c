package pool_test

import (
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/testfs"
)

// TestEmulateDirFull puts the emulated CXL device's files (--emulate-dir)
// on an 8 MiB tmpfs that something else has nearly filled: an Alloc on cxl
// that the device's accounting allows but the filesystem cannot hold fails
// with ErrNoCapacity in human units, counted as no_capacity, reaches a
// plain gRPC client as RESOURCE_EXHAUSTED, and with WithFallback lands on
// the next tier the caller allowed.
func TestEmulateDirFull(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.EmulateDir = testfs.SmallFS(t, 8*size.MiB)
	cfg.EmulateCXL = 8 * size.MiB
	cfg.Metrics = "127.0.0.1:0"
	d := pooltest.Start(t, cfg)
	testfs.FillFS(t, cfg.EmulateDir, size.MiB)

	ctx := t.Context()
	c, err := alloc.Dial(ctx, cfg.Socket)
	require.NoError(t, err)
	defer c.Close()

	_, err = c.Alloc(ctx, 4<<20, alloc.WithTier(alloc.TierCXL))
	require.ErrorIs(t, err, alloc.ErrNoCapacity)
	require.ErrorContains(t, err, cfg.EmulateDir, "names the filesystem")
	require.ErrorContains(t, err, "4.0 MiB", "sizes for people")
	require.Equal(t, 1.0, sample(t, scrape(t, d), "farmem_alloc_failures_total", map[string]string{"reason": "no_capacity"}))

	conn, err := session.Channel("unix", cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	_, err = poolv1.NewPoolClient(conn).Alloc(ctx, &poolv1.AllocRequest{Size: 4 << 20, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.Equal(t, codes.ResourceExhausted, grpcstatus.Code(err), "%v", err)

	seg, err := c.Alloc(ctx, 4<<20, alloc.WithTier(alloc.TierCXL), alloc.WithFallback(alloc.TierLocal))
	require.NoError(t, err)
	require.Equal(t, alloc.TierLocal, seg.Tier())
	require.NoError(t, seg.Free(ctx))
}
