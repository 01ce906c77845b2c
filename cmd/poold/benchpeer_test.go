package main

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBenchPeerHomeServerCPU: memctl bench on a poold that lends no rdma
// memory of its own, beside a peer poold on this host that does, puts the
// rdma tier's segment on the peer and reports the peer's CPU time per read
// in the server column (the home found by its loopback data-plane port).
func TestBenchPeerHomeServerCPU(t *testing.T) {
	gossipA := freeAddr(t, "gossip")
	args := func(node, gossip, export string) []string {
		return []string{"--node", node, "--gossip", gossip, "--gossip-profile", "local",
			"--listen", freeAddr(t, "tcp"), "--insecure", "--data-listen", freeAddr(t, "tcp"), "--export-size", export}
	}
	a := startDaemon(t, t.TempDir(), filepath.Join(shortDir(t), "a.sock"), args("a", gossipA, "0")...)
	startDaemon(t, t.TempDir(), filepath.Join(shortDir(t), "b.sock"), append(args("b", freeAddr(t, "gossip"), "16MiB"), "--join", gossipA)...)
	waitFor(t, 100*time.Millisecond, func() (bool, string) {
		var nodes []nodeView
		if err := memctlJSON(t.Context(), a.socket, &nodes, "nodes"); err != nil {
			return false, err.Error()
		}
		for _, n := range nodes {
			if n.Name == "b" && n.State == "alive" {
				return true, ""
			}
		}
		return false, "a does not see b alive"
	})

	var rows []struct {
		System string   `json:"system"`
		Ops    int64    `json:"ops"`
		Server *float64 `json:"server_cpu_ns_per_op"`
	}
	require.NoError(t, memctlJSON(t.Context(), a.socket, &rows, "bench", "--tiers", "rdma", "--ops", "read",
		"--sizes", "4KiB", "--depths", "1", "--duration", "200ms", "--rounds", "1"))
	require.Len(t, rows, 1)
	require.Equal(t, "farmem-rdma", rows[0].System)
	require.Positive(t, rows[0].Ops)
	require.NotNil(t, rows[0].Server, "the peer home's CPU per read")
	require.Positive(t, *rows[0].Server)
}
