package pool

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/rdma/dialer"
)

// protoVersion is the farmem protocol version nodes gossip.
const protoVersion = 1

// startCluster joins the gossip cluster: this node's metadata carries its
// control and data addresses and what it lends.
func (d *Daemon) startCluster(grpcAddr string) error {
	host, port, err := net.SplitHostPort(d.cfg.Gossip)
	if err != nil {
		return fmt.Errorf("%w: gossip %q: %v (write ip:port)", ErrConfig, d.cfg.Gossip, err)
	}
	pn, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("%w: gossip port %q", ErrConfig, port)
	}
	cc := cluster.DefaultConfig()
	cc.Name, cc.BindAddr, cc.BindPort, cc.Logger = d.cfg.Node, host, pn, d.log
	cc.Profile, cc.Join, cc.PushPullInterval, cc.Label = d.cfg.GossipProfile, d.cfg.Join, d.cfg.GossipPushPull, d.cfg.GossipCluster
	if cc.Keys, err = d.cfg.gossipKeys(); err != nil {
		return err
	}
	if cc.Keys == nil {
		d.log.Warn("gossip without a key (--gossip-insecure, or --insecure without --gossip-key-file): anyone who reaches the gossip port can join the cluster and announce capacity; use it only on a trusted network", "gossip", d.cfg.Gossip)
	}
	if d.cfg.sim.cluster != nil {
		if err := d.cfg.sim.cluster(&cc); err != nil {
			return fmt.Errorf("gossip on %s: %w", d.cfg.Gossip, err)
		}
	}
	// A drain kept in the store is announced from the first gossip on, so
	// that peers never see free space here that placements would refuse.
	ds := d.pool.drainState()
	meta := cluster.Meta{Proto: protoVersion, GRPCAddr: grpcAddr, Draining: !ds.since.IsZero(), DrainingSince: unixMs(ds.since),
		Evacuating: !ds.evacSince.IsZero(), Tiers: d.pool.gossipTiers(), Zone: d.cfg.Zone}
	if dp := d.pool.data(); dp != nil {
		meta.DataAddr = dp.addr
	}
	cl, err := cluster.New(cc, meta)
	if err != nil {
		return fmt.Errorf("gossip on %s: %w", d.cfg.Gossip, err)
	}
	d.pool.useGossip(cl)
	// This node's own memory holds copies of redundant segments like a
	// peer's, through a session with itself: after a restart, reconcile
	// reopens it and the homes here are told again how to forward.
	go d.pool.homeChanged(d.cfg.Node, true)
	remembered, err := d.pool.st.knownMembers()
	if err != nil {
		d.log.Warn("cannot read the members remembered in the metadata store; contacting only the --join seeds", "err", err)
	}
	events, unsubscribe := cl.Subscribe()
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		defer unsubscribe()
		d.watchMembers(events)
	}()
	go func() {
		defer d.wg.Done()
		d.joinLoop(remembered)
	}()
	return nil
}

// joinLoop contacts the seeds until one answers (a node may start before
// its seeds) and, from the start, keeps this node's metadata current: the
// cluster may learn of a node whose own join attempts still fail (a seed
// merged its state, then the push/pull timed out on a busy seed), and such
// a node must announce its capacity changes like any other. Seeds that
// left are contacted again once the first join is done. When no seed
// answers, it contacts members the store remembers (members.go), and it
// keeps that list current.
func (d *Daemon) joinLoop(remembered []string) {
	self := d.pool.gossip().Self().Addr
	seeds := slices.DeleteFunc(slices.Clone(d.cfg.Join), func(s string) bool { return s == self })
	d.joined.Store(len(seeds) == 0)
	if len(seeds) > 0 || len(remembered) > 0 {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if d.joinSeeds(seeds, remembered) {
				d.joined.Store(true)
			}
		}()
	}
	lastMembers, lastAt := remembered, time.Time{}
	t := time.NewTicker(announceTick)
	defer t.Stop()
	var last []cluster.TierFree
	var sweeping, rejoining atomic.Bool
	sweepAt := rand.IntN(sweepTicks) // spread the daemons' sweeps over the period
	for tick := 1; ; tick++ {
		select {
		case <-d.stop:
			return
		case <-t.C:
		}
		// A seed whose host is off lets a dial run to the gossip's TCP
		// timeout (10 s lan, 30 s wan): it is contacted off this loop,
		// which announces capacity and sweeps meanwhile.
		if tick%20 == 0 && d.joined.Load() {
			d.goUnlessRunning(&rejoining, d.rejoinSeeds)
		}
		if tick%10 == 0 {
			lastMembers = d.rememberMembers(lastMembers, &lastAt)
		}
		if tick%sweepTicks == sweepAt {
			d.goUnlessRunning(&sweeping, func() {
				// Close waits for this goroutine before it closes the
				// peer sessions: stop asking at once.
				ctx, cancel := untilClosed(context.Background(), d.stop)
				defer cancel()
				d.pool.sweepPeers(ctx)
				d.pool.closeIdleConns(time.Now())
			})
		}
		tiers := d.pool.gossipTiers()
		if !capacityMoved(last, tiers) {
			continue
		}
		if err := d.pool.gossip().SetMeta(func(m *cluster.Meta) { m.Tiers = tiers }); err != nil {
			d.log.Debug("gossip metadata update", "err", err)
			continue
		}
		last = tiers
	}
}

// goUnlessRunning runs fn in a goroutine Close waits for, unless the one
// it started last with the same running flag is still at it.
func (d *Daemon) goUnlessRunning(running *atomic.Bool, fn func()) {
	if !running.CompareAndSwap(false, true) {
		return
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		defer running.Store(false)
		fn()
	}()
}

// joinSeeds contacts the seeds (without this node's own address) until
// one answers, and in each round in which none did, up to rejoinMax of the
// members the store remembers; false when the daemon stopped first, or,
// without seeds, after rememberedTries rounds: the remembered members may
// all be gone, and such a node is a cluster's first, which others join.
// The remembered members are only a fallback: a node moved to another
// cluster (new --join, old data directory) joins its new seeds and never
// the members of the old one, unless none of its seeds answers.
func (d *Daemon) joinSeeds(seeds, remembered []string) bool {
	stopped, cancel := untilClosed(context.Background(), d.stop)
	defer cancel()
	try := func(targets []string) (int, error) {
		ctx, cancel := context.WithTimeout(stopped, 5*time.Second)
		defer cancel()
		return d.pool.gossip().Join(ctx, targets)
	}
	backoff := 200 * time.Millisecond
	for round := 1; ; round++ {
		var err error
		if len(seeds) > 0 {
			var n int
			if n, err = try(seeds); err == nil {
				d.log.Info("joined the cluster", "contacted", n, "seeds", seeds)
				return true
			}
			if errors.Is(err, cluster.ErrNameConflict) {
				// Peers keep the member that held the name first and never
				// see this one: serving on would place nothing here and
				// leave every rdma allocation on loopback.
				d.fail(fmt.Errorf("refusing to join the cluster: %w", err))
				return false
			}
		}
		if len(remembered) > 0 {
			targets := pickRemembered(remembered)
			switch n, rerr := try(targets); {
			case rerr == nil:
				d.log.Info("joined the cluster through members remembered from before the restart", "contacted", n, "tried", targets, "seeds", seeds)
				return true
			case errors.Is(rerr, cluster.ErrNameConflict):
				// Not this node's cluster, or its own previous run at
				// another address: the seeds, not the store, decide.
				d.log.Error("a remembered member's cluster has a live member with this node's name; the remembered members are not contacted again", "err", rerr)
				remembered = nil
			default:
				err = errors.Join(err, rerr)
			}
		}
		if len(seeds) == 0 {
			if round >= rememberedTries || len(remembered) == 0 {
				d.log.Info("no remembered member answered; this node waits for others to join it", "err", err)
				return false
			}
			d.log.Info("no remembered member answered yet; retrying", "err", err)
		} else {
			d.log.Warn("cannot join the cluster yet; retrying", "seeds", seeds, "remembered", len(remembered), "err", err)
		}
		select {
		case <-stopped.Done():
			return false
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// sweepTicks is how many announceTicks apart joinLoop sweeps its peers for
// orphaned segments (core.sweepPeers), one List per peer session, and
// closes the connections no segment needs (core.closeIdleConns): 30 s.
const sweepTicks = 300

// announceTick is how often joinLoop compares this node's capacity with
// what it last gossiped: half the lan profile's gossip interval, so that
// a change waits at most that long before gossip carries it.
const announceTick = 100 * time.Millisecond

// announceStep is the fraction of a tier's capacity by which its free bytes
// must move before the node gossips them again (1/64, about 1.6%).
//
// Every metadata update is a memberlist alive message (about 150 bytes)
// that every node must receive, and a gossip round carries only a few
// thousand bytes per node, so the whole cluster can spread only a couple
// of updates per gossip round, however many nodes it has. Announcing every
// allocation saturated that at 50 simulated hosts and 75 allocations per
// second, and a change then took more than 10 rounds to reach every host.
// Placement compares free fractions, so a view that is up to 1/64 stale
// moves the balance by about that much (docs/scale.md).
const announceStep = 64

// capacityMoved reports whether tiers differ enough from the last gossiped
// ones to gossip them: a tier appeared, vanished or changed capacity, its
// free bytes moved by at least 1/announceStep of its capacity, or they
// reached or left zero (so that peers stop or resume placing at once).
func capacityMoved(last, tiers []cluster.TierFree) bool {
	if len(last) != len(tiers) {
		return true
	}
	for i, t := range tiers {
		l := last[i]
		if t.Name != l.Name || t.Capacity != l.Capacity || (t.Free == 0) != (l.Free == 0) {
			return true
		}
		if d := max(t.Free-l.Free, l.Free-t.Free); d != 0 && d >= t.Capacity/announceStep {
			return true
		}
	}
	return false
}

// rejoinSeeds contacts again every seed that is not an alive member:
// memberlist forgets a dead node after a while and never probes it again;
// the cluster contacts the members it saw die for an hour (cluster's
// reconnect.go), and a partition that outlasts that, or a seed this node
// never saw (another cluster's, a replaced host), heals through this.
func (d *Daemon) rejoinSeeds() {
	alive := map[string]bool{}
	for _, m := range d.pool.gossip().Members() {
		if m.State == cluster.StateAlive {
			alive[m.Addr] = true
		}
	}
	var missing []string
	for _, s := range d.cfg.Join {
		if !seedAlive(s, alive) {
			missing = append(missing, s)
		}
	}
	if len(missing) == 0 {
		return
	}
	stopped, stop := untilClosed(context.Background(), d.stop)
	defer stop()
	ctx, cancel := context.WithTimeout(stopped, 2*time.Second)
	defer cancel()
	n, err := d.pool.gossip().Join(ctx, missing)
	switch {
	case errors.Is(err, cluster.ErrNameConflict):
		// This node joined first; the other one is told to stop.
		d.log.Error("a node at a seed uses this node's name", "err", err)
	case err == nil && n > 0:
		d.log.Info("rejoined seeds", "seeds", missing, "contacted", n)
	}
}

// seedAlive reports whether seed (ip:port, or a name that resolves to
// several, such as a Kubernetes headless service) is the gossip address
// of an alive member.
func seedAlive(seed string, alive map[string]bool) bool {
	if alive[seed] {
		return true
	}
	host, port, err := net.SplitHostPort(seed)
	if err != nil || net.ParseIP(host) != nil {
		return false
	}
	ips, err := net.LookupHost(host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if alive[net.JoinHostPort(ip, port)] {
			return true
		}
	}
	return false
}

// watchMembers turns membership changes into segment state: a dead or
// partitioned home makes its segments lost, a returning one restores those
// that survived. The cluster drops the oldest queued event when this
// daemon falls behind (a gap in Event.Seq); a missed death or return would
// leave segments lost, or not, until the node's next change (the scale
// simulation dropped hundreds of events per host while 200 daemons joined
// on 2 cores), so a gap makes it judge every member again (resyncMembers).
func (d *Daemon) watchMembers(events <-chan cluster.Event) {
	judged := map[string]bool{} // each node as last judged: alive or not
	var seq uint64
	for {
		select {
		case <-d.stop:
			return
		case ev, ok := <-events:
			if !ok {
				return
			}
			if seq != 0 && ev.Seq > seq+1 {
				d.resyncMembers(judged, ev.Seq-seq-1)
			}
			seq = ev.Seq
			if ev.Member.Name != d.cfg.Node {
				d.memberChanged(ev, judged)
			}
		}
	}
}

// memberChanged applies one membership event of another node and notes
// in judged whether the node is now judged alive.
func (d *Daemon) memberChanged(ev cluster.Event, judged map[string]bool) {
	name := ev.Member.Name
	d.peerChanged(ev)
	switch ev.Kind {
	case cluster.EventJoin:
		d.log.Info("node joined", "node", name, "addr", ev.Member.Addr)
		judged[name] = true
		go d.pool.homeChanged(name, true)
	case cluster.EventAlive:
		d.log.Info("node is back", "node", name, "addr", ev.Member.Addr)
		judged[name] = true
		go d.pool.homeChanged(name, true)
	case cluster.EventDead:
		d.log.Warn("node failed", "node", name)
		judged[name] = false
		d.pool.homeChanged(name, false)
	case cluster.EventLeave:
		d.log.Info("node left", "node", name)
		judged[name] = false
		d.pool.homeChanged(name, false)
		// Its session only held a lease there for segments now
		// marked lost; a returning node gets a fresh one, checked
		// against its certificate again.
		d.pool.peerConns().drop(name)
	}
}

// resyncMembers judges again every node whose state in the member table
// differs from the one judged last (missed events were dropped): a node
// alive now and judged dead, or never judged, returns; one judged alive
// and now dead, left or forgotten (reaped from the table) dies.
func (d *Daemon) resyncMembers(judged map[string]bool, missed uint64) {
	d.log.Warn("membership events were dropped: this daemon fell behind; judging every member again", "dropped", missed)
	listed := map[string]bool{}
	for _, m := range d.pool.gossip().Members() {
		if m.Name == d.cfg.Node {
			continue
		}
		listed[m.Name] = true
		was, known := judged[m.Name]
		switch alive := m.State == cluster.StateAlive; {
		case alive && (!known || !was):
			d.memberChanged(cluster.Event{Kind: cluster.EventAlive, Member: m}, judged)
		case !alive && was && m.State == cluster.StateLeft:
			d.memberChanged(cluster.Event{Kind: cluster.EventLeave, Member: m}, judged)
		case !alive && was:
			d.memberChanged(cluster.Event{Kind: cluster.EventDead, Member: m}, judged)
		}
	}
	for name, was := range judged {
		if was && !listed[name] {
			d.memberChanged(cluster.Event{Kind: cluster.EventDead, Member: cluster.Member{Name: name}}, judged)
		}
	}
}

// gossipTiers is what this node lends, per tier, for its gossip metadata.
// While the data plane's listener fails to accept, the rdma tier shows no
// free bytes, so that peers stop placing segments that no client could
// reach (Pick skips a tier without room); it shows them again once the
// listener accepts.
func (p *core) gossipTiers() []cluster.TierFree {
	var out []cluster.TierFree
	unreachable := p.dp != nil && p.dp.l.Status().Failing
	for _, ti := range p.tiers() {
		if ti.Kind == "tcp" {
			continue // peers' memory, not ours
		}
		name := tierName(ti.Tier)
		if ti.Tier == poolv1.Tier_TIER_RDMA && unreachable {
			ti.Free = 0
		}
		if i := slices.IndexFunc(out, func(t cluster.TierFree) bool { return t.Name == name }); i >= 0 {
			out[i].Capacity += ti.Capacity
			out[i].Free += ti.Free
			continue
		}
		out = append(out, cluster.TierFree{Name: name, Capacity: ti.Capacity, Free: ti.Free})
	}
	return out
}

// allTiers is this daemon's tiers and, in a cluster, the rdma tier its
// peers offer.
func (p *core) allTiers() []*poolv1.TierInfo {
	out := p.tiers()
	pt := p.peerTier()
	for _, ti := range out {
		if ti.Tier == poolv1.Tier_TIER_RDMA && ti.Kind == "loopback" {
			ti.Note = joinNote(loopbackNote(pt), ti.Note)
		}
	}
	if pt != nil {
		out = append(out, pt)
	}
	return out
}

// loopbackNote says what the loopback rdma tier (this host's own lent
// memory) stands for, given the peers' rdma tier as membership has it now
// (nil: no alive peer offers rdma memory).
func loopbackNote(peers *poolv1.TierInfo) string {
	const what = "loopback: this host's own memory through its own data plane over TCP on 127.0.0.1"
	if peers == nil {
		return what + " — no peer offers rdma memory now, so it stands in for remote memory"
	}
	return fmt.Sprintf("%s, lent to peers; rdma allocations here go to a peer first (%d alive with rdma memory: %s) and land here only when none can take them",
		what, len(peers.Devices), strings.Join(peers.Devices, ", "))
}

// joinNote joins two notes with "; ", either of which may be empty.
func joinNote(a, b string) string {
	if a == "" || b == "" {
		return a + b
	}
	return a + "; " + b
}

// peerTier describes the rdma tier that the alive peers offer.
func (p *core) peerTier() *poolv1.TierInfo {
	if p.cl == nil {
		return nil
	}
	transport, why := dialer.Preferred()
	ti := &poolv1.TierInfo{Tier: poolv1.Tier_TIER_RDMA, Kind: "tcp", Transport: transport, NumaNode: -1,
		Note: "memory of peer hosts through their data planes; transport " + transport + ": " + why}
	var unusable []string
	for _, m := range p.cl.Members() {
		if m.Name == p.cfg.Node || m.State != cluster.StateAlive || m.MetaErr != nil {
			continue
		}
		if t, ok := m.Meta.Tier("rdma"); ok {
			ti.Capacity += t.Capacity
			if m.Usable() {
				ti.Free += t.Free
			} else {
				unusable = append(unusable, m.Name)
			}
			ti.Devices = append(ti.Devices, m.Name)
		}
	}
	if len(ti.Devices) == 0 {
		return nil
	}
	if len(unusable) > 0 {
		ti.Note += fmt.Sprintf("; draining or leaving, so their free bytes are left out of FREE: %s ('memctl drain --undo NODE' takes a drained node back)",
			strings.Join(unusable, ", "))
	}
	p.addPeerFigures(ti)
	p.addInjected(ti)
	p.mu.Lock()
	for _, r := range p.segs {
		if r.Home != "" {
			ti.Segments++
		}
	}
	p.mu.Unlock()
	return ti
}

func (s *service) Nodes(ctx context.Context, req *poolv1.NodesRequest) (*poolv1.NodesResponse, error) {
	p := s.d.pool
	cl := p.gossip()
	if cl == nil {
		ds := p.drainState()
		self := &poolv1.NodeInfo{Name: s.d.cfg.Node, State: "alive", Self: true, Draining: !ds.since.IsZero(), DrainingSinceUnixMs: unixMs(ds.since),
			Evacuating: !ds.evacSince.IsZero(), Zone: s.d.cfg.Zone}
		for _, t := range p.gossipTiers() {
			self.Tiers = append(self.Tiers, &poolv1.NodeTier{Tier: t.Name, Capacity: t.Capacity, Free: t.Free})
		}
		if dp := p.data(); dp != nil {
			self.DataAddr = dp.addr
		}
		return &poolv1.NodesResponse{Nodes: []*poolv1.NodeInfo{self}}, nil
	}
	var out []*poolv1.NodeInfo
	for _, m := range cl.Members() {
		n := &poolv1.NodeInfo{Name: m.Name, State: cluster.StateString(m.State), GossipAddr: m.Addr,
			GrpcAddr: m.Meta.GRPCAddr, DataAddr: m.Meta.DataAddr, Draining: m.Meta.Draining, DrainingSinceUnixMs: m.Meta.DrainingSince,
			Evacuating: m.Meta.Evacuating, Self: m.Name == s.d.cfg.Node, Zone: m.Meta.Zone}
		if why := p.peerConns().refusal(m.Name, m.Meta.GRPCAddr); why != nil {
			n.Refused = why.Error()
		}
		if !n.Self {
			n.Latency = p.pm.get(m.Name)
		}
		for _, t := range m.Meta.Tiers {
			n.Tiers = append(n.Tiers, &poolv1.NodeTier{Tier: t.Name, Capacity: t.Capacity, Free: t.Free})
		}
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b *poolv1.NodeInfo) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	resp := &poolv1.NodesResponse{Nodes: out, NameConflicts: p.nameConflicts()}
	if req.GetMatrix() {
		resp.Matrix = p.latencyMatrix(ctx, out)
	}
	return resp, nil
}

// nameConflicts lists the node names this daemon saw gossiped from two
// addresses at once.
func (p *core) nameConflicts() []*poolv1.NameConflict {
	if p.cl == nil {
		return nil
	}
	var out []*poolv1.NameConflict
	for _, c := range p.cl.Conflicts() {
		out = append(out, &poolv1.NameConflict{Name: c.Name, KnownAddr: c.Known, ClaimantAddr: c.Claimant, Self: c.Self,
			FirstUnixMs: c.First.UnixMilli(), LastUnixMs: c.Last.UnixMilli(), Count: c.Count})
	}
	return out
}
