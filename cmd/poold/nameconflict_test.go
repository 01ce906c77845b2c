package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A second poold under the first one's --node name refuses to join, names
// the holder's address and the flag to change, and exits non-zero; the
// first keeps running and memctl status, nodes and doctor show the claim.
func TestSameNodeNameRefused(t *testing.T) {
	gossipA := freeAddr(t, "gossip")
	cluster := func(gossip string) []string {
		return []string{"--node", "twin", "--gossip", gossip, "--gossip-profile", "local",
			"--listen", freeAddr(t, "tcp"), "--insecure", "--data-listen", freeAddr(t, "tcp"), "--export-size", "16MiB"}
	}
	a := startDaemon(t, t.TempDir(), filepath.Join(shortDir(t), "a.sock"), cluster(gossipA)...)
	gossipB := freeAddr(t, "gossip")
	// It may exit before its socket is ever seen answering: not waited for.
	b := launchDaemon(t, nil, t.TempDir(), filepath.Join(shortDir(t), "b.sock"), append(cluster(gossipB), "--join", gossipA)...)

	exited := make(chan error, 1)
	go func() { exited <- b.cmd.Wait() }()
	select {
	case err := <-exited:
		require.Error(t, err, "the second poold must not keep running: %s", b.log)
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee)
		require.NotEqual(t, 0, ee.ExitCode())
	case <-time.After(30 * time.Second):
		t.Fatalf("the second poold under a taken name still runs after 30s: %s", b.log)
	}
	log := b.log.String()
	require.Contains(t, log, `node name "twin" is already used by a live member at `+gossipA)
	require.Contains(t, log, "--node")
	require.True(t, strings.HasPrefix(lastLine(strings.TrimSpace(log)), "poold:"), log)

	run := func(args ...string) string {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		out, err := memctlCommand(ctx, append([]string{"--socket", a.socket}, args...)...).CombinedOutput()
		require.NoError(t, err, "memctl %v: %s", args, out)
		return string(out)
	}
	for _, cmd := range []string{"status", "nodes", "doctor"} {
		out := run(cmd)
		require.Contains(t, out, `node name "twin" is held by this poold (`+gossipA+`) and was also claimed by a poold gossiping at `+gossipB, "memctl %s", cmd)
		require.Contains(t, out, "unique --node", "memctl %s", cmd)
	}
	var st struct {
		Conflicts []struct {
			Claimant string `json:"claimant_addr"`
			Self     bool   `json:"self"`
		} `json:"name_conflicts"`
	}
	require.NoError(t, memctlJSON(t.Context(), a.socket, &st, "status"))
	require.Len(t, st.Conflicts, 1)
	require.Equal(t, gossipB, st.Conflicts[0].Claimant)
	require.True(t, st.Conflicts[0].Self)
	requireAlive(t, a.cmd.Process.Pid) // the holder keeps running
}
