package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/pool"
)

// TestPeersInTiersAndNodes runs two daemons in a cluster, measuring as
// poold does by default, and checks what memctl shows of the peer's data
// plane: every tier of tiers -o json, the peers' rdma tier included, has a
// measured read_latency.p50_ns with its source; nodes shows the latency to
// the peer; nodes --matrix has a row per node.
func TestPeersInTiersAndNodes(t *testing.T) {
	dir := t.TempDir()
	_, errOut, code := memctl(t, "", "certs", "init", "--dir", dir, "--nodes", "a,b")
	require.Zero(t, code, errOut)
	node := func(name string, join ...string) pool.Config {
		cfg := pooltest.Config(t)
		cfg.Node, cfg.Listen, cfg.Gossip, cfg.GossipProfile, cfg.Join = name, "127.0.0.1:0", "127.0.0.1:0", "local", join
		cfg.TLSCert, cfg.TLSKey, cfg.TLSCA = certs.CertFile(dir, name), certs.KeyFile(dir, name), certs.CAFile(dir)
		cfg.GossipKeyFile = certs.GossipKeyFile(dir)
		cfg.MeasureTiers = true
		// Room for the tier probe's 16 MiB span while the peer's probe
		// holds 2 MiB of the export.
		cfg.ExportSize = 80 * size.MiB
		pooltest.Start(t, cfg)
		return cfg
	}
	a := node("a")
	var self []nodeJSON
	out, errOut, code := memctl(t, a.Socket, "nodes", "-o", "json")
	require.Zero(t, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &self))
	require.Len(t, self, 1)
	b := node("b", self[0].GossipAddr)

	for _, c := range []struct{ socket, peer string }{{a.Socket, "b"}, {b.Socket, "a"}} {
		var tiers []tierJSON
		require.Eventually(t, func() bool {
			out, _, code := memctl(t, c.socket, "tiers", "-o", "json")
			tiers = nil
			if code != 0 || json.Unmarshal([]byte(out), &tiers) != nil || len(tiers) != 4 {
				return false
			}
			for _, ti := range tiers {
				if ti.ReadLatency == nil || ti.ReadLatency.P50Ns <= 0 || ti.ReadLatency.Samples <= 0 {
					return false
				}
			}
			return true
		}, 30*time.Second, 50*time.Millisecond, "tiers -o json never showed a measured read_latency.p50_ns on every tier")
		for _, ti := range tiers {
			want := "measured"
			if ti.Kind == "tcp" {
				want = "measured: peer " + c.peer
			}
			require.Equal(t, want, ti.ReadLatency.Source, "tier %s (%s)", ti.Tier, ti.Kind)
		}
	}

	out, errOut, code = memctl(t, a.Socket, "tiers")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "(measured: peer b)")
	require.NotContains(t, out, "no peer")
	t.Log("\n" + out)

	out, errOut, code = memctl(t, a.Socket, "nodes")
	require.Zero(t, code, errOut)
	require.Contains(t, out, "READ LATENCY")
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "b ") {
			require.Regexp(t, `\d+(\.\d+)?(ns|µs|ms|s) p50`, line)
		}
		if strings.HasPrefix(line, "a (self)") {
			require.NotContains(t, line, "p50")
		}
	}
	t.Log("\n" + out)

	var rows []latencyRowJSON
	out, errOut, code = memctl(t, a.Socket, "nodes", "--matrix", "-o", "json")
	require.Zero(t, code, errOut)
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	require.Len(t, rows, 2)
	for i, want := range [][2]string{{"a", "b"}, {"b", "a"}} {
		require.Equal(t, want[0], rows[i].From)
		require.Empty(t, rows[i].Error)
		require.Len(t, rows[i].To, 1)
		require.Equal(t, want[1], rows[i].To[0].Node)
		require.Positive(t, rows[i].To[0].ReadLatency.P50Ns)
		require.Empty(t, rows[i].To[0].Unmeasured)
	}
	out, errOut, code = memctl(t, a.Socket, "nodes", "--matrix")
	require.Zero(t, code, errOut)
	require.Regexp(t, `(?m)^FROM \\ TO\s+a\s+b\s*$`, out)
	require.Regexp(t, `(?m)^a\s+-\s+\S+ p50\s*$`, out)
	require.Regexp(t, `(?m)^b\s+\S+ p50\s+-\s*$`, out)
	t.Log("\n" + out)
}
