// This file holds the measurement of peers' data planes: this daemon's row
// of the cluster's latency matrix. A probe allocates a small segment at
// the peer through its peer session, times one-sided reads of it over the
// real data plane (the one clients of this host use), and frees it. Peers
// are probed when they join or come back, when they announce another
// data-plane address, and every Config.MeasurePeersEvery with jitter.

package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/probe"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
	"google.golang.org/protobuf/proto"
)

const (
	// peerProbeSize is the probe segment at a peer: large enough for the
	// bandwidth reads (1 MiB each), small enough for a nearly full peer.
	peerProbeSize = int64(2 * size.MiB)
	// peerProbeSamples is the number of timed 64-byte and of 4 KiB reads:
	// enough for a p99, and a probe takes well under a second on loopback.
	peerProbeSamples = 200
	// peerProbeTimeout bounds one probe, session dial included.
	peerProbeTimeout = 10 * time.Second
	// peerProbeRetries is how often a probe is repeated when the peer
	// announced another data-plane address while it ran.
	peerProbeRetries = 3
)

// peerMeasures is this daemon's row of the latency matrix: what it
// measured of each peer's data plane. Safe for concurrent use; never take
// core.mu while holding mu (core.mu may be held around it).
type peerMeasures struct {
	mu      sync.Mutex
	by      map[string]*poolv1.PeerLatency
	running map[string]bool
}

// get returns a copy of what was measured of node, nil if it never was.
func (pm *peerMeasures) get(node string) *poolv1.PeerLatency {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if l := pm.by[node]; l != nil {
		return clonePeerLatency(l)
	}
	return nil
}

// row returns copies of every peer's entry, by node name.
func (pm *peerMeasures) row() []*poolv1.PeerLatency {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	out := make([]*poolv1.PeerLatency, 0, len(pm.by))
	for _, l := range pm.by {
		out = append(out, clonePeerLatency(l))
	}
	slices.SortFunc(out, func(a, b *poolv1.PeerLatency) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

func clonePeerLatency(l *poolv1.PeerLatency) *poolv1.PeerLatency {
	return proto.Clone(l).(*poolv1.PeerLatency)
}

// set records l for its node.
func (pm *peerMeasures) set(l *poolv1.PeerLatency) {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if pm.by == nil {
		pm.by = map[string]*poolv1.PeerLatency{}
	}
	pm.by[l.Node] = l
}

// forget drops node's entry (it left the cluster).
func (pm *peerMeasures) forget(node string) {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	delete(pm.by, node)
}

// invalidate replaces node's figures by why, keeping the address they
// were taken at: a figure of the past is never shown as current.
func (pm *peerMeasures) invalidate(node, why string, at time.Time) {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if l := pm.by[node]; l != nil {
		pm.by[node] = &poolv1.PeerLatency{Node: node, DataAddr: l.DataAddr, MeasuredUnixMs: at.UnixMilli(), Unmeasured: why}
	}
}

// begin marks a probe of node as running; false when one already is.
func (pm *peerMeasures) begin(node string) bool {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	if pm.running[node] {
		return false
	}
	if pm.running == nil {
		pm.running = map[string]bool{}
	}
	pm.running[node] = true
	return true
}

func (pm *peerMeasures) end(node string) {
	pm.mu.Lock()
	defer pm.mu.Unlock()
	delete(pm.running, node)
}

// peerSource is the source of a latency measured of node's data plane.
func peerSource(node string) string { return "measured: peer " + node }

// measurePeer probes node's data plane and records the result: figures, or
// why there are none. A probe of node already running makes it return at
// once. When node announced another data-plane address while the probe
// ran, it probes again, at most peerProbeRetries times.
func (p *core) measurePeer(ctx context.Context, node string) {
	if !p.pm.begin(node) {
		return
	}
	defer p.pm.end(node)
	for range peerProbeRetries {
		m, ok := p.cl.Member(node)
		if !ok || m.State != cluster.StateAlive {
			p.pm.invalidate(node, "the node is not alive", time.Now())
			return
		}
		l := p.probePeer(ctx, m)
		if ctx.Err() != nil {
			return // closing: no verdict
		}
		if now, ok := p.cl.Member(node); ok && now.Meta.DataAddr != l.DataAddr {
			continue // measured an address the node no longer serves on
		}
		p.pm.set(l)
		if l.Unmeasured == "" {
			p.log.Info("measured peer", "node", node, "data-addr", l.DataAddr,
				"read-p50", time.Duration(l.ReadLatency.P50Ns), "read-p99", time.Duration(l.ReadLatency.P99Ns),
				"read-4k-p50", time.Duration(l.Read_4KLatency.P50Ns), "read-bandwidth-bps", l.ReadBandwidthBps)
		} else if _, lends := m.Meta.Tier(tierName(poolv1.Tier_TIER_RDMA)); lends {
			// (A node that lends no memory has no data plane to measure.)
			p.log.Warn("cannot measure a peer's data plane; it shows as unmeasured", "node", node, "data-addr", l.DataAddr, "why", l.Unmeasured)
		}
		return
	}
	p.pm.invalidate(node, fmt.Sprintf("its data-plane address changed during each of %d probes", peerProbeRetries), time.Now())
}

// probePeer measures m's data plane once. The result names the address
// probed; on failure it carries why instead of figures.
func (p *core) probePeer(ctx context.Context, m cluster.Member) *poolv1.PeerLatency {
	l := &poolv1.PeerLatency{Node: m.Name, DataAddr: m.Meta.DataAddr}
	ctx, cancel := context.WithTimeout(ctx, peerProbeTimeout)
	defer cancel()
	r, err := p.readPeer(ctx, m)
	l.MeasuredUnixMs = time.Now().UnixMilli()
	if err != nil {
		l.Unmeasured = err.Error()
		return l
	}
	src := peerSource(m.Name)
	l.ReadLatency, l.Read_4KLatency = latency(r.Read64), latency(r.Read4K)
	l.ReadLatency.Source, l.Read_4KLatency.Source = src, src
	l.ReadBandwidthBps = r.ReadBandwidth
	return l
}

// readPeer allocates the probe segment at m through the peer session,
// times reads of it over m's data plane and frees it.
func (p *core) readPeer(ctx context.Context, m cluster.Member) (probe.Remote, error) {
	if _, ok := m.Meta.Tier(tierName(poolv1.Tier_TIER_RDMA)); !ok || m.Meta.DataAddr == "" {
		return probe.Remote{}, fmt.Errorf("%w: %s offers no rdma memory (no data plane to measure)", errs.ErrNotSupported, m.Name)
	}
	if why := p.peers.refusal(m.Name, m.Meta.GRPCAddr); why != nil {
		return probe.Remote{}, fmt.Errorf("refused as a peer: %w", why)
	}
	pc, err := p.peers.get(ctx, m.Name, m.Meta.GRPCAddr)
	if err != nil {
		return probe.Remote{}, fmt.Errorf("no peer session: %w", err)
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return probe.Remote{}, fmt.Errorf("peer session: %w", err)
	}
	// Until it is freed, the sweep must not take the probe for an orphan.
	defer p.placing(m.Name)()
	seg, err := pc.API().Alloc(cctx, &poolv1.AllocRequest{Size: peerProbeSize, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true})
	if err != nil {
		p.mayHoldOrphans(m.Name, err) // the allocation may have been made, its answer lost
		return probe.Remote{}, fmt.Errorf("allocate a %s probe segment there: %w", size.Size(peerProbeSize).Human(), errs.FromStatus(err))
	}
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(cctx), 5*time.Second)
		defer cancel()
		if _, err := pc.API().Free(fctx, &poolv1.FreeRequest{Id: seg.Id}); err != nil && !errors.Is(errs.FromStatus(err), errs.ErrNotFound) {
			p.peers.freeLater(m.Name, seg.Id)
		}
	}()
	opts := []tcp.Option{tcp.WithCredential(pc.DataCredential())}
	if seg.DataTls {
		tc, err := certs.Verifier(seg.DataTlsCa, seg.DataServerName)
		if err != nil {
			return probe.Remote{}, fmt.Errorf("verify its data plane's TLS: %w", err)
		}
		if p.peers.tls != nil {
			tc.Certificates = p.peers.tls.Certificates
		}
		opts = append(opts, tcp.WithTLS(tc))
	}
	// The address the peer gossips, which clients' records follow, not
	// the one its reply names: a change of it is what triggers a probe.
	conn, err := tcp.Dial(ctx, m.Meta.DataAddr, opts...)
	if err != nil {
		return probe.Remote{}, fmt.Errorf("dial its data plane at %s: %w", m.Meta.DataAddr, err)
	}
	defer conn.Close()
	var key rdma.Key
	copy(key[:], seg.Key)
	r, err := probe.RemoteRead(ctx, conn, rdma.Region{Segment: seg.Id, Key: key, Epoch: seg.Epoch}, peerProbeSize, peerProbeSamples, false)
	if err != nil {
		if ctx.Err() != nil {
			return r, fmt.Errorf("no answer within %s: %w", peerProbeTimeout, err)
		}
		return r, err
	}
	return r, nil
}

// measurePeers probes every alive peer, one at a time.
func (p *core) measurePeers(ctx context.Context) {
	if p.cl == nil {
		return
	}
	for _, m := range p.cl.Members() {
		if ctx.Err() != nil {
			return
		}
		if m.Name != p.cfg.Node && m.State == cluster.StateAlive {
			p.measurePeer(ctx, m.Name)
		}
	}
}

// peerChanged follows a membership change for the peer measurements: a
// joining or returning node is probed, one announcing another data-plane
// address loses its figures (they were of the old one) and is probed
// again, a dead one loses them, and one that left is forgotten. Probes run
// in the background, tracked by d.wg.
func (d *Daemon) peerChanged(ev cluster.Event) {
	p, node := d.pool, ev.Member.Name
	measure := false
	switch ev.Kind {
	case cluster.EventJoin, cluster.EventAlive:
		measure = true
	case cluster.EventUpdate:
		if l := p.pm.get(node); l != nil && l.DataAddr != ev.Member.Meta.DataAddr {
			p.pm.invalidate(node, fmt.Sprintf("its data-plane address changed from %s to %s; measuring again", l.DataAddr, ev.Member.Meta.DataAddr), time.Now())
			measure = true
		}
	case cluster.EventDead:
		p.pm.invalidate(node, "the node is dead (failure detector); measured again when it is back", time.Now())
	case cluster.EventLeave:
		p.pm.forget(node)
	}
	if !measure || !d.cfg.MeasureTiers {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		ctx, cancel := untilClosed(context.Background(), d.stop)
		defer cancel()
		// Not while this host measures its own tiers: each would slow
		// the other's figures.
		if p.awaitFirstMeasure(ctx) != nil {
			return
		}
		p.measurePeer(ctx, node)
	}()
}

// remeasurePeers probes every alive peer every MeasurePeersEvery, each
// period drawn within ±20% so that daemons started together do not probe
// each other in step. It returns when the daemon stops.
func (d *Daemon) remeasurePeers() {
	ctx, cancel := untilClosed(context.Background(), d.stop)
	defer cancel()
	for {
		every := d.cfg.MeasurePeersEvery
		wait := every - every/5 + time.Duration(rand.Int64N(int64(every/5)*2+1))
		select {
		case <-d.stop:
			return
		case <-time.After(wait):
		}
		d.pool.measurePeers(ctx)
	}
}

// addPeerFigures gives the peers' rdma tier the read latency and bandwidth
// of the nearest peer with a current measurement (source "measured: peer
// NODE"), and says in its note what was measured of each peer: figures,
// or why there are none.
func (p *core) addPeerFigures(ti *poolv1.TierInfo) {
	var best *poolv1.PeerLatency
	each := make([]string, 0, len(ti.Devices))
	for _, node := range ti.Devices {
		l := p.pm.get(node)
		switch {
		case l == nil && !p.cfg.MeasureTiers:
			each = append(each, node+" not measured (poold --measure-tiers=false)")
		case l == nil:
			each = append(each, node+" not measured yet")
		case l.Unmeasured != "":
			each = append(each, fmt.Sprintf("%s unmeasured: %s", node, l.Unmeasured))
		default:
			each = append(each, fmt.Sprintf("%s %s p50, %s p99, %s", node, time.Duration(l.ReadLatency.P50Ns),
				time.Duration(l.ReadLatency.P99Ns), bandwidth(l.ReadBandwidthBps)))
			if best == nil || l.ReadLatency.P50Ns < best.ReadLatency.P50Ns {
				best = l
			}
		}
	}
	if best != nil {
		ti.ReadLatency, ti.ReadBandwidthBps = best.ReadLatency, best.ReadBandwidthBps
	}
	ti.Note = joinNote(ti.Note, "64-byte reads from this node over each peer's data plane: "+strings.Join(each, "; "))
}

// matrixTimeout bounds the call that fetches one peer's row.
const matrixTimeout = 3 * time.Second

// latencyMatrix is the cluster's latency matrix: this daemon's row, then
// the row of every other alive node in nodes, each asked over its peer
// session at once. A node that cannot be asked has a row with its error.
func (p *core) latencyMatrix(ctx context.Context, nodes []*poolv1.NodeInfo) []*poolv1.LatencyRow {
	rows := []*poolv1.LatencyRow{{From: p.cfg.Node, To: p.pm.row()}}
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n.Self || n.State != cluster.StateString(cluster.StateAlive) {
			continue
		}
		row := &poolv1.LatencyRow{From: n.Name}
		rows = append(rows, row)
		wg.Go(func() {
			to, err := p.askRow(ctx, n)
			row.To = to
			if err != nil {
				row.Error = err.Error()
			}
		})
	}
	wg.Wait()
	return rows
}

// askRow asks node n for its measurements of the others (its row).
func (p *core) askRow(ctx context.Context, n *poolv1.NodeInfo) ([]*poolv1.PeerLatency, error) {
	ctx, cancel := context.WithTimeout(ctx, matrixTimeout)
	defer cancel()
	pc, err := p.peers.get(ctx, n.Name, n.GrpcAddr)
	if err != nil {
		return nil, err
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return nil, err
	}
	resp, err := pc.API().Nodes(cctx, &poolv1.NodesRequest{})
	if err != nil {
		return nil, fmt.Errorf("ask %s for its row: %w", n.Name, errs.FromStatus(err))
	}
	var to []*poolv1.PeerLatency
	for _, o := range resp.Nodes {
		if o.Latency != nil {
			to = append(to, o.Latency)
		}
	}
	return to, nil
}
