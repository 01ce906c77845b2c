package pool

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
)

// measuredNodeConfig is clusterNodeConfig with the tiers and peers
// measured, as poold runs by default, and tiers large enough for the
// tier probe (probeMinSpan is at most a quarter of their largest free
// extent), the export also while a peer's probe segment takes some of it.
func measuredNodeConfig(t *testing.T, node string) Config {
	cfg := clusterNodeConfig(t, node)
	cfg.MeasureTiers = true
	cfg.EmulateCXL, cfg.LocalSize, cfg.ExportSize = 4*probeMinSpan, 4*probeMinSpan, 5*probeMinSpan
	return cfg
}

// peerLatency is what d measured of node's data plane (Nodes), nil when
// nothing.
func peerLatency(t *testing.T, d *Daemon, node string) *poolv1.PeerLatency {
	resp, err := (&service{d: d}).Nodes(t.Context(), &poolv1.NodesRequest{})
	require.NoError(t, err)
	for _, n := range resp.Nodes {
		if n.Name == node {
			return n.Latency
		}
	}
	return nil
}

// waitPeerLatency waits until d has a measurement of node that ok accepts.
func waitPeerLatency(t *testing.T, d *Daemon, node string, ok func(*poolv1.PeerLatency) bool, what string) *poolv1.PeerLatency {
	t.Helper()
	var l *poolv1.PeerLatency
	require.Eventually(t, func() bool {
		l = peerLatency(t, d, node)
		return l != nil && ok(l)
	}, 30*time.Second, 20*time.Millisecond, "%s never %s: %v", d.cfg.Node, what, l)
	return l
}

func allMeasured(tiers []*poolv1.TierInfo) bool {
	for _, ti := range tiers {
		if ti.ReadLatency.GetP50Ns() <= 0 || ti.ReadLatency.GetSamples() <= 0 {
			return false
		}
	}
	return true
}

func hasFigures(l *poolv1.PeerLatency) bool {
	return l.Unmeasured == "" && l.ReadLatency.GetSamples() > 0
}

// TestPeersMeasured starts two daemons that measure as poold does by
// default and checks that each measures the other's data plane when it
// joins, over TLS, and again periodically, and shows it: every tier either shows, the peers' rdma
// tier included, has a measured read latency p50 (the peers' with source
// "measured: peer NODE"), the loopback note speaks of the peer that is
// there, and the latency matrix has both rows.
func TestPeersMeasured(t *testing.T) {
	cfgA := measuredNodeConfig(t, "a")
	cfgA.MeasurePeersEvery = time.Second
	a := startNode(t, cfgA)
	b := startNode(t, measuredNodeConfig(t, "b"), a)

	for _, c := range []struct {
		d    *Daemon
		peer string
	}{{a, "b"}, {b, "a"}} {
		l := waitPeerLatency(t, c.d, c.peer, hasFigures, "measured its peer")
		require.Equal(t, peerSource(c.peer), l.ReadLatency.Source)
		require.Positive(t, l.ReadLatency.P50Ns)
		require.GreaterOrEqual(t, l.ReadLatency.P99Ns, l.ReadLatency.P50Ns)
		require.Equal(t, int64(peerProbeSamples), l.ReadLatency.Samples)
		require.Positive(t, l.Read_4KLatency.GetP50Ns())
		require.Positive(t, l.ReadBandwidthBps)
		require.NotZero(t, l.MeasuredUnixMs)
		other := a
		if c.d == a {
			other = b
		}
		require.Equal(t, other.pool.data().addr, l.DataAddr)
	}

	// Every tier a shows has a measured read latency once both probes ran.
	var tiers []*poolv1.TierInfo
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := (&service{d: a}).Tiers(t.Context(), &poolv1.TiersRequest{})
		require.NoError(t, err)
		tiers = resp.Tiers
		if allMeasured(tiers) && len(tiers) == 4 {
			break
		}
		require.True(t, time.Now().Before(deadline), "a's tiers never all showed a measured read latency: %v", tiers)
	}
	for _, ti := range tiers {
		switch {
		case ti.Tier == poolv1.Tier_TIER_RDMA && ti.Kind == "tcp":
			require.Equal(t, peerSource("b"), ti.ReadLatency.Source)
			require.Positive(t, ti.ReadBandwidthBps)
			require.Contains(t, ti.Note, "64-byte reads from this node over each peer's data plane: b ")
		case ti.Tier == poolv1.Tier_TIER_RDMA:
			require.Equal(t, "measured", ti.ReadLatency.Source)
			require.NotContains(t, ti.Note, "no peer")
		default:
			require.Equal(t, "measured", ti.ReadLatency.Source)
		}
	}
	// The probe segments are freed at the peers.
	require.Eventually(t, func() bool { return b.pool.segmentCount() == 0 && a.pool.segmentCount() == 0 },
		10*time.Second, 20*time.Millisecond, "a probe segment was left behind")

	// a measures b again every second or so (b, at its default, not for
	// minutes): a later figure replaces the first.
	first := peerLatency(t, a, "b")
	waitPeerLatency(t, a, "b", func(l *poolv1.PeerLatency) bool {
		return hasFigures(l) && l.MeasuredUnixMs > first.MeasuredUnixMs
	}, "measured b again")

	resp, err := (&service{d: a}).Nodes(t.Context(), &poolv1.NodesRequest{Matrix: true})
	require.NoError(t, err)
	require.Len(t, resp.Matrix, 2)
	for i, want := range [][2]string{{"a", "b"}, {"b", "a"}} {
		row := resp.Matrix[i]
		require.Equal(t, want[0], row.From)
		require.Empty(t, row.Error)
		require.Len(t, row.To, 1)
		require.Equal(t, want[1], row.To[0].Node)
		require.True(t, hasFigures(row.To[0]), "%v", row.To[0])
	}
}

// TestPeerRemeasuredOnChange checks that a peer announcing another
// data-plane address loses its figures at once (they were of the old
// address) and is measured again; that an address where nothing answers
// the probe shows as unmeasured with why, never with the old figure; and
// that moving back brings a fresh measurement.
func TestPeerRemeasuredOnChange(t *testing.T) {
	a := startNode(t, measuredNodeConfig(t, "a"))
	b := startNode(t, measuredNodeConfig(t, "b"), a)
	first := waitPeerLatency(t, a, "b", hasFigures, "measured b")
	real := b.pool.data().addr

	// A data plane that hangs up at once: the probe gets no answer.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	dead := ln.Addr().String()
	require.NoError(t, b.pool.gossip().SetMeta(func(m *cluster.Meta) { m.DataAddr = dead }))
	l := waitPeerLatency(t, a, "b", func(l *poolv1.PeerLatency) bool {
		return l.DataAddr == dead && strings.Contains(l.Unmeasured, "dial its data plane at "+dead)
	}, "said b's new address does not answer")
	require.Nil(t, l.ReadLatency, "a figure of the old address is shown as current")
	require.Zero(t, l.ReadBandwidthBps)
	require.GreaterOrEqual(t, l.MeasuredUnixMs, first.MeasuredUnixMs)

	resp, err := (&service{d: a}).Tiers(t.Context(), &poolv1.TiersRequest{})
	require.NoError(t, err)
	for _, ti := range resp.Tiers {
		if ti.Tier == poolv1.Tier_TIER_RDMA && ti.Kind == "tcp" {
			require.Nil(t, ti.ReadLatency, "the peers' tier shows a figure although its only peer is unmeasured")
			require.Contains(t, ti.Note, "b unmeasured: dial its data plane at "+dead)
		}
	}

	require.NoError(t, b.pool.gossip().SetMeta(func(m *cluster.Meta) { m.DataAddr = real }))
	again := waitPeerLatency(t, a, "b", func(l *poolv1.PeerLatency) bool { return l.DataAddr == real && hasFigures(l) }, "measured b again at its real address")
	require.Greater(t, again.MeasuredUnixMs, first.MeasuredUnixMs-1)
}

// TestPlacementWeighsPeerLatency checks how a's rdma placements use what
// it measured of its peers (figures set here, as a probe would): of two
// peers with about the same free fraction the nearer takes them; one much
// emptier wins although it is farther (capacity first); a budget keeps
// only the peers measured within it, and one no peer nor the loopback
// meets is refused with the best figure.
func TestPlacementWeighsPeerLatency(t *testing.T) {
	a := startNode(t, clusterNodeConfig(t, "a"))
	b := startNode(t, clusterNodeConfig(t, "b"), a)
	startNode(t, clusterNodeConfig(t, "c"), a)
	require.Eventually(t, func() bool { pt := a.pool.peerTier(); return pt != nil && len(pt.Devices) == 2 },
		30*time.Second, 20*time.Millisecond, "a never saw both peers")
	for node, p50 := range map[string]time.Duration{"b": 100 * time.Microsecond, "c": 2 * time.Millisecond} {
		// At the address a knows: a gossip update of the peer's metadata
		// drops figures taken at another one.
		m, ok := a.pool.gossip().Member(node)
		require.True(t, ok)
		require.NotEmpty(t, m.Meta.DataAddr, "a knows %s's data plane", node)
		a.pool.pm.set(&poolv1.PeerLatency{Node: node, DataAddr: m.Meta.DataAddr, ReadBandwidthBps: 1e9, MeasuredUnixMs: time.Now().UnixMilli(),
			ReadLatency: &poolv1.Latency{P50Ns: p50.Nanoseconds(), P99Ns: 2 * p50.Nanoseconds(), Samples: 1, Source: peerSource(node)}})
	}
	alloc := func(req allocRequest) (*record, error) {
		req.Persist = true
		if req.Tier == poolv1.Tier_TIER_UNSPECIFIED {
			req.Tier = poolv1.Tier_TIER_RDMA
		}
		return a.pool.Alloc(t.Context(), caller{}, req)
	}

	// Both peers alive in a's view (a busy host can leave one suspect for
	// a moment, and Pick passes a suspect member over).
	bothAlive := func() {
		require.Eventually(t, func() bool {
			n := 0
			for _, m := range a.pool.gossip().Members() {
				if m.Name != "a" && m.Usable() {
					n++
				}
			}
			return n == 2
		}, 30*time.Second, 10*time.Millisecond, "a does not see b and c alive")
	}
	for range 4 { // 256 KiB of 16 MiB: well within nearSlack
		bothAlive()
		r, err := alloc(allocRequest{Size: 64 << 10})
		require.NoError(t, err)
		require.Equal(t, "b", r.Home, r.placement.Reason)
		require.Equal(t, peerSource("b"), r.placement.ReadLatency.GetSource())
		require.Contains(t, r.placement.Reason, "on peer b: 100µs p50 (measured: peer b)")
	}

	bothAlive()
	r, err := alloc(allocRequest{Size: 4096, MaxReadLatencyNs: time.Millisecond.Nanoseconds()})
	require.NoError(t, err)
	require.Equal(t, "b", r.Home)

	bothAlive() // with b suspect, the best tier a names is c's
	_, err = alloc(allocRequest{Size: 4096, MaxReadLatencyNs: (50 * time.Microsecond).Nanoseconds()})
	require.ErrorIs(t, err, errs.ErrOverBudget)
	require.ErrorContains(t, err, "reads in 100µs p50 (measured: peer b), over 50µs")

	// b fills by a quarter on its own; once a hears of it, c is much the
	// emptier and takes placements although it is farther.
	_, err = b.pool.Alloc(t.Context(), caller{}, allocRequest{Size: 4 << 20, Tier: poolv1.Tier_TIER_RDMA, Persist: true, HomeOnly: true})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		m, ok := a.pool.gossip().Member("b")
		rt, _ := m.Meta.Tier("rdma")
		return ok && rt.Free < rt.Capacity*3/4
	}, 30*time.Second, 20*time.Millisecond, "a never heard that b filled")
	bothAlive()
	r, err = alloc(allocRequest{Size: 4096})
	require.NoError(t, err)
	require.Equal(t, "c", r.Home)
}
