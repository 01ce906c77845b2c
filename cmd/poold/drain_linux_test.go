package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/certs"
)

// drainView is `memctl drain -o json`, and the drain fields of
// `memctl status -o json`.
type drainView struct {
	Node     string `json:"node"`
	Draining bool   `json:"draining"`
	Changed  bool   `json:"changed"`
	Since    string `json:"draining_since"`
}

// drainNodeView is a node of `memctl nodes -o json`, as these tests read it.
type drainNodeView struct {
	Name     string `json:"name"`
	State    string `json:"state"`
	GRPCAddr string `json:"grpc_addr"`
	Draining bool   `json:"draining"`
	Since    string `json:"draining_since"`
}

// memctlText runs memctl on sock and returns its stdout, its stderr and
// whether it exited 0.
func memctlText(t *testing.T, sock string, args ...string) (stdout, stderr string, ok bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	cmd := memctlCommand(ctx, append([]string{"--socket", sock}, args...)...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("memctl %v: %v", args, err)
	}
	return out.String(), errOut.String(), err == nil
}

// nodeSeen returns node name as the daemon on sock lists it.
func nodeSeen(t *testing.T, sock, name string) (drainNodeView, error) {
	var nodes []drainNodeView
	if err := memctlJSON(t.Context(), sock, &nodes, "nodes"); err != nil {
		return drainNodeView{}, err
	}
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return drainNodeView{}, fmt.Errorf("%s lists no node %s: %+v", sock, name, nodes)
}

// rdmaHome allocates a 1 MiB rdma segment through the daemon on sock and
// returns the node it landed on; the client is closed before it returns.
func rdmaHome(t *testing.T, sock string) (string, error) {
	c, err := alloc.Dial(t.Context(), sock, alloc.WithClientID("drain-test"))
	require.NoError(t, err)
	defer c.Close()
	seg, err := c.Alloc(t.Context(), 1<<20, alloc.WithTier(alloc.TierRDMA))
	if err != nil {
		return "", err
	}
	return seg.Node(), nil
}

// drainingGauge returns farmem_draining from the metrics endpoint at addr.
func drainingGauge(t *testing.T, addr string) float64 {
	t.Helper()
	var code int
	var body string
	require.Eventually(t, func() bool { code, body = httpGet(addr, "/metrics"); return code == http.StatusOK },
		10*time.Second, 20*time.Millisecond, "/metrics: %d %s", code, body)
	return sampleValue(t, body, "farmem_draining")
}

// TestDrainSurvivesRestart runs two poold binaries: a, and b, which lends
// 16 MiB; a places rdma segments on its peer first, on itself when no peer
// takes them. memctl on a drains b: the request
// reaches b's daemon, which keeps it. Through a kill -9 and a restart of b
// the drain holds — b's status, b's metrics, a's view of b's gossip from
// b's first announcement on, and a's placements, which no longer land on
// b — until memctl drain b --undo; after another kill -9 and restart b is
// not draining and takes placements again. Draining a node nobody knows,
// and undoing a drain twice, say so.
func TestDrainSurvivesRestart(t *testing.T) {
	na, nb := tlsGossip(t, "a"), tlsGossip(t, "b")
	key := certs.GossipKeyFile(certDir(t))
	metricsB := freeAddr(t, "tcp")
	a := startDaemon(t, na.data, na.sock, append(na.args(), "--gossip-key-file", key)...)
	bArgs := append(nb.args(), "--gossip-key-file", key, "--export-size", "16MiB", "--join", na.gossip, "--metrics", metricsB)
	b := startDaemon(t, nb.data, nb.sock, bArgs...)

	// a places its rdma segments on b once it has heard of b's memory.
	require.Eventually(t, func() bool { node, err := rdmaHome(t, a.socket); return err == nil && node == "b" },
		30*time.Second, 50*time.Millisecond, "a never placed an rdma segment on b")

	var dr drainView
	require.NoError(t, memctlJSON(t.Context(), a.socket, &dr, "drain", "b"))
	require.Equal(t, drainView{Node: "b", Draining: true, Changed: true, Since: dr.Since}, dr, "drained through a, answered by b")
	since := dr.Since
	require.NotEmpty(t, since)
	out, errOut, ok := memctlText(t, a.socket, "drain", "b")
	require.True(t, ok, errOut)
	require.Contains(t, out, "b was already draining since "+since)
	require.Contains(t, out, "no new placements; its segments stay unless --evacuate moves them")

	noPlacementOnB := func(why string) {
		t.Helper()
		node, err := rdmaHome(t, a.socket)
		require.NoError(t, err, why)
		require.Equal(t, "a", node, "%s: a's rdma segment goes to its own memory, not to b", why)
	}
	require.Eventually(t, func() bool { n, err := nodeSeen(t, a.socket, "b"); return err == nil && n.Draining && n.Since == since },
		30*time.Second, 50*time.Millisecond, "a never saw b drain since %s", since)
	noPlacementOnB("b drains")

	// kill -9 and restart: b drains on, and says so from its first gossip.
	before, err := nodeSeen(t, a.socket, "b")
	require.NoError(t, err)
	b.kill9(t)
	b = startDaemon(t, nb.data, nb.sock, bArgs...)
	var st drainView
	require.NoError(t, memctlJSON(t.Context(), b.socket, &st, "status"))
	require.True(t, st.Draining, "b forgot its drain across a kill -9")
	require.Equal(t, since, st.Since, "the drain keeps its start")
	self, err := nodeSeen(t, b.socket, "b")
	require.NoError(t, err)
	require.True(t, self.Draining)
	require.Equal(t, since, self.Since)
	require.Equal(t, 1.0, drainingGauge(t, metricsB))
	out, errOut, ok = memctlText(t, b.socket, "status")
	require.True(t, ok, errOut)
	require.Contains(t, out, "node b is draining since "+since)
	// Every view a has of the new b (a new control-plane port) shows it
	// draining: it never announced free space that it then refuses.
	require.Eventually(t, func() bool {
		n, err := nodeSeen(t, a.socket, "b")
		require.NoError(t, err)
		if n.GRPCAddr == before.GRPCAddr || n.State != "alive" {
			return false
		}
		require.True(t, n.Draining, "a sees the restarted b not draining: %+v", n)
		require.Equal(t, since, n.Since, "b gossips its drain's start")
		return true
	}, 30*time.Second, 10*time.Millisecond, "a never saw b come back")
	noPlacementOnB("b drains after its restart")

	dr = drainView{}
	require.NoError(t, memctlJSON(t.Context(), a.socket, &dr, "drain", "b", "--undo"))
	require.Equal(t, drainView{Node: "b", Changed: true}, dr)
	out, errOut, ok = memctlText(t, a.socket, "drain", "b", "--undo")
	require.True(t, ok, "an undo of a node not draining is no error: %s", errOut)
	require.Equal(t, "b was not draining; nothing to undo\n", out)

	b.kill9(t)
	b = startDaemon(t, nb.data, nb.sock, bArgs...)
	st = drainView{}
	require.NoError(t, memctlJSON(t.Context(), b.socket, &st, "status"))
	require.False(t, st.Draining, "b drains again after the undo and a restart")
	require.Empty(t, st.Since)
	require.Equal(t, 0.0, drainingGauge(t, metricsB))
	require.Eventually(t, func() bool { node, err := rdmaHome(t, a.socket); return err == nil && node == "b" },
		30*time.Second, 50*time.Millisecond, "a never placed on b again after the undo")
	n, err := nodeSeen(t, a.socket, "b")
	require.NoError(t, err)
	require.False(t, n.Draining)
	require.Empty(t, n.Since)

	_, errOut, ok = memctlText(t, a.socket, "drain", "zz")
	require.False(t, ok, "draining a node nobody knows must fail")
	require.Contains(t, errOut, `node "zz": not found: no such member; the alive members are a, b`)
}
