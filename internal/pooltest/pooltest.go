package pooltest

import (
	"context"
	"crypto/tls"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"

	poolv1 "github.com/farmem/farmem/api/pool/v1"

	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/pool"
)

// Config returns a daemon configuration on fresh temporary directories:
// no real sysfs (so the CXL tier is emulated), 64 MiB each of emulated CXL,
// local DRAM and loopback rdma, a 1 s lease.
func Config(t testing.TB) pool.Config {
	cfg := pool.DefaultConfig()
	cfg.Node = "test-node"
	cfg.DataDir = t.TempDir()
	cfg.SysfsRoot = filepath.Join(cfg.DataDir, "no-sysfs")
	cfg.ShmDir = ShmDir(t)
	cfg.ExportSize = 64 * size.MiB
	cfg.EmulateCXL = 64 * size.MiB
	cfg.LocalSize = 64 * size.MiB
	cfg.LeaseTTL = time.Second
	cfg.Socket = SocketPath(t)
	// The tier probe briefly holds 64 MiB of each tier: tests that count
	// free bytes right after start turn it on themselves.
	cfg.MeasureTiers = false
	// Without fsync a commit costs microseconds instead of milliseconds on
	// an ordinary disk; these pools live for one test. Tests of durability
	// run the poold binary with its default (fsync).
	cfg.MetadataFsync = false
	return cfg
}

// ShmDir returns a directory in shared memory (the temporary directory
// where /dev/shm is missing) removed when the test ends.
func ShmDir(t testing.TB) string {
	base := "/dev/shm"
	if fi, err := os.Stat(base); err != nil || !fi.IsDir() {
		base = ""
	}
	dir, err := os.MkdirTemp(base, "farmem-test")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
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

// Fill allocates n persistent segments of sz bytes on tier through the
// control plane without mapping them (a process may hold only ~65k
// mappings), e.g. to measure how costs grow with the segment count.
func Fill(t testing.TB, socket string, n int, sz int64, tier poolv1.Tier) {
	conn, err := session.Channel("unix", socket)
	require.NoError(t, err)
	defer conn.Close()
	api := poolv1.NewPoolClient(conn)
	var g errgroup.Group
	g.SetLimit(4)
	for range n {
		g.Go(func() error {
			_, err := api.Alloc(context.Background(), &poolv1.AllocRequest{Size: sz, Tier: tier, Persist: true})
			return err
		})
	}
	require.NoError(t, g.Wait())
}

// TLS gives cfg a node certificate for cfg.Node, signed by the test's CA
// (see certs.ForTest), so that its TCP control plane serves mutual TLS.
func TLS(t testing.TB, cfg *pool.Config) {
	f := certs.ForTest(t, cfg.Node, true)
	cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = f.Cert, f.Key, f.CA
}

// ClientTLS is the client-side TLS configuration of a certificate for
// name (its identity, cn:name) signed by the test's CA.
func ClientTLS(t testing.TB, name string) *tls.Config {
	tc, err := certs.ForTest(t, name, false).Client()
	require.NoError(t, err)
	return tc
}
