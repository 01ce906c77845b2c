package main

import (
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/certs"
)

// tlsGossipArgs are the flags of node name with a TLS control plane and
// gossip on free loopback ports, its certificate made in a directory of
// the test's (certs.Init, which also writes gossip.key there).
func tlsGossipArgs(t *testing.T, name string) []string {
	return tlsGossip(t, name).args()
}

// gossipNode is where one daemon of these tests keeps things.
type gossipNode struct {
	name, sock, data, gossip, certs string
}

func tlsGossip(t *testing.T, name string) gossipNode {
	n := gossipNode{name: name, sock: filepath.Join(shortDir(t), "p.sock"), data: t.TempDir(),
		gossip: freeAddr(t, "gossip"), certs: certDir(t)}
	_, err := certs.Init(n.certs, certs.InitOptions{Nodes: []certs.Node{{Name: name}}})
	require.NoError(t, err)
	return n
}

func (n gossipNode) args() []string {
	return []string{"--node", n.name, "--socket", n.sock, "--data-dir", n.data, "--shm-dir", filepath.Join(n.data, "shm"),
		"--listen", "127.0.0.1:0", "--gossip", n.gossip, "--gossip-profile", "local", "--gossip-push-pull", gossipPushPull.String(),
		"--tls-cert", certs.CertFile(n.certs, n.name), "--tls-key", certs.KeyFile(n.certs, n.name), "--tls-ca", certs.CAFile(n.certs)}
}

// certDir is one certificate directory per test: its daemons share the CA
// and the gossip key.
func certDir(t *testing.T) string {
	if d, ok := certDirs[t.Name()]; ok {
		return d
	}
	d := t.TempDir()
	certDirs[t.Name()] = d
	t.Cleanup(func() { delete(certDirs, t.Name()) })
	return d
}

var certDirs = map[string]string{}

// TestKeylessNodeNotAdmitted runs three poold binaries: a and b with the
// gossip key that certs init wrote, c with --gossip-insecure and the most
// memory to lend. memctl nodes on a and b never lists c, and no placement
// lands on it.
func TestKeylessNodeNotAdmitted(t *testing.T) {
	key := certs.GossipKeyFile(certDir(t))
	outsiderNotAdmitted(t, []string{"--gossip-key-file", key}, []string{"--gossip-insecure"})
}

// TestOtherClusterNotAdmitted: the same with c holding the gossip key too
// but naming another cluster (--gossip-cluster): the name keeps it out,
// and memctl status on a names a's cluster.
func TestOtherClusterNotAdmitted(t *testing.T) {
	key := certs.GossipKeyFile(certDir(t))
	a := outsiderNotAdmitted(t, []string{"--gossip-key-file", key, "--gossip-cluster", "farm-1"},
		[]string{"--gossip-key-file", key, "--gossip-cluster", "farm-2"})
	out, err := memctlCommand(t.Context(), "--socket", a.socket, "status").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), `cluster "farm-1"`, "status names the cluster")
	out, err = memctlCommand(t.Context(), "--socket", a.socket, "status", "-o", "json").Output()
	require.NoError(t, err)
	var st struct {
		GossipCluster string `json:"gossip_cluster"`
	}
	require.NoError(t, json.Unmarshal(out, &st), "%s", out)
	require.Equal(t, "farm-1", st.GossipCluster)
}

// outsiderNotAdmitted runs a and b with the flags member, c with the flags
// outsider and the most memory to lend, joining a: memctl nodes on a and b
// never lists c, and no placement lands on it. It returns a.
func outsiderNotAdmitted(t *testing.T, member, outsider []string) *daemon {
	start := func(name string, extra ...string) (*daemon, gossipNode) {
		n := tlsGossip(t, name)
		// startDaemon's own flags come first; these override them.
		return startDaemon(t, n.data, n.sock, append(n.args(), extra...)...), n
	}
	a, na := start("a", append(member, "--export-size", "64MiB")...)
	b, _ := start("b", append(member, "--export-size", "64MiB", "--join", na.gossip)...)
	_, _ = start("c", append(outsider, "--export-size", "512MiB", "--join", na.gossip)...)

	nodes := func(sock string) []string {
		out, err := memctlCommand(t.Context(), "--socket", sock, "nodes", "-o", "json").CombinedOutput()
		require.NoError(t, err, "%s", out)
		var ns []struct {
			Name  string `json:"name"`
			State string `json:"state"`
		}
		require.NoError(t, json.Unmarshal(out, &ns), "%s", out)
		var names []string
		for _, n := range ns {
			if n.State == "alive" {
				names = append(names, n.Name)
			}
		}
		return names
	}
	require.Eventually(t, func() bool { return len(nodes(a.socket)) == 2 && len(nodes(b.socket)) == 2 }, 30*time.Second, 50*time.Millisecond)

	ctx := t.Context()
	client, err := alloc.Dial(ctx, a.socket, alloc.WithClientID("keyless-test"))
	require.NoError(t, err)
	defer client.Close()
	onB := 0
	require.Eventually(t, func() bool {
		seg, err := client.Alloc(ctx, 1<<20, alloc.WithTier(alloc.TierRDMA))
		require.NoError(t, err)
		require.NotEqual(t, "c", seg.Node())
		if seg.Node() == "b" {
			onB++
		}
		return onB == 8
	}, 30*time.Second, 20*time.Millisecond)
	for _, d := range []*daemon{a, b} {
		require.ElementsMatch(t, []string{"a", "b"}, nodes(d.socket), "c is not admitted")
	}
	out, err := memctlCommand(t.Context(), "--socket", a.socket, "status").CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.NotContains(t, string(out), "gossip is not sealed")
	return a
}
