// Package pooltest starts a poold inside a test process, on temporary
// directories and a plain sysfs tree, for tests of the client library and
// the CLI. It is for tests only.
//
// Start is safe to call from parallel tests; each daemon is independent.
package pooltest

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/pool"
)

// Config returns a daemon configuration on fresh temporary directories:
// no real sysfs (so the CXL tier is emulated), 64 MiB emulated CXL, 64 MiB
// local, a 1 s lease.
func Config(t testing.TB) pool.Config {
	cfg := pool.DefaultConfig()
	cfg.Node = "test-node"
	cfg.DataDir = t.TempDir()
	cfg.SysfsRoot = filepath.Join(cfg.DataDir, "no-sysfs")
	cfg.NUMADir = filepath.Join(cfg.DataDir, "numa")
	cfg.EmulateCXL = 64 * size.MiB
	cfg.LocalSize = 64 * size.MiB
	cfg.LeaseTTL = time.Second
	cfg.Socket = SocketPath(t)
	return cfg
}

// SocketPath returns a short socket path (unix sockets allow 107 bytes)
// in a directory removed when the test ends.
func SocketPath(t testing.TB) string {
	dir, err := os.MkdirTemp("", "fm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return filepath.Join(dir, "poold.sock")
}

// Start runs a daemon with cfg until the test ends.
func Start(t testing.TB, cfg pool.Config) *pool.Daemon {
	var log *slog.Logger
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	d, err := pool.Start(cfg, log)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}
