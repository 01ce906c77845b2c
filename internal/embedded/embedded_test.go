package embedded

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/pool"
)

// TestMain serves as the daemon's process when TestSpawn starts this test
// binary as its child.
func TestMain(m *testing.M) {
	RunChild()
	goleak.VerifyTestMain(m)
}

func tune(cfg *pool.Config) {
	cfg.EmulateCXL, cfg.ExportSize, cfg.LocalSize = 64*size.MiB, 64*size.MiB, 16*size.MiB
}

// TestSpawn: with no poold at the socket, Spawn starts one in a child
// process (this test binary, through RunChild) and says so; its cxl and
// rdma tiers serve the client; Stop ends the child and removes its
// directories.
func TestSpawn(t *testing.T) {
	ctx := t.Context()
	var out bytes.Buffer
	c, d, err := Spawn(ctx, &out, filepath.Join(t.TempDir(), "none.sock"), "spawntest", tune)
	require.NoError(t, err)
	require.NotZero(t, d.PID)
	require.Contains(t, out.String(), fmt.Sprintf("in its child process %d", d.PID))
	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierRDMA} {
		seg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(tier))
		require.NoError(t, err, "tier %s", tier)
		want := []byte("served by the child's daemon")
		_, err = seg.WriteAt(want, 4096)
		require.NoError(t, err)
		got := make([]byte, len(want))
		_, err = seg.ReadAt(got, 4096)
		require.NoError(t, err)
		require.Equal(t, want, got, "tier %s", tier)
		require.NoError(t, seg.Free(ctx))
	}
	require.NoError(t, c.Close())
	dir, pid := d.dir, d.PID
	d.Stop()
	require.NoDirExists(t, dir)
	require.ErrorIs(t, syscall.Kill(pid, 0), syscall.ESRCH, "the child is gone")
}

// TestConnectRunning: a poold that answers is used, by Connect and by
// Spawn alike, and neither starts a daemon.
func TestConnectRunning(t *testing.T) {
	ctx := t.Context()
	dir := t.TempDir()
	cfg := pool.DefaultConfig()
	tune(&cfg)
	cfg.DataDir, cfg.Socket, cfg.ShmDir = filepath.Join(dir, "data"), filepath.Join(dir, "poold.sock"), filepath.Join(dir, "shm")
	running, err := pool.Start(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer running.Close()

	var out bytes.Buffer
	c, stop, err := Connect(ctx, &out, cfg.Socket, "connecttest", tune)
	require.NoError(t, err)
	stop()
	require.NoError(t, c.Close())
	c, d, err := Spawn(ctx, &out, cfg.Socket, "spawntest", tune)
	require.NoError(t, err)
	require.Zero(t, d.PID)
	d.Stop()
	require.NoError(t, c.Close())
	require.Equal(t, 2, strings.Count(out.String(), "connected to the running poold"), out.String())
	require.NotContains(t, out.String(), "started one")
}

// TestChildConfig: the configuration reaches the child whole, and one it
// cannot read is an error that names where it came from.
func TestChildConfig(t *testing.T) {
	cfg := pool.DefaultConfig()
	tune(&cfg)
	cfg.DataDir, cfg.Socket = "/x/data", "/x/poold.sock"
	js, err := json.Marshal(cfg)
	require.NoError(t, err)
	var back pool.Config
	require.NoError(t, json.Unmarshal(js, &back))
	require.Equal(t, cfg, back)

	err = serveChild("{not json", strings.NewReader(""), &bytes.Buffer{})
	require.ErrorContains(t, err, childEnv)
}
