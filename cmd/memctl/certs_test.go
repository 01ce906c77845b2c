package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/pooltest"
)

// TestCertsInitAndTLS: certs init makes a CA and certificates; a daemon
// serving them on TCP answers memctl with the client certificate, and
// refuses memctl without one. Status shows quota usage and that the data
// plane serves TLS.
func TestCertsInitAndTLS(t *testing.T) {
	dir := t.TempDir()
	out, errOut, code := memctl(t, "", "certs", "init", "--dir", dir, "--nodes", "n1=10.1.2.3", "--clients", "admin")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, certs.CAFile(dir))
	require.Contains(t, out, certs.KeyFile(dir, "admin"))

	_, errOut, code = memctl(t, "", "certs", "init", "--dir", dir, "--nodes", "bad/name")
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, "bad/name")

	cfg := pooltest.Config(t)
	cfg.Node = "n1"
	cfg.Listen = "127.0.0.1:0"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = certs.CertFile(dir, "n1"), certs.KeyFile(dir, "n1"), certs.CAFile(dir)
	require.NoError(t, cfg.Quotas.Set("default/cxl=1MiB"))
	d := pooltest.Start(t, cfg)
	addr := d.ListenAddr()

	out, errOut, code = memctl(t, cfg.Socket, "--addr", addr, "--tls-cert", certs.CertFile(dir, "admin"),
		"--tls-key", certs.KeyFile(dir, "admin"), "--tls-ca", certs.CAFile(dir), "status", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var st struct {
		Node     string `json:"node"`
		Insecure bool   `json:"insecure"`
		DataSec  string `json:"data_security"`
		Quotas   []struct {
			Identity   string `json:"identity"`
			Tier       string `json:"tier"`
			QuotaBytes int64  `json:"quota_bytes"`
		} `json:"quotas"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.Equal(t, "n1", st.Node)
	require.False(t, st.Insecure)
	require.Equal(t, "tls", st.DataSec, "with control-plane TLS the data plane serves TLS")
	require.Len(t, st.Quotas, 1)
	require.Equal(t, "default", st.Quotas[0].Identity)
	require.EqualValues(t, 1<<20, st.Quotas[0].QuotaBytes)

	_, errOut, code = memctl(t, cfg.Socket, "--addr", addr, "--timeout", "2s", "status")
	require.NotEqual(t, 0, code, "plaintext to a TLS control plane must fail")
	require.NotEmpty(t, errOut)
}

// TestStatusDataPlaneSecurity: memctl status warns of a data plane served
// in plaintext with --data-insecure, and says plaintext without
// control-plane TLS.
func TestStatusDataPlaneSecurity(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Listen = "127.0.0.1:0"
	pooltest.TLS(t, &cfg)
	cfg.DataInsecure = true
	pooltest.Start(t, cfg)
	out, errOut, code := memctl(t, cfg.Socket, "status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "WARNING: the data plane serves without TLS (--data-insecure)")

	plain := pooltest.Config(t)
	pooltest.Start(t, plain)
	out, errOut, code = memctl(t, plain.Socket, "status")
	require.Equal(t, 0, code, errOut)
	require.Contains(t, out, "data plane: plaintext (the control plane has no TLS")
}
