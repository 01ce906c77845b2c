// This file holds the rebalancer: with Config.Rebalance on, a node whose
// rdma tier is used more than the cluster's mean by more than
// Config.RebalanceThreshold moves segments peers placed here to other
// nodes, one at a time, asking each segment's origin to move it (Move,
// docs/MOVE.md) as the evacuator does, until it is back within half the
// threshold of the mean; only segments no larger than what is over, so
// that no move overshoots the mean and sends the bytes back and forth. The origin places the segment as a new one (the
// node with the most room first), so the bytes go to the emptiest nodes.

package pool

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

const (
	// rebalanceScan is how often the rebalancer compares this node with
	// the cluster: gossip carries every node's free bytes within seconds.
	rebalanceScan = 2 * time.Second
	// rebalanceSettle is how long the rebalancer waits after a move before
	// it compares again, so that the move's bytes reach the gossiped view
	// the mean is taken from.
	rebalanceSettle = 2 * time.Second
)

// DefaultRebalanceThreshold is Config.RebalanceThreshold's default: a
// node is rebalanced when its rdma tier's used fraction is above the
// cluster's mean by more than ten percentage points.
const DefaultRebalanceThreshold = 0.10

// startRebalance runs the rebalancer until the daemon stops, when the
// configuration turns it on and the node is in a cluster.
func (d *Daemon) startRebalance() {
	p := d.pool
	if !p.cfg.Rebalance || p.cl == nil {
		return
	}
	p.log.Info("rebalancing: segments of peers move away while this node's rdma tier is used above the cluster's mean by more than the threshold",
		"threshold", p.cfg.RebalanceThreshold)
	d.wg.Go(func() {
		ctx, cancel := untilClosed(context.Background(), d.stop)
		defer cancel()
		p.rebalance(ctx, p.moveAway)
	})
}

// rebalance moves, while ctx lasts, a segment peers placed here away each
// time this node is over the cluster's mean (rebalanceExcess), through
// move (core.moveAway; replaced in tests). A draining node leaves it to
// the evacuator.
func (p *core) rebalance(ctx context.Context, move func(ctx context.Context, origin string, homeID uint64) (time.Duration, error)) {
	failed := map[uint64]time.Time{} // segments whose move failed, until when they are left alone
	wait := rebalanceScan
	active := false // over the threshold, and not yet within half of it
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = rebalanceScan
		if !p.drainState().since.IsZero() || p.dp != nil && p.dp.l.Status().Failing {
			// Draining: the evacuator moves everything. A data plane that
			// fails to accept gossips its rdma tier as full (gossipTiers),
			// which is no measure of its use.
			active = false
			continue
		}
		trigger := p.cfg.RebalanceThreshold
		if active {
			trigger /= 2
		}
		p.meetPeers(ctx)
		used, mean, excess := p.rebalanceExcess(trigger)
		if active = excess > 0; !active {
			continue
		}
		it, ok := pickRebalance(p.peerHeldItems(), excess, failed, p.now())
		if !ok {
			continue
		}
		if _, err := p.evac.moveWithin(ctx, it, move, evacMoves); err != nil {
			failed[it.id] = p.now().Add(evacRetryMax)
			p.log.Info("rebalancing: a move failed; the segment is left alone for a while", "segment", it.id, "origin", it.origin, "size", it.size, "err", err)
			continue
		}
		p.log.Info("rebalancing: moved a segment away", "segment", it.id, "origin", it.origin, "size", it.size,
			"used", used, "cluster-mean", mean, "excess-bytes", excess)
		wait = rebalanceSettle
	}
}

// peerHeldItems is peerHeld's segments alone.
func (p *core) peerHeldItems() []evacItem {
	items, _, _ := p.peerHeld()
	return items
}

// pickRebalance chooses the segment to move: the largest that fits in
// excess bytes, leaving out those whose move failed until their time in
// failed passes (and forgetting those whose time passed). None fits: none
// moves, since a larger one would leave this node under the mean by more
// than it is over now, and the node that took it could send it back.
func pickRebalance(items []evacItem, excess int64, failed map[uint64]time.Time, now time.Time) (evacItem, bool) {
	maps.DeleteFunc(failed, func(_ uint64, until time.Time) bool { return !now.Before(until) })
	items = slices.DeleteFunc(items, func(it evacItem) bool {
		_, waits := failed[it.id]
		return waits || it.size > excess
	})
	if len(items) == 0 {
		return evacItem{}, false
	}
	return slices.MaxFunc(items, func(a, b evacItem) int { return cmp.Compare(a.size, b.size) }), true
}

// rebalancePeerDial bounds meetPeers, and rebalanceDials the dials it
// makes at once.
const (
	rebalancePeerDial = 5 * time.Second
	rebalanceDials    = 8
)

// meetPeers opens a session with each usable member that lends the rdma
// tier and that no session proved yet at its address (nor refused
// lately), so that rebalanceExcess counts it: a session proves a member's
// name (its certificate's), gossip alone does not.
func (p *core) meetPeers(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, rebalancePeerDial)
	defer cancel()
	sem := make(chan struct{}, rebalanceDials)
	var wg sync.WaitGroup
	for _, m := range p.cl.Members() {
		if _, ok := m.Meta.Tier(tierName(poolv1.Tier_TIER_RDMA)); !ok || m.Name == p.cfg.Node || !m.Usable() ||
			m.Meta.GRPCAddr == "" || p.peers.isProven(m.Name, m.Meta.GRPCAddr) || p.peers.isRefused(m.Name, m.Meta.GRPCAddr) {
			continue
		}
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
				defer func() { <-sem }()
			case <-ctx.Done():
				return
			}
			if _, err := p.peers.get(ctx, m.Name, m.Meta.GRPCAddr); err != nil {
				p.log.Debug("rebalancing: a member is left out of the cluster's mean until a session proves it", "node", m.Name, "err", err)
			}
		})
	}
	wg.Wait()
}

// rebalanceExcess compares this node's rdma tier with the cluster's: it
// returns this node's used fraction, the mean of the alive nodes that lend
// the rdma tier and are not draining (this one included), and the bytes
// to move away to come within half the threshold of that mean, when this
// node is over it by more than trigger (else excess is 0). Only members
// a peer session proved at their address count (meetPeers; the session may
// have closed since, idle): a gossip member
// that no certificate proves (one holding the gossip key alone) could
// otherwise announce an idle tier, drag the mean down until every node
// is over it, and keep them all moving segments.
func (p *core) rebalanceExcess(trigger float64) (used, mean float64, excess int64) {
	name := tierName(poolv1.Tier_TIER_RDMA)
	var capacity, free int64
	for _, t := range p.gossipTiers() {
		if t.Name == name {
			capacity, free = t.Capacity, t.Free
		}
	}
	if capacity <= 0 {
		return 0, 0, 0
	}
	used = float64(capacity-free) / float64(capacity)
	sum, n := used, 1
	for _, m := range p.cl.Members() {
		t, ok := m.Meta.Tier(name)
		if m.Name == p.cfg.Node || !ok || t.Capacity <= 0 || !m.Usable() || !p.peers.isProven(m.Name, m.Meta.GRPCAddr) {
			continue
		}
		sum += float64(t.Capacity-t.Free) / float64(t.Capacity)
		n++
	}
	mean = sum / float64(n)
	if n < 2 || used-mean <= trigger {
		return used, mean, 0
	}
	return used, mean, max(1, int64((used-mean-p.cfg.RebalanceThreshold/2)*float64(capacity)))
}
