package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/pooltest"
)

// Every subcommand that reaches poold takes a --socket relative to the
// working directory, as alloc.Dial and FARMEM_SOCKET do, and poold shows
// its socket absolute. The table must name every such subcommand.
func TestRelativeSocket(t *testing.T) {
	cfg := pooltest.Config(t)
	dir := filepath.Dir(cfg.Socket)
	t.Chdir(dir)
	cfg.Socket = "poold.sock"
	pooltest.Start(t, cfg)
	abs := filepath.Join(dir, "poold.sock")

	for _, tc := range []struct {
		args []string
		want string // in stdout
	}{
		{[]string{"status"}, "socket " + abs + ","},
		{[]string{"tiers"}, "EMULATED"},
		{[]string{"alloc", "--size", "1MiB", "--tier", "cxl", "--name", "rel"}, "allocated segment"},
		{[]string{"segments"}, "rel"},
		{[]string{"segments", "--all"}, "rel"},
		{[]string{"free", "rel"}, "freed"},
		{[]string{"nodes"}, "test-node"},
		{[]string{"drain", "test-node"}, "draining"},
		{[]string{"drain", "test-node", "--undo"}, "accepts placements again"},
		{[]string{"top", "--once", "--interval", "10ms"}, "test-node"},
		{[]string{"bench", "--duration", "5ms", "--rounds", "1", "--ops", "read", "--sizes", "64", "--depths", "1", "--tiers", "cxl"}, "farmem-cxl"},
		{[]string{"doctor"}, "rdma transport"},     // shown only when poold answers
		{[]string{"keyring", "list"}, "test-node"}, // no gossip: no keys
		{[]string{"__complete", "drain", ""}, "test-node"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			out, errOut, code := memctl(t, "poold.sock", tc.args...)
			require.Zero(t, code, errOut)
			require.Contains(t, out, tc.want)
		})
	}

	// A move needs a cluster; the daemon's refusal shows memctl reached it.
	_, errOut, code := memctl(t, "poold.sock", "move", "nosuch", "--to", "b")
	require.NotZero(t, code)
	require.Contains(t, errOut, `segment "nosuch": not found`)

	dials := map[string]bool{"status": true, "tiers": true, "alloc": true, "segments": true, "free": true, "nodes": true,
		"drain": true, "top": true, "bench": true, "doctor": true, "keyring": true, "move": true}
	for _, c := range newRoot(os.Stdout).Commands() {
		switch c.Name() {
		case "certs", "completion", "bench-serve", "help":
			continue // they never dial poold
		}
		require.True(t, dials[c.Name()], "memctl %s is not in this test's table: add a case with a relative --socket", c.Name())
	}

	c, err := alloc.Dial(t.Context(), "poold.sock")
	require.NoError(t, err, "alloc.Dial takes the same relative path")
	require.NoError(t, c.Close())
	t.Setenv("FARMEM_SOCKET", "poold.sock")
	c, err = alloc.Dial(t.Context(), "")
	require.NoError(t, err, "and FARMEM_SOCKET too")
	require.NoError(t, c.Close())

	_, errOut, code = memctl(t, "localhost:7950", "status")
	require.NotZero(t, code)
	require.Contains(t, errOut, "looks like a TCP address")
}

// memctl --addr and alloc.Dial over tcp:// name the TLS setting that keeps
// them out of a poold that answers, and say nobody answers only when nobody
// does.
func TestAddrTLSProblems(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	for _, d := range []string{dir, other} {
		_, errOut, code := memctl(t, "", "certs", "init", "--dir", d, "--nodes", "n1", "--clients", "admin")
		require.Zero(t, code, errOut)
	}
	cfg := pooltest.Config(t)
	cfg.Node, cfg.Listen = "n1", "127.0.0.1:0"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = certs.CertFile(dir, "n1"), certs.KeyFile(dir, "n1"), certs.CAFile(dir)
	addr := pooltest.Start(t, cfg).ListenAddr()

	plain := pooltest.Config(t)
	plain.Listen, plain.Insecure = "127.0.0.1:0", true
	plainAddr := pooltest.Start(t, plain).ListenAddr()

	tlsFlags := func(f certs.Files) []string {
		return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}
	}
	good := certs.InDir(dir, "admin")
	foreign := certs.InDir(other, "admin")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no certificate", []string{"--addr", addr}, []string{"poold at " + addr + " serves mutual TLS", "--tls-cert, --tls-key and --tls-ca", "memctl certs init"}},
		{"another CA's certificate and CA", append([]string{"--addr", addr}, tlsFlags(foreign)...), []string{"presented a certificate this client's CA does not vouch for", "--tls-ca must be the CA"}},
		{"another CA's certificate", append([]string{"--addr", addr}, tlsFlags(certs.Files{Cert: foreign.Cert, Key: foreign.Key, CA: good.CA})...), []string{"refused this client's certificate", "--tls-cert and --tls-key must be"}},
		{"TLS to a plaintext poold", append([]string{"--addr", plainAddr}, tlsFlags(good)...), []string{"does not speak TLS", "leave out --tls-cert"}},
		{"nobody there", []string{"--addr", "127.0.0.1:1"}, []string{"no poold answers at 127.0.0.1:1; is its --listen address right?"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, errOut, code := memctl(t, "", append(tc.args, "--timeout", "2s", "status")...)
			require.NotZero(t, code)
			for _, w := range tc.want {
				require.Contains(t, errOut, w)
			}
			if !strings.Contains(tc.name, "nobody") {
				require.NotContains(t, errOut, "is its --listen address right", "poold answered")
			}
		})
	}
	_, errOut, code := memctl(t, "", append([]string{"--addr", addr}, append(tlsFlags(good), "status")...)...)
	require.Zero(t, code, errOut)

	_, err := alloc.Dial(t.Context(), "tcp://"+addr)
	require.ErrorContains(t, err, "serves mutual TLS")
	require.ErrorContains(t, err, "alloc.WithTLS")
}
