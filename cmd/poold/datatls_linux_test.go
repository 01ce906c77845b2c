package main

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestDataPlaneTLSFlags: the poold binary with control-plane TLS serves its
// data plane over TLS (a plaintext client's hello gets no data-plane reply)
// while a local client's rdma segment, served over loopback through it,
// works; with --data-insecure it serves plaintext (a plaintext hello gets
// the data plane's answer), logs a warning and memctl status says so.
func TestDataPlaneTLSFlags(t *testing.T) {
	dir := shortDir(t)
	_, err := certs.Init(dir, certs.InitOptions{Nodes: []certs.Node{{Name: "n1"}}})
	require.NoError(t, err)
	for _, tc := range []struct {
		name     string
		extra    []string
		security string
	}{{"tls", nil, "tls"}, {"data-insecure", []string{"--data-insecure"}, "plaintext (--data-insecure)"}} {
		t.Run(tc.name, func(t *testing.T) {
			data, sock, dataAddr := t.TempDir(), filepath.Join(shortDir(t), "p.sock"), freeAddr(t, "tcp")
			d := startDaemon(t, data, sock, append([]string{"--node", "n1", "--export-size", "16MiB", "--data-listen", dataAddr,
				"--listen", freeAddr(t, "tcp"), "--tls-cert", certs.CertFile(dir, "n1"), "--tls-key", certs.KeyFile(dir, "n1"),
				"--tls-ca", certs.CAFile(dir)}, tc.extra...)...)

			ctx := t.Context()
			serves(t, sock, alloc.TierRDMA) // through the data plane, over loopback

			// A plaintext client with no credential: refused by the data
			// plane itself (AUTH_FAILED) only when it speaks plaintext.
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err = tcp.Dial(dctx, dataAddr, tcp.WithConns(1))
			require.Error(t, err)
			require.Equal(t, tc.security != "tls", errors.Is(err, rdma.ErrAccessDenied), "plaintext dial: %v", err)

			var st struct {
				DataSecurity string `json:"data_security"`
			}
			require.NoError(t, memctlJSON(ctx, sock, &st, "status"))
			require.Equal(t, tc.security, st.DataSecurity)
			require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
			d.cmd.Wait() // ends the copying into d.log
			require.Equal(t, tc.security != "tls", strings.Contains(d.log.String(), "data plane without TLS (--data-insecure)"), "the start-up warning")
		})
	}
}
