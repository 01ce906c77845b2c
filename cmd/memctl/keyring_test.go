package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/pooltest"
)

// TestKeyring: certs init writes a gossip key that poold takes; memctl
// keyring lists it by fingerprint and rotates it (install, use, remove),
// refuses a key of the wrong size naming the sizes, and is refused to a
// client certificate that is not a node's.
func TestKeyring(t *testing.T) {
	dir := t.TempDir()
	_, errOut, code := memctl(t, "", "certs", "init", "--dir", dir, "--nodes", "n1", "--clients", "admin")
	require.Equal(t, 0, code, errOut)
	raw, err := os.ReadFile(certs.GossipKeyFile(dir))
	require.NoError(t, err)
	keys, err := cluster.ParseKeys(raw)
	require.NoError(t, err)
	require.Len(t, keys, 1)
	old := keys[0]

	cfg := pooltest.Config(t)
	cfg.Node, cfg.Listen, cfg.Gossip = "n1", "127.0.0.1:0", "127.0.0.1:0"
	cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = certs.CertFile(dir, "n1"), certs.KeyFile(dir, "n1"), certs.CAFile(dir)
	cfg.GossipKeyFile = certs.GossipKeyFile(dir)
	d := pooltest.Start(t, cfg)

	type nodeKeys struct {
		Node         string   `json:"node"`
		Fingerprints []string `json:"fingerprints"`
		Error        string   `json:"error"`
	}
	list := func() []string {
		out, errOut, code := memctl(t, cfg.Socket, "keyring", "list", "-o", "json")
		require.Equal(t, 0, code, errOut)
		var ns []nodeKeys
		require.NoError(t, json.Unmarshal([]byte(out), &ns))
		require.Len(t, ns, 1)
		require.Equal(t, "n1", ns[0].Node)
		return ns[0].Fingerprints
	}
	require.Equal(t, []string{cluster.Fingerprint(old)}, list())

	fresh := make([]byte, 32)
	_, err = rand.Read(fresh)
	require.NoError(t, err)
	b64 := base64.StdEncoding.EncodeToString
	for _, step := range []struct {
		args []string
		want []string
	}{
		{[]string{"install", b64(fresh)}, []string{cluster.Fingerprint(old), cluster.Fingerprint(fresh)}},
		{[]string{"use", b64(fresh)}, []string{cluster.Fingerprint(fresh), cluster.Fingerprint(old)}},
		{[]string{"remove", b64(old)}, []string{cluster.Fingerprint(fresh)}},
	} {
		out, errOut, code := memctl(t, cfg.Socket, append([]string{"keyring"}, step.args...)...)
		require.Equal(t, 0, code, errOut)
		require.Contains(t, out, "n1")
		require.Equal(t, step.want, list(), step.args[0])
	}
	kept, err := os.ReadFile(cfg.DataDir + "/gossip.keyring")
	require.NoError(t, err)
	keptKeys, err := cluster.ParseKeys(kept)
	require.NoError(t, err)
	require.Equal(t, [][]byte{fresh}, keptKeys, "the keyring is kept for a restart")

	_, errOut, code = memctl(t, cfg.Socket, "keyring", "install", b64(make([]byte, 20)))
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, "gossip key of 20 bytes; use 16, 24 or 32 bytes")
	out, errOut, code := memctl(t, cfg.Socket, "keyring", "remove", b64(fresh))
	require.NotEqual(t, 0, code, "the primary cannot be removed")
	require.Contains(t, errOut, "1 of 1 nodes")
	require.Contains(t, out, "is the primary on node \"n1\"")

	_, errOut, code = memctl(t, cfg.Socket, "--addr", d.ListenAddr(), "--tls-cert", certs.CertFile(dir, "admin"),
		"--tls-key", certs.KeyFile(dir, "admin"), "--tls-ca", certs.CAFile(dir), "keyring", "list")
	require.NotEqual(t, 0, code)
	require.Contains(t, errOut, "not cn:admin")

	out, errOut, code = memctl(t, cfg.Socket, "status", "-o", "json")
	require.Equal(t, 0, code, errOut)
	var st struct {
		GossipInsecure bool `json:"gossip_insecure"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &st))
	require.False(t, st.GossipInsecure)
}
