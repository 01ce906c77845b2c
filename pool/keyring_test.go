package pool

import (
	"crypto/rand"
	"encoding/base64"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
)

// keyringAPI is the control plane of d on its unix socket, as memctl
// keyring uses it.
func keyringAPI(t *testing.T, d *Daemon) poolv1.PoolClient {
	conn, err := session.Channel("unix", d.cfg.Socket)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return poolv1.NewPoolClient(conn)
}

// writeKeys writes a key file of keys in dir.
func writeKeys(t *testing.T, dir string, keys ...[]byte) string {
	path := filepath.Join(dir, "gossip.key")
	require.NoError(t, os.WriteFile(path, cluster.FormatKeys(keys), 0o600))
	return path
}

func randomKey(t *testing.T) []byte {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k
}

// TestGossipKeyAdmitsOnlyKeyHolders: a daemon gossiping without the
// cluster's key is never listed by the others and never chosen for a
// placement; one with a key of the wrong size does not start.
func TestGossipKeyAdmitsOnlyKeyHolders(t *testing.T) {
	cfgA := clusterNodeConfig(t, "a")
	a := startNode(t, cfgA)
	b := startNode(t, clusterNodeConfig(t, "b"), a)
	cfgC := clusterNodeConfig(t, "c")
	cfgC.GossipKeyFile, cfgC.GossipInsecure = "", true
	cfgC.ExportSize *= 4 // the most free memory: placement would prefer it
	cfgC.Join = []string{seedOf(t, a)}
	c, err := Start(cfgC, nil)
	require.NoError(t, err)
	defer c.Close()

	st, err := keyringAPI(t, c).Status(t.Context(), &poolv1.StatusRequest{})
	require.NoError(t, err)
	require.True(t, st.GossipInsecure, "status shows the plaintext gossip")
	st, err = keyringAPI(t, a).Status(t.Context(), &poolv1.StatusRequest{})
	require.NoError(t, err)
	require.False(t, st.GossipInsecure)

	ctx := t.Context()
	owner, err := alloc.Dial(ctx, cfgA.Socket, alloc.WithClientID("gossip-key-owner"))
	require.NoError(t, err)
	defer owner.Close()
	onB := 0
	require.Eventually(t, func() bool {
		seg, err := owner.Alloc(ctx, 4096, alloc.WithTier(alloc.TierRDMA))
		require.NoError(t, err)
		require.NotEqual(t, "c", seg.Node())
		if seg.Node() == "b" {
			onB++
		}
		return onB == 8
	}, 30*time.Second, 20*time.Millisecond)
	for _, d := range []*Daemon{a, b} {
		nodes, err := keyringAPI(t, d).Nodes(ctx, &poolv1.NodesRequest{})
		require.NoError(t, err)
		var names []string
		for _, n := range nodes.Nodes {
			names = append(names, n.Name)
		}
		require.ElementsMatch(t, []string{"a", "b"}, names, "c gossips without the key")
	}
	require.Len(t, c.pool.gossip().Members(), 1, "c heard of nobody")

	bad := clusterNodeConfig(t, "d")
	bad.GossipKeyFile = filepath.Join(t.TempDir(), "short.key")
	require.NoError(t, os.WriteFile(bad.GossipKeyFile, []byte(base64.StdEncoding.EncodeToString(make([]byte, 20))+"\n"), 0o600))
	_, err = Start(bad, nil)
	require.ErrorIs(t, err, ErrConfig)
	require.ErrorIs(t, err, cluster.ErrBadKey)
	require.ErrorContains(t, err, "gossip key of 20 bytes; use 16, 24 or 32 bytes")
}

// TestKeyringRotationWithANodeDown rotates the gossip key (install, use,
// remove, each sent to one daemon that forwards it) while c is down; c
// restarts with the old key only and stays out until the new key is
// installed on it alone, then rejoins. Every daemon keeps its keyring
// across a restart.
func TestKeyringRotationWithANodeDown(t *testing.T) {
	dir := t.TempDir()
	old, fresh := randomKey(t), randomKey(t)
	keyFile := writeKeys(t, dir, old)
	start := func(cfg Config) *Daemon {
		d, err := Start(cfg, nil)
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	node := func(name string) Config {
		cfg := clusterNodeConfig(t, name)
		cfg.GossipKeyFile = keyFile
		return cfg
	}
	cfgA := node("a")
	a := start(cfgA)
	seed := seedOf(t, a)
	cfgB, cfgC := node("b"), node("c")
	cfgB.Join, cfgC.Join = []string{seed}, []string{seed}
	b, c := start(cfgB), start(cfgC)
	alive := func(d *Daemon, name string) bool {
		m, ok := d.pool.gossip().Member(name)
		return ok && m.State == cluster.StateAlive
	}
	require.Eventually(t, func() bool { return alive(a, "b") && alive(a, "c") && alive(b, "c") }, 30*time.Second, 10*time.Millisecond)
	cAddr := c.pool.gossip().Self().Addr
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return !alive(a, "c") && !alive(b, "c") }, 30*time.Second, 10*time.Millisecond)

	ctx := t.Context()
	api := keyringAPI(t, a)
	for _, op := range []poolv1.KeyringOp{poolv1.KeyringOp_KEYRING_OP_INSTALL, poolv1.KeyringOp_KEYRING_OP_USE, poolv1.KeyringOp_KEYRING_OP_REMOVE} {
		key := fresh
		if op == poolv1.KeyringOp_KEYRING_OP_REMOVE {
			key = old
		}
		resp, err := api.Keyring(ctx, &poolv1.KeyringRequest{Op: op, Key: key})
		require.NoError(t, err)
		byNode := map[string]*poolv1.NodeKeyring{}
		for _, n := range resp.Nodes {
			byNode[n.Node] = n
		}
		require.Empty(t, byNode["a"].Error, op)
		require.Empty(t, byNode["b"].Error, op)
		require.Contains(t, byNode["c"].Error, "not reached", op)
	}
	want := []string{cluster.Fingerprint(fresh)}
	for _, d := range []*Daemon{a, b} {
		resp, err := keyringAPI(t, d).Keyring(ctx, &poolv1.KeyringRequest{Op: poolv1.KeyringOp_KEYRING_OP_LIST, Local: true})
		require.NoError(t, err)
		require.Equal(t, want, resp.Nodes[0].Fingerprints)
	}
	_, err := api.Keyring(ctx, &poolv1.KeyringRequest{Op: poolv1.KeyringOp_KEYRING_OP_INSTALL, Key: []byte("short")})
	require.ErrorIs(t, errs.FromStatus(err), alloc.ErrInvalid)

	// c comes back under its old key only: not admitted.
	cfgC.Gossip = cAddr
	c = start(cfgC)
	require.Never(t, func() bool { return alive(a, "c") }, 2*time.Second, 50*time.Millisecond)
	// The operator installs the new key on c alone; c rejoins.
	cAPI := keyringAPI(t, c)
	for _, op := range []poolv1.KeyringOp{poolv1.KeyringOp_KEYRING_OP_INSTALL, poolv1.KeyringOp_KEYRING_OP_USE} {
		resp, err := cAPI.Keyring(ctx, &poolv1.KeyringRequest{Op: op, Key: fresh, Local: true})
		require.NoError(t, err)
		require.Len(t, resp.Nodes, 1)
		require.Empty(t, resp.Nodes[0].Error)
	}
	require.Eventually(t, func() bool { return alive(a, "c") && alive(b, "c") && alive(c, "a") }, 30*time.Second, 10*time.Millisecond)

	// a restarts: its kept keyring (the new key) wins over the key file,
	// which still names the old one, and it is back with b and c.
	require.NoError(t, a.Close())
	cfgA.Join = []string{b.pool.gossip().Self().Addr}
	a = start(cfgA)
	require.Equal(t, [][]byte{fresh}, a.pool.gossip().Keys(), "the removed key does not come back from the key file")
	require.Eventually(t, func() bool { return alive(a, "b") && alive(a, "c") }, 30*time.Second, 10*time.Millisecond)
}
