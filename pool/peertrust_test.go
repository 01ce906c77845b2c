package pool

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
)

// TestForgedPeerFreesNothing replays the attack of a gossip member that
// announces a real node's control and data addresses under a name of its
// own ("evil2"): a daemon that talked to b under the name evil2 placed
// segments there, then took every segment it had on b for an orphan of
// evil2 and freed them. Now the certificate must name the node dialed, so
// evil2 is refused (and logged) and never chosen, and a session that
// somehow answers under another node's name frees nothing: every segment a
// recorded under b stays active on b with its contents. Without TLS
// (--insecure) the daemon's answer (Welcome.node) still tells that b is
// not evil2, which stops a mistaken or misconfigured member, not an
// attacker who runs a daemon of its own.
func TestForgedPeerFreesNothing(t *testing.T) {
	for _, tc := range []struct {
		name, refusal string
		insecure      bool
	}{
		{"tls", "peer refused: its certificate does not name it", false},
		{"insecure", "peer refused: it answers as another node", true},
	} {
		t.Run(tc.name, func(t *testing.T) { forgedPeer(t, tc.insecure, tc.refusal) })
	}
}

func forgedPeer(t *testing.T, insecure bool, refusal string) {
	var logA logBuffer
	node := func(name string) Config {
		cfg := clusterNodeConfig(t, name)
		if insecure {
			cfg.TLSCert, cfg.TLSKey, cfg.TLSCA, cfg.Insecure = "", "", "", true
		}
		return cfg
	}
	cfgA := node("a")
	a, err := Start(cfgA, slog.New(slog.NewJSONHandler(&logA, &slog.HandlerOptions{Level: slog.LevelDebug})))
	require.NoError(t, err)
	defer a.Close()
	cfgB := node("b")
	cfgB.Join = []string{seedOf(t, a)}
	b, err := Start(cfgB, nil)
	require.NoError(t, err)
	defer b.Close()
	ctx := t.Context()

	owner, err := alloc.Dial(ctx, cfgA.Socket, alloc.WithClientID("forged-peer-victim"))
	require.NoError(t, err)
	defer owner.Close()
	// Segments on b, one of them named, each with its own contents.
	var onB []*alloc.Segment
	require.Eventually(t, func() bool {
		var opts []alloc.AllocOption
		if len(onB) == 0 {
			opts = append(opts, alloc.WithName("forged-peer-named"))
		}
		seg, err := owner.Alloc(ctx, 4096, append(opts, alloc.WithTier(alloc.TierRDMA))...)
		require.NoError(t, err)
		if seg.Node() != "b" {
			require.NoError(t, seg.Free(ctx))
			return false
		}
		_, err = seg.WriteAt(contents(seg.ID()), 0)
		require.NoError(t, err)
		onB = append(onB, seg)
		return len(onB) == 4
	}, 30*time.Second, 20*time.Millisecond)

	// The rogue: a gossip member named evil2 announcing b's addresses and
	// far more free memory than anyone, so that placement prefers it. It
	// has the gossip key (an insider, or a leaked key): the key admits a
	// node to gossip, only a certificate makes it a peer.
	bm := b.pool.gossip().Self().Meta
	rc := cluster.DefaultConfig()
	rc.Name, rc.BindAddr, rc.BindPort, rc.Profile = "evil2", "127.0.0.1", 0, cluster.ProfileLocal
	rc.Keys, err = cfgA.gossipKeys()
	require.NoError(t, err)
	rogue, err := cluster.New(rc, cluster.Meta{Proto: protoVersion, GRPCAddr: bm.GRPCAddr, DataAddr: bm.DataAddr,
		Tiers: []cluster.TierFree{{Name: "rdma", Capacity: 1 << 40, Free: 1 << 40}}})
	require.NoError(t, err)
	defer rogue.Shutdown()
	_, err = rogue.Join(ctx, []string{seedOf(t, a)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		m, ok := a.pool.gossip().Member("evil2")
		return ok && m.State == cluster.StateAlive
	}, 10*time.Second, 10*time.Millisecond)

	// Placements while evil2 is a member: none is recorded under evil2.
	// At least 8, and on until a has dialed evil2 and refused it: placement
	// draws peers at random and passes over a member it holds suspect for
	// a moment, so a fixed count may never reach evil2 on a busy host.
	refused := map[string]any{"node": "evil2", "addr": bm.GRPCAddr}
	for i := 0; i < 8 || logA.find(t, refusal, refused) == nil; i++ {
		require.Less(t, i, 400, "a never dialed evil2 in 400 placements")
		seg, err := owner.Alloc(ctx, 4096, alloc.WithTier(alloc.TierRDMA))
		require.NoError(t, err)
		require.NotEqual(t, "evil2", seg.Node())
		_, err = seg.WriteAt(contents(seg.ID()), 0)
		require.NoError(t, err)
		if seg.Node() == "b" {
			onB = append(onB, seg)
		}
		if i >= 8 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	nodes, err := keyringAPI(t, a).Nodes(ctx, &poolv1.NodesRequest{})
	require.NoError(t, err)
	for _, n := range nodes.Nodes {
		if n.Name == "evil2" {
			require.Contains(t, n.Refused, `"b"`, "memctl nodes says why evil2 is refused: b answered")
		} else {
			require.Empty(t, n.Refused, n.Name)
		}
	}

	// Everything that reconciles asks evil2 and every peer again.
	_, ok := a.pool.reconcile(ctx, "evil2")
	require.True(t, ok)
	a.pool.sweepPeers(ctx)

	// A session with b that a holds under another node's name (as the
	// old code opened one) must not free b's segments either.
	impostor, err := session.Dial(ctx, "tcp", bm.GRPCAddr, session.Options{ClientID: peerClientPrefix + "a", TLS: a.pool.peers.tls})
	require.NoError(t, err)
	a.pool.peers.mu.Lock()
	a.pool.peers.conns["evil3"] = impostor
	a.pool.peers.mu.Unlock()
	_, ok = a.pool.reconcile(ctx, "evil3")
	require.False(t, ok, "a List answered by b under the name evil3 is refused")
	a.pool.peers.mu.Lock()
	_, kept := a.pool.peers.conns["evil3"]
	a.pool.peers.mu.Unlock()
	require.False(t, kept, "the session that answered under another name is dropped")
	a.pool.sweepPeers(ctx)
	a.pool.peers.wg.Wait() // the frees reconcile started, if any

	// Every segment a recorded under b is active on b, contents intact.
	a.pool.mu.Lock()
	var homed []record
	for _, r := range a.pool.segs {
		require.NotEqual(t, "evil2", r.Home)
		if r.Home == "b" {
			homed = append(homed, *r)
		}
	}
	a.pool.mu.Unlock()
	require.Len(t, homed, len(onB))
	for _, r := range homed {
		require.False(t, r.Lost, "segment %d", r.ID)
		at, err := b.pool.Stat(r.HomeID)
		require.NoError(t, err, "segment %d (at b %d) was freed", r.ID, r.HomeID)
		require.False(t, at.Lost)
	}
	for _, seg := range onB {
		got := make([]byte, 64)
		_, err := seg.ReadAt(got, 0)
		require.NoError(t, err, "segment %d", seg.ID())
		require.True(t, bytes.Equal(contents(seg.ID()), got), "segment %d", seg.ID())
	}
	resp, err := a.pool.peerConns().conn("b").API().List(sessionCtx(t, a, "b"), &poolv1.ListRequest{})
	require.NoError(t, err)
	active := 0
	for _, s := range resp.Segments {
		if s.Owner == peerClientPrefix+"a" && s.State == poolv1.SegmentState_SEGMENT_STATE_ACTIVE {
			active++
		}
	}
	require.Equal(t, len(onB), active, "b holds every segment of a's, and no more")
}

// contents is what the test writes into segment id: 64 bytes naming it.
func contents(id uint64) []byte {
	return fmt.Appendf(nil, "%-64s", fmt.Sprintf("segment %d", id))
}

// sessionCtx is a call context on d's session with its peer node.
func sessionCtx(t *testing.T, d *Daemon, node string) context.Context {
	ctx, _, err := d.pool.peerConns().conn(node).Call(t.Context())
	require.NoError(t, err)
	return ctx
}

// TestOwnCredTLS: a data-plane dial that carries this daemon's own
// credential (a forwarding link, a push that names no credential) goes in
// plaintext only to the address the target node gossips: a peer cannot
// have the credential sent in plaintext to an address of its choosing and
// then use it at the target as this daemon. That holds for a daemon whose
// own data plane is plaintext (--data-insecure, as a is here) too: the
// target's may serve TLS, which keeps its connections there off the wire.
// A TLS dial, which verifies the node's certificate, is as asked.
func TestOwnCredTLS(t *testing.T) {
	cfgA := clusterNodeConfig(t, "a")
	cfgA.DataInsecure = true
	a := startNode(t, cfgA)
	startNode(t, clusterNodeConfig(t, "b"), a)
	require.Eventually(t, func() bool {
		m, ok := a.pool.cl.Member("b")
		return ok && m.Meta.DataAddr != ""
	}, 30*time.Second, 10*time.Millisecond, "a sees b's data plane")
	require.False(t, a.moveTLS().byDefault, "a's own data plane is plaintext")
	m, _ := a.pool.cl.Member("b")
	useTLS, err := a.pool.ownCredTLS("b", "127.0.0.1:1", false)
	require.ErrorIs(t, err, errs.ErrAccessDenied, "plaintext to an address b does not gossip")
	require.False(t, useTLS)
	_, err = a.pool.ownCredTLS("nobody", m.Meta.DataAddr, false)
	require.ErrorIs(t, err, errs.ErrAccessDenied, "plaintext to a node that is no member")
	useTLS, err = a.pool.ownCredTLS("b", m.Meta.DataAddr, false)
	require.NoError(t, err, "plaintext to b's gossiped address (a --data-insecure node)")
	require.False(t, useTLS)
	useTLS, err = a.pool.ownCredTLS("b", "127.0.0.1:1", true)
	require.NoError(t, err, "TLS verifies b's certificate wherever it is dialed")
	require.True(t, useTLS)
}
