// This file holds the origin side of redundant segments
// (docs/REDUNDANCY.md): an Alloc with replicas or erasure coding placed as
// one ordinary rdma segment per copy or shard on distinct hosts, the
// homes told how to forward (Replicate), a lost home marked in the record
// and a backup promoted, and the answers that describe the homes.

package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	redspec "github.com/farmem/farmem/internal/redundancy"
	"github.com/farmem/farmem/rdma"
)

// shardChunk is the bytes of one shard in one stripe of an erasure-coded
// segment (Segment.shard_chunk).
const shardChunk = 4096

// spec is r as internal/redundancy's Spec.
func (rd redundancy) spec() redspec.Spec {
	return redspec.Spec{Replicas: rd.Replicas, Data: rd.Data, Parity: rd.Parity, Fallback: rd.Fallback}
}

func redundancyOf(s redspec.Spec) redundancy {
	return redundancy{Replicas: s.Replicas, Data: s.Data, Parity: s.Parity, Fallback: s.Fallback}
}

// specOf is an AllocRequest's redundancy; nil when it names none.
func specOf(r *poolv1.Redundancy) *redspec.Spec {
	if r == nil {
		return nil
	}
	// Counts beyond int32 are as wrong as any above MaxHomes: Validate
	// says so with the limit.
	clamp := func(n uint32) int { return int(min(n, 1<<20)) }
	return &redspec.Spec{Replicas: clamp(r.Replicas), Data: clamp(r.DataShards), Parity: clamp(r.ParityShards), Fallback: r.AllowFallback}
}

// redundant reports whether r is a redundant segment's record at its origin.
func (r *record) redundant() bool { return len(r.Homes) > 0 }

// homedOn reports whether r has a copy or shard on node that is not lost:
// its single home, or one of its homes.
func (r *record) homedOn(node string) bool {
	if !r.redundant() {
		return r.Home == node
	}
	return slices.ContainsFunc(r.Homes, func(h homeRef) bool { return h.Node == node && h.State != poolv1.HomeState_HOME_STATE_LOST })
}

// idsOn is the ids at node of r's copies or shards that are not lost.
func (r *record) idsOn(node string) []uint64 {
	if !r.redundant() {
		if r.Home == node {
			return []uint64{r.HomeID}
		}
		return nil
	}
	var ids []uint64
	for _, h := range r.Homes {
		if h.Node == node && h.State != poolv1.HomeState_HOME_STATE_LOST {
			ids = append(ids, h.HomeID)
		}
	}
	return ids
}

// shardSize is the bytes of each home's segment.
func (r *record) shardSize() int64 {
	if r.Redundancy.Data > 0 {
		return r.Size / int64(r.Redundancy.Data)
	}
	return r.Size
}

// lostHomes counts r's homes that cannot be read: LOST, or UNREACHABLE
// (kept until their node returns).
func (r *record) lostHomes() int {
	return r.homesIn(poolv1.HomeState_HOME_STATE_LOST) + r.homesIn(poolv1.HomeState_HOME_STATE_UNREACHABLE)
}

// redundancyState is how much of r's protection holds.
func (r *record) redundancyState() poolv1.RedundancyState {
	switch {
	case !r.redundant():
		return poolv1.RedundancyState_REDUNDANCY_STATE_NONE
	case r.Lost:
		return poolv1.RedundancyState_REDUNDANCY_STATE_LOST
	case slices.ContainsFunc(r.Homes, func(h homeRef) bool { return h.State == poolv1.HomeState_HOME_STATE_REBUILDING }):
		return poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING
	case r.lostHomes() > 0:
		return poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED
	}
	return poolv1.RedundancyState_REDUNDANCY_STATE_OK
}

// degraded reports whether r is redundant, not lost, and has a home that
// is lost or being rebuilt.
func (r *record) degraded() bool {
	switch r.redundancyState() {
	case poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED, poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING:
		return true
	}
	return false
}

// settle derives a redundant record's single-home fields from Homes[0]
// and marks it lost when more homes are lost than its redundancy covers.
func (r *record) settle() {
	if !r.redundant() {
		return
	}
	h := r.Homes[0]
	tls := h.DataTLS
	r.Home, r.HomeID, r.DataAddr, r.Key, r.DataTLS, r.Epoch = h.Node, h.HomeID, h.DataAddr, h.Key, &tls, h.Epoch
	r.Lost = r.lostHomes() > r.Redundancy.spec().Survives() || r.homesIn(poolv1.HomeState_HOME_STATE_OK) < max(1, r.Redundancy.Data)
}

// redundancyFor is the redundancy req gets: the one it names, else the
// daemon's default for an rdma allocation; none for a peer's placement of
// one home. A spec that cannot be placed on req's tiers is ErrInvalid.
func (p *core) redundancyFor(req allocRequest) (redspec.Spec, error) {
	s := req.Redundancy
	if req.HomeOnly {
		if s != nil && !s.None() {
			return redspec.Spec{}, fmt.Errorf("%w: a peer's placement of one home (home_only) is not redundant itself; ask the daemon that holds the segment", errs.ErrInvalid)
		}
		return redspec.Spec{}, nil
	}
	if s == nil {
		if req.Tier != poolv1.Tier_TIER_RDMA {
			return redspec.Spec{}, nil
		}
		def, err := redspec.Parse(p.cfg.DefaultRedundancy)
		if err != nil {
			return redspec.Spec{}, err
		}
		s = &def
	}
	if err := s.Validate(); err != nil {
		return redspec.Spec{}, err
	}
	if s.None() {
		return *s, nil
	}
	for _, t := range append([]poolv1.Tier{req.Tier}, req.Fallback...) {
		if t != poolv1.Tier_TIER_RDMA && t != poolv1.Tier_TIER_UNSPECIFIED {
			return redspec.Spec{}, fmt.Errorf("%w: redundancy %s is for the rdma tier only, and the request names the %s tier: a load/store segment (cxl, local) is one host's memory mapped into its applications, and a copy elsewhere would not see their stores; ask for the rdma tier, or no redundancy", errs.ErrInvalid, s, tierName(t))
		}
	}
	if req.MaxReadLatencyNs > 0 || req.MinReadBandwidthBps > 0 {
		return redspec.Spec{}, fmt.Errorf("%w: redundancy %s with a read budget: redundant segments are placed by zones and capacity, not by a budget; ask for one or the other", errs.ErrInvalid, s)
	}
	return *s, nil
}

// redundantLayout is the shard segment size and the (padded) segment size
// of size bytes with s.
func redundantLayout(size int64, s redspec.Spec) (shard, total int64) {
	if !s.Coded() {
		return size, size
	}
	stripe := int64(s.Data) * shardChunk
	stripes := (size + stripe - 1) / stripe
	return stripes * shardChunk, stripes * stripe
}

// homeHosts is the alive, usable members that are not refused for their
// name and have shard bytes free on the rdma tier, this node among them
// when it lends rdma memory (its own memory counts as one host).
func (p *core) homeHosts(shard int64) []cluster.Member {
	if p.cl == nil {
		return nil
	}
	return slices.DeleteFunc(p.cl.Members(), func(m cluster.Member) bool {
		t, ok := m.Meta.Tier(tierName(poolv1.Tier_TIER_RDMA))
		return !ok || t.Free < shard || !m.Usable() || m.Meta.GRPCAddr == "" || p.peers.isRefused(m.Name, m.Meta.GRPCAddr)
	})
}

// pickHomes chooses n of hosts, none named in taken, each in a zone that
// neither taken's zones nor an earlier choice holds while some host is
// in such a zone (a node without a zone is a zone of its own), and
// otherwise any; among those, by capacity and nearness as a single
// placement is (cluster.PickNear).
func pickHomes(hosts []cluster.Member, n int, shard int64, taken []cluster.Member, near cluster.Near) ([]cluster.Member, error) {
	zone := func(m cluster.Member) string {
		if m.Meta.Zone == "" {
			return "node:" + m.Name
		}
		return m.Meta.Zone
	}
	used := map[string]bool{}
	names := map[string]bool{}
	for _, m := range taken {
		used[zone(m)], names[m.Name] = true, true
	}
	var out []cluster.Member
	for range n {
		free := slices.DeleteFunc(slices.Clone(hosts), func(m cluster.Member) bool { return names[m.Name] })
		fresh := slices.DeleteFunc(slices.Clone(free), func(m cluster.Member) bool { return used[zone(m)] })
		if len(fresh) > 0 {
			free = fresh
		}
		m, err := cluster.PickNear(free, tierName(poolv1.Tier_TIER_RDMA), shard, "", nil, near)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		used[zone(m)], names[m.Name] = true, true
	}
	return out, nil
}

// nodeNames is the members' names, joined for a message.
func nodeNames(ms []cluster.Member) string {
	names := make([]string, len(ms))
	for i, m := range ms {
		names[i] = m.Name
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// allocRedundant places a segment with redundancy s (not none): a copy or
// shard on each of s.Homes() distinct hosts, the homes told how to
// forward, then the record committed. With too few hosts it fails with
// ErrNoCapacity, or with s.Fallback takes fewer copies or parity shards;
// a nil record and error then means one copy: a plain placement. Any
// failure frees the homes made.
func (p *core) allocRedundant(ctx context.Context, c caller, req allocRequest, s redspec.Spec) (*record, error) {
	shard, total := redundantLayout(req.Size, s)
	if total > MaxSegmentSize {
		return nil, fmt.Errorf("%w: size %d with %s is %d bytes padded to whole stripes; ask for at most %d bytes", errs.ErrInvalid, req.Size, s, total, int64(MaxSegmentSize))
	}
	p.mu.Lock()
	why, err := p.admit(c, poolv1.Tier_TIER_RDMA, total)
	_, taken := p.names[req.Name]
	pl := plan{peers: p.peerFigures()}
	p.mu.Unlock()
	switch {
	case err != nil:
		return nil, err
	case why != "":
		return nil, fmt.Errorf("alloc %d bytes with %s: %w: %s", req.Size, s, errs.ErrNoCapacity, why)
	case req.Name != "" && taken:
		return nil, fmt.Errorf("alloc %q: %w", req.Name, errs.ErrExists)
	}
	if p.cl == nil {
		if s.Fallback {
			return nil, nil
		}
		return nil, fmt.Errorf("alloc %d bytes with %s: %w: it needs %d distinct hosts, and this daemon is in no cluster (no --gossip), so it has only its own memory; join a cluster, or ask for %s,or-fewer",
			req.Size, s, errs.ErrNoCapacity, s.Homes(), s)
	}
	hosts := p.homeHosts(shard)
	if need := s.Homes(); len(hosts) < need {
		if !s.Fallback || s.Coded() && len(hosts) <= s.Data {
			least := need
			if s.Fallback {
				least = s.Data + 1
			}
			return nil, fmt.Errorf("alloc %d bytes with %s: %w: it needs %d distinct hosts with %d bytes free on the rdma tier, and %d have them (%s); add hosts, free memory, or ask for fewer homes (or-fewer places %d at least)",
				req.Size, s, errs.ErrNoCapacity, least, shard, len(hosts), nodeNames(hosts), max(s.Data+1, 2))
		}
		if s.Coded() {
			s.Parity = len(hosts) - s.Data
		} else {
			s.Replicas = len(hosts)
		}
		if s.Homes() < 2 {
			return nil, nil
		}
	}
	chosen, err := pickHomes(hosts, s.Homes(), shard, nil, pl.near)
	if err != nil {
		return nil, fmt.Errorf("alloc %d bytes with %s: %w", req.Size, s, err)
	}
	for _, m := range chosen {
		defer p.placing(m.Name)()
	}
	homes, err := p.makeHomes(ctx, chosen, shard, c.id())
	r := &record{
		Name: req.Name, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: total, Owner: c.id(), Persist: req.Persist,
		Created: p.now().UTC(), Redundancy: redundancyOf(s), Homes: homes,
	}
	if s.Coded() {
		r.ShardChunk = shardChunk
	}
	if err == nil {
		r.settle()
		r.grant(c, req)
		err = p.replicate(ctx, r)
	}
	if err == nil {
		err = p.commitRedundant(r)
	}
	if err != nil {
		p.freeHomes(homes)
		return nil, fmt.Errorf("alloc %d bytes with %s: %w", req.Size, s, err)
	}
	p.log.Debug("alloc redundant", "segment", r.ID, "redundancy", s.String(), "homes", nodeNames(chosen), "size", r.Size)
	cp := *r
	return &cp, nil
}

// makeHomes allocates a segment of size bytes for client on each of
// nodes, in parallel; on a failure it frees those made and returns the
// first error.
func (p *core) makeHomes(ctx context.Context, nodes []cluster.Member, size int64, client string) ([]homeRef, error) {
	homes := make([]homeRef, len(nodes))
	errsOf := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, m := range nodes {
		wg.Go(func() { homes[i], errsOf[i] = p.makeHome(ctx, m, size, client, false) })
	}
	wg.Wait()
	if err := errors.Join(errsOf...); err != nil {
		p.freeHomes(slices.DeleteFunc(homes, func(h homeRef) bool { return h.Node == "" }))
		return nil, err
	}
	return homes, nil
}

// makeHome allocates one copy or shard of size bytes at m for client;
// copied: one filled by copying another home's memory (a rebuild's, a
// moved home's target), which serves retried exactly-once ops from what
// it records once a replicate joined it (ReplicateRequest.joined).
func (p *core) makeHome(ctx context.Context, m cluster.Member, size int64, client string, copied bool) (homeRef, error) {
	pc, err := p.peers.get(ctx, m.Name, m.Meta.GRPCAddr)
	if err != nil {
		return homeRef{}, err
	}
	seg, err := callAt(ctx, pc, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.Segment, error) {
		return api.Alloc(ctx, &poolv1.AllocRequest{Size: size, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: client, FilledByCopy: copied})
	})
	if err != nil {
		p.mayHoldOrphans(m.Name, err) // the allocation may have been made, its answer lost
		return homeRef{}, fmt.Errorf("alloc on %s: %w", m.Name, err)
	}
	var key rdma.Key
	copy(key[:], seg.Key)
	return homeRef{Node: m.Name, HomeID: seg.Id, DataAddr: seg.DataAddr, Key: key, Epoch: seg.Epoch, DataTLS: seg.DataTls}, nil
}

// freeHomes frees the copies or shards at their nodes, in the background.
func (p *core) freeHomes(homes []homeRef) {
	for _, h := range homes {
		p.freeLaterAt(h.Node, h.HomeID)
	}
}

// commitRedundant gives r an id and commits it.
func (p *core) commitRedundant(r *record) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.Name != "" {
		if _, ok := p.names[r.Name]; ok {
			return fmt.Errorf("alloc %q: %w", r.Name, errs.ErrExists)
		}
	}
	id, err := p.newID()
	if err != nil {
		return err
	}
	r.ID = id
	if err := p.st.put(r); err != nil {
		return fmt.Errorf("commit to the metadata store: %w", err)
	}
	p.link(r)
	p.usage.add(r)
	if r.Name != "" {
		p.names[r.Name] = id
	}
	return nil
}

// placeHome allocates one new copy or shard of r (its shard size) on a
// host that is not in exclude and holds no home of r that is not lost,
// in a zone none of those holds while there is one; it returns the home
// in state REBUILDING. The record is not changed: the caller names the
// home durably (the record, or a move's intent) or gives it up (frees it),
// then calls placed, which ends the allocation's count as under way at
// its node (p.placing): until then a reconcile of the node does not take
// the home for an orphan and free it. On an error nothing is under way.
func (p *core) placeHome(ctx context.Context, r *record, exclude []string) (h homeRef, placed func(), err error) {
	shard := r.shardSize()
	var taken []cluster.Member
	hosts := slices.DeleteFunc(p.homeHosts(shard), func(m cluster.Member) bool {
		if r.homedOn(m.Name) {
			taken = append(taken, m)
			return true
		}
		return slices.Contains(exclude, m.Name)
	})
	p.mu.Lock()
	pl := plan{peers: p.peerFigures()}
	p.mu.Unlock()
	chosen, err := pickHomes(hosts, 1, shard, taken, pl.near)
	if err != nil {
		return homeRef{}, nil, fmt.Errorf("segment %d: a new home for %d bytes: %w", r.ID, shard, err)
	}
	placed = p.placing(chosen[0].Name)
	h, err = p.makeHome(ctx, chosen[0], shard, r.Owner, true)
	if err != nil {
		placed()
		return homeRef{}, nil, err
	}
	h.State = poolv1.HomeState_HOME_STATE_REBUILDING
	if hook := p.cfg.sim.placed; hook != nil {
		hook(r.ID, h)
	}
	return h, placed, nil
}

// updateRecord changes the record of segment id with fn, on a copy, and
// commits it: the single-home fields follow Homes[0] and the segment is
// lost when more homes are lost than its redundancy covers. It returns
// the record committed.
func (p *core) updateRecord(id uint64, fn func(r *record) error) (record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.segs[id]
	if !ok {
		return record{}, fmt.Errorf("segment %d: %w: freed meanwhile", id, errs.ErrNotFound)
	}
	next := *r
	next.Homes = slices.Clone(r.Homes)
	if err := fn(&next); err != nil {
		return record{}, err
	}
	next.settle()
	if err := p.st.put(&next); err != nil {
		return record{}, fmt.Errorf("segment %d: commit to the metadata store: %w", id, err)
	}
	wasLost := r.Lost
	*r = next
	if next.Lost && !wasLost {
		p.notifyLocked(lostEvents(&next))
	}
	return next, nil
}

// lostEvents tells r's owner and attachers that it is lost.
func lostEvents(r *record) map[string]*poolv1.SegmentEvents {
	out := map[string]*poolv1.SegmentEvents{}
	for _, c := range append([]string{r.Owner}, r.Attached...) {
		out[c] = &poolv1.SegmentEvents{Lost: []uint64{r.ID}}
	}
	return out
}

// replicateTimeout bounds one Replicate call at a home.
const replicateTimeout = 10 * time.Second

// replicate tells every home of r that is not lost how it is written:
// the backups and parity shards who writes them (and that clients only
// read them), then the primary or the data shards where to forward, each
// with the record's epoch (or the home's own, higher: homeEpoch). Homes
// of one kind are told in parallel. For a committed segment it sends the
// record as the table holds it when its turn comes (one replicate per
// segment at a time, so that an older view never lands after a newer
// one), and sets *r to it; a record not yet committed (an Alloc under
// way) is sent as given.
func (p *core) replicate(ctx context.Context, r *record) error {
	return p.replicateJoining(ctx, r, nil)
}

// replicateJoining is replicate at the switch of a home filled by copy
// (a rebuild's switchOK, a home move's finishHomeMove): join, if r names
// it OK, is told it joined (ReplicateRequest.joined), so that it serves
// retried exactly-once ops from what it records from then on. The homes
// it was copied from are sealed from before this call until it returns,
// so it holds every change they applied and takes every later one.
func (p *core) replicateJoining(ctx context.Context, r *record, join *homeRef) error {
	if r.ID != 0 {
		mu, _ := p.replicateLocks.LoadOrStore(r.ID, new(sync.Mutex))
		mu.(*sync.Mutex).Lock()
		defer mu.(*sync.Mutex).Unlock()
		p.mu.Lock()
		cur, ok := p.segs[r.ID]
		if ok {
			*r = *cur
			r.Homes = slices.Clone(cur.Homes)
		}
		p.mu.Unlock()
		if !ok {
			return fmt.Errorf("segment %d: %w: freed meanwhile", r.ID, errs.ErrNotFound)
		}
	}
	coded := r.Redundancy.Data > 0
	live := func(h homeRef) bool { return h.State != poolv1.HomeState_HOME_STATE_LOST }
	var writers, forwarders []int // indexes into r.Homes
	for i, h := range r.Homes {
		switch {
		case !live(h):
		case coded && i < r.Redundancy.Data && h.State == poolv1.HomeState_HOME_STATE_REBUILDING:
			// A data shard being filled takes the rebuild's writes only:
			// were it to forward them, each would send the parity shards a
			// delta from bytes the stripe never held.
			writers = append(writers, i)
		case coded && i < r.Redundancy.Data, !coded && i == 0:
			forwarders = append(forwarders, i)
		default:
			writers = append(writers, i)
		}
	}
	var targets []*poolv1.SegmentHome
	var writerNodes []string
	for _, i := range forwarders {
		writerNodes = append(writerNodes, r.Homes[i].Node)
	}
	for i, h := range r.Homes {
		if coded && i >= r.Redundancy.Data || !coded && i > 0 && live(h) {
			hp := homeProto(h)
			hp.Epoch = r.homeEpoch(i) // the target is raised to it before the forwarders are told
			targets = append(targets, hp)
		}
	}
	joined := func(i int) bool {
		h := r.Homes[i]
		return join != nil && h.Node == join.Node && h.HomeID == join.HomeID && h.State == poolv1.HomeState_HOME_STATE_OK
	}
	restarted := make([]bool, len(r.Homes))
	tell := func(idx []int, req func(i int) *poolv1.ReplicateRequest) error {
		errsOf := make([]error, len(idx))
		var wg sync.WaitGroup
		for n, i := range idx {
			wg.Go(func() { restarted[i], errsOf[n] = p.replicateAt(ctx, r, i, req(i)) })
		}
		wg.Wait()
		return errors.Join(errsOf...)
	}
	err := tell(writers, func(i int) *poolv1.ReplicateRequest {
		req := &poolv1.ReplicateRequest{HomeId: r.Homes[i].HomeID, Epoch: r.homeEpoch(i), Writers: writerNodes, ClientsReadOnly: true, Joined: joined(i)}
		if coded && i < r.Redundancy.Data {
			req.Writers = nil // a data shard being filled: only this daemon writes it
		}
		return req
	})
	if err != nil {
		return err
	}
	err = tell(forwarders, func(i int) *poolv1.ReplicateRequest {
		req := &poolv1.ReplicateRequest{HomeId: r.Homes[i].HomeID, Epoch: r.Epoch, Targets: targets, StaleIfRestarted: r.staleIfRestarted(i), Joined: joined(i)}
		if coded {
			req.Mode, req.Shard = poolv1.ForwardMode_FORWARD_MODE_PARITY, uint32(i)
			req.DataShards, req.ParityShards = uint32(r.Redundancy.Data), uint32(r.Redundancy.Parity)
		}
		return req
	})
	if err != nil {
		return err
	}
	if i := slices.Index(restarted, true); i >= 0 {
		// A primary's loss promotes the backup, which holds a prefix of
		// the primary's writes (forwarded in order), and the copy is
		// rebuilt from it. A data shard keeps its bytes, but a write's
		// parity deltas may have reached some parity shards and not
		// others: those are rebuilt from the data shards. Either way the
		// survivors are told again (replicateLater), whose replicate
		// raises the epochs and lets the home take writes.
		const why = "a writer home's daemon restarted: a write it applied just before may not have reached the other homes"
		if !coded {
			p.homeLost(r.ID, r.Homes[i].Node, r.Homes[i].HomeID, why+", so it is rebuilt from them", false)
			return nil
		}
		for _, h := range r.Homes[r.Redundancy.Data:] {
			if h.State == poolv1.HomeState_HOME_STATE_OK {
				p.homeLost(r.ID, h.Node, h.HomeID, why+" (data shard "+r.Homes[i].Node+"), so the parity is rebuilt from the data shards", false)
			}
		}
		return nil
	}
	return p.raiseEpochs(r)
}

// staleIfRestarted says whether writer home i of r is to be rebuilt
// rather than written again if its daemon restarted (replicate): a
// replicated segment's primary when another copy is OK; for an erasure-
// coded data shard, the parity shards while one is OK and every data
// shard is (the data shard then keeps its bytes, and the parity is
// rebuilt from the data shards), so that a second Replicate, once they
// are lost, lets the shard go on.
func (r *record) staleIfRestarted(i int) bool {
	if r.Homes[i].State != poolv1.HomeState_HOME_STATE_OK {
		return false
	}
	if k := r.Redundancy.Data; k > 0 {
		ok := func(h homeRef) bool { return h.State == poolv1.HomeState_HOME_STATE_OK }
		// The parity is rebuilt from all k data shards; without one of
		// them it cannot be, and stays as it is.
		return !slices.ContainsFunc(r.Homes[:k], func(h homeRef) bool { return !ok(h) }) && slices.ContainsFunc(r.Homes[k:], ok)
	}
	without := *r
	without.Homes = slices.Clone(r.Homes)
	without.Homes[i].State = poolv1.HomeState_HOME_STATE_LOST
	return !without.wouldBeLost()
}

// homeEpoch is the epoch home i of r takes: the record's, or the home's
// own when that is higher (a rebuild fenced a parity shard it brought in
// line with the data shards: rebuildFill.fenceHomes).
func (r *record) homeEpoch(i int) uint64 {
	return max(r.Epoch, r.Homes[i].Epoch)
}

// raiseEpochs records that every home of r that is not lost holds r's
// epoch now (replicate raised it there, a new home's included): in r,
// and in the table's record when r is committed.
func (p *core) raiseEpochs(r *record) error {
	raise := func(rec *record) {
		for i := range rec.Homes {
			if rec.Homes[i].State != poolv1.HomeState_HOME_STATE_LOST && rec.Homes[i].Epoch < r.Epoch {
				rec.Homes[i].Epoch = r.Epoch
			}
		}
	}
	stale := slices.ContainsFunc(r.Homes, func(h homeRef) bool {
		return h.State != poolv1.HomeState_HOME_STATE_LOST && h.Epoch < r.Epoch
	})
	raise(r)
	if !stale || r.ID == 0 {
		return nil
	}
	_, err := p.updateRecord(r.ID, func(rec *record) error { raise(rec); return nil })
	return err
}

// replicateAt sends one Replicate to home i of r.
func (p *core) replicateAt(ctx context.Context, r *record, i int, req *poolv1.ReplicateRequest) (restarted bool, err error) {
	h := r.Homes[i]
	ctx, cancel := context.WithTimeout(ctx, replicateTimeout)
	defer cancel()
	pc, err := p.homeSession(ctx, h.Node, "home")
	var resp *poolv1.ReplicateResponse
	if err == nil {
		resp, err = callAt(ctx, pc, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.ReplicateResponse, error) {
			return api.Replicate(ctx, req)
		})
	}
	if err != nil {
		if r.ID == 0 { // an Alloc's homes: no record to mark lost yet
			if p.homeGone(ctx, h, err) {
				err = fmt.Errorf("%w (its node holds it no more)", err)
			}
			return false, fmt.Errorf("replicate the segment being allocated at %s (home %d): %w", h.Node, i, err)
		}
		if p.homeMissing(ctx, r.ID, h, err) {
			err = fmt.Errorf("%w (marked lost: its node holds it no more)", err)
		}
		return false, fmt.Errorf("replicate segment %d at %s (home %d): %w", r.ID, h.Node, i, err)
	}
	return resp.GetRestarted(), nil
}

// homeProto describes a home for the API, without credentials or TLS
// verification details (segmentProto adds those for clients).
func homeProto(h homeRef) *poolv1.SegmentHome {
	key := h.Key
	return &poolv1.SegmentHome{Node: h.Node, HomeId: h.HomeID, DataAddr: h.DataAddr, Key: key[:], Epoch: h.Epoch,
		DataTls: h.DataTLS, Transport: "tcp", State: h.State, RebuiltBytes: h.Rebuilt}
}

// redundancyProto is r's redundancy for the API; nil for none.
func redundancyProto(rd redundancy) *poolv1.Redundancy {
	if rd == (redundancy{}) {
		return nil
	}
	return &poolv1.Redundancy{Replicas: uint32(rd.Replicas), DataShards: uint32(rd.Data), ParityShards: uint32(rd.Parity), AllowFallback: rd.Fallback}
}

// homeLost marks the copy or shard of segment id at node (its id there
// homeID) lost, durably; a lost primary's place goes to the first backup
// that is not lost, under the next epoch. The survivors are then told
// (replicateLater) and the lost copy is freed at its node if it answers
// (it is never served again: a node that returns with it frees it at the
// next reconcile, which no longer counts it as held). why is logged.
//
// A copy that was OK and whose loss leaves the segment lost (or one of a
// segment lost already) held every acknowledged write when it went: it is
// marked UNREACHABLE instead, kept at its node, and made OK again when
// the node returns holding it (homeReturned). Freeing it would lose
// those writes for good where a single-home segment would be restored:
// a partition that cuts the origin off from every home of a segment, or
// the hosts of its last copies rebooting their daemons, ends with the
// copies alive. A home that missed a write (missed: another home could
// not forward to it) is never kept, and one kept is lost when such a
// report comes.
//
// It reports whether the record no longer names the home as it was:
// marked now, or lost already, or the segment freed; false when the
// record could not be committed.
func (p *core) homeLost(id uint64, node string, homeID uint64, why string, missed bool) bool {
	var promoted string
	kept := false
	next, err := p.updateRecord(id, func(r *record) error {
		i := slices.IndexFunc(r.Homes, func(h homeRef) bool {
			return h.Node == node && h.HomeID == homeID && h.State != poolv1.HomeState_HOME_STATE_LOST &&
				(missed || h.State != poolv1.HomeState_HOME_STATE_UNREACHABLE)
		})
		if i < 0 {
			return errHomeGone
		}
		was := r.Homes[i].State
		r.Homes[i].State = poolv1.HomeState_HOME_STATE_LOST
		if !missed && was == poolv1.HomeState_HOME_STATE_OK && r.wouldBeLost() {
			r.Homes[i].State, kept = poolv1.HomeState_HOME_STATE_UNREACHABLE, true
			return nil
		}
		if i == 0 {
			promoted = r.promote()
		}
		return nil
	})
	switch {
	case errors.Is(err, errHomeGone) || errors.Is(err, errs.ErrNotFound):
		return true // marked already, or the segment is gone
	case err != nil:
		p.log.Error("a home of a redundant segment is lost, and the record does not say so yet", "segment", id, "node", node, "why", why, "err", err)
		return false
	}
	if !kept {
		p.peers.freeLater(node, homeID)
	}
	if next.Lost {
		p.log.Warn("redundant segment lost: more homes lost than its redundancy covers", "segment", id, "node", node, "redundancy", next.Redundancy.spec().String(), "lost", next.lostHomes(), "kept", kept, "why", why)
		return true
	}
	p.log.Warn("redundant segment degraded: a home is lost", "segment", id, "node", node, "promoted", promoted, "epoch", next.Epoch, "why", why)
	p.replicateLater(id)
	p.rebuildSoon(id)
	return true
}

// homeMissing marks home h of segment id lost when its node no longer
// holds it (homeGone), and reports whether the record no longer names h
// as it was (homeLost): the caller looks at the record again rather than
// retry a step the home can never take. A mark that could not be
// committed is not reported: the record is as it was, and looked at again
// at once it would send the same step, and this List, in a loop. A home
// ends so when its node reclaimed it (this daemon's lease there ran out
// while a partition cut them off) after the record last judged it.
func (p *core) homeMissing(ctx context.Context, id uint64, h homeRef, err error) bool {
	return p.homeGone(ctx, h, err) && p.homeLost(id, h.Node, h.HomeID, "its node no longer holds it", true)
}

// homeGone reports whether err, a step's answer from h's node, says the
// node has no such segment (or lost it) and the node's list of what it
// holds for this daemon agrees.
func (p *core) homeGone(ctx context.Context, h homeRef, err error) bool {
	if !errors.Is(err, errs.ErrNotFound) && !errors.Is(err, errs.ErrSegmentLost) {
		return false
	}
	held, ok := p.reconcile(ctx, h.Node)
	return ok && !held[h.HomeID]
}

// wouldBeLost reports whether r, settled as it is now, is lost.
func (r *record) wouldBeLost() bool {
	t := *r
	t.settle()
	return t.Lost
}

// promote makes the first OK copy of a replicated record whose primary is
// not OK its primary under the next epoch, which every home not lost
// takes, and returns its node ("" when there is none, or r is coded: a
// data shard's home keeps its place).
func (r *record) promote() string {
	if r.Redundancy.Data > 0 || r.Homes[0].State == poolv1.HomeState_HOME_STATE_OK {
		return ""
	}
	j := slices.IndexFunc(r.Homes, func(h homeRef) bool { return h.State == poolv1.HomeState_HOME_STATE_OK })
	if j < 0 {
		return ""
	}
	r.Homes[0], r.Homes[j] = r.Homes[j], r.Homes[0]
	r.Epoch++
	for k := range r.Homes {
		if r.Homes[k].State != poolv1.HomeState_HOME_STATE_LOST {
			r.Homes[k].Epoch = r.Epoch
		}
	}
	return r.Homes[0].Node
}

// homeReturned applies the return of node to the UNREACHABLE homes
// there (homeLost): one that node holds (held, by id there) is OK again,
// one it no longer holds is LOST. When that makes a segment whole enough
// to serve again, its other UNREACHABLE homes become LOST and are freed
// (writes go on without them from now on), a replicated segment's first
// OK copy becomes its primary, and its homes are told how to forward and
// the lost ones rebuilt.
func (p *core) homeReturned(node string, held map[uint64]bool) {
	type back struct {
		seg, homeID uint64
	}
	var found []back
	p.mu.Lock()
	for _, r := range p.segs {
		for _, h := range r.Homes {
			if h.Node == node && h.State == poolv1.HomeState_HOME_STATE_UNREACHABLE {
				found = append(found, back{r.ID, h.HomeID})
			}
		}
	}
	p.mu.Unlock()
	for _, b := range found {
		var drop []homeRef
		next, err := p.updateRecord(b.seg, func(r *record) error {
			i := slices.IndexFunc(r.Homes, func(h homeRef) bool {
				return h.Node == node && h.HomeID == b.homeID && h.State == poolv1.HomeState_HOME_STATE_UNREACHABLE
			})
			if i < 0 {
				return errHomeGone
			}
			if !held[b.homeID] {
				r.Homes[i].State = poolv1.HomeState_HOME_STATE_LOST
				return nil
			}
			r.Homes[i].State = poolv1.HomeState_HOME_STATE_OK
			drop = r.serveAgain()
			return nil
		})
		switch {
		case errors.Is(err, errHomeGone) || errors.Is(err, errs.ErrNotFound):
			continue
		case err != nil:
			p.log.Error("a home of a lost redundant segment returned, and the record does not say so yet", "segment", b.seg, "node", node, "err", err)
			continue
		}
		for _, h := range drop {
			p.peers.freeLater(h.Node, h.HomeID)
		}
		if !held[b.homeID] {
			p.log.Warn("a kept home of a lost redundant segment returned without it", "segment", b.seg, "node", node)
			continue
		}
		if next.Lost {
			p.log.Info("a kept home of a lost redundant segment returned; the segment waits for more", "segment", b.seg, "node", node, "lost", next.lostHomes())
			continue
		}
		p.log.Warn("redundant segment restored: a kept home returned with it", "segment", b.seg, "node", node, "primary", next.Home, "epoch", next.Epoch)
		p.replicateLater(b.seg)
		p.rebuildSoon(b.seg)
	}
}

// serveAgain applies a home of r that is OK again (a kept home returned,
// or a home move's leaving home put back): when r is whole enough to
// serve, its UNREACHABLE homes become LOST (writes go on without them
// from now on; returned, to be freed) and a replicated segment's first OK
// copy its primary. A record still lost is left as it is.
func (r *record) serveAgain() (drop []homeRef) {
	if r.wouldBeLost() {
		return nil
	}
	for k, h := range r.Homes {
		if h.State == poolv1.HomeState_HOME_STATE_UNREACHABLE {
			r.Homes[k].State = poolv1.HomeState_HOME_STATE_LOST
			drop = append(drop, h)
		}
	}
	r.promote()
	return drop
}

// errHomeGone is a home homeLost does not find (lost already).
var errHomeGone = errors.New("no such home that is not lost")

// replicateLater runs replicate on segment id's current record in the
// background until it succeeds, then unsealIdle until that does (writers
// a killed move or rebuild left sealed serve again, now that they forward
// to every home the record names OK), backing off from reconcileRetry to
// 5 s, while the segment exists and is not lost and the daemon runs. One
// runs per segment at a time: asked again meanwhile, it runs once more
// (replicate included) when done, on the record as it is then (an older
// record sent last would undo a newer one's forwarding).
func (p *core) replicateLater(id uint64) {
	p.mu.Lock()
	if p.replicating == nil {
		p.replicating = map[uint64]bool{}
	}
	_, running := p.replicating[id]
	p.replicating[id] = running // true: run again when done
	p.mu.Unlock()
	if running {
		return
	}
	p.peers.later(0, func(ctx context.Context) {
		defer func() {
			p.mu.Lock()
			delete(p.replicating, id)
			p.mu.Unlock()
		}()
		wait := reconcileRetry
		replicated := false
		for {
			p.mu.Lock()
			cur, ok := p.segs[id]
			var r record
			if ok {
				r = *cur
				r.Homes = slices.Clone(cur.Homes)
			}
			p.replicating[id] = false
			p.mu.Unlock()
			if !ok || r.Lost || !r.redundant() {
				return
			}
			var err error
			if !replicated {
				err = p.replicate(ctx, &r)
				replicated = err == nil
			}
			if replicated {
				err = p.unsealIdle(ctx, id)
			}
			p.mu.Lock()
			again := p.replicating[id]
			p.mu.Unlock()
			switch {
			case again: // at once, on the newer record
				wait, replicated = reconcileRetry, false
				continue
			case err == nil:
				return
			case !errors.Is(err, errUnsealBusy):
				p.log.Info("telling the homes of a redundant segment how to forward: retrying", "segment", id, "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, 5*time.Second)
		}
	})
}

// segHome is one copy or shard of a redundant segment: the segment's id
// here and the copy's id at its node.
type segHome struct{ seg, homeID uint64 }

// homesOn is the copies and shards on node, not lost, of the redundant
// segments, those lost for now included: a segment that waits for a kept
// home to return (homeLost) has others OK, and their node's death and
// return are to be judged like any other's. Skipped, a node that reclaimed
// such a home while the origin could not reach it (its lease there ran
// out) stayed OK in the record, and the segment, restored when the kept
// home returned, named a home that no longer held it. p.mu must be held.
func (p *core) homesOn(node string) map[segHome]bool {
	out := map[segHome]bool{}
	for _, r := range p.segs {
		if !r.redundant() {
			continue
		}
		for _, id := range r.idsOn(node) {
			out[segHome{r.ID, id}] = true
		}
	}
	return out
}

// redundantChanged applies a change of node to the redundant segments
// with a home there (homeChanged): a dead node's homes are lost; of a
// returning node's homes, those in asked (the homes there before the node
// was asked what it holds: one placed since is missing from its answer
// but alive) that it no longer holds (held, by id there) are lost, and
// the survivors of every segment with a home there are told again how to
// forward (a restarted home forgot).
func (p *core) redundantChanged(node string, up bool, held map[uint64]bool, asked map[segHome]bool) {
	var lost []segHome
	var again []uint64
	p.mu.Lock()
	for h := range p.homesOn(node) {
		switch {
		case !up || asked[h] && !held[h.homeID]:
			lost = append(lost, h)
		case !slices.Contains(again, h.seg):
			again = append(again, h.seg)
		}
	}
	p.mu.Unlock()
	why := "its node is dead"
	if up {
		why = "its node returned without it"
	}
	for _, h := range lost {
		p.homeLost(h.seg, node, h.homeID, why, false)
	}
	if up {
		p.homeReturned(node, held)
	}
	for _, id := range again {
		p.replicateLater(id)
	}
}

// HomeFailed takes a home's report that it could not forward to another
// home of the same segment; only a peer daemon's session may report, and
// only of a segment with a home at its node.
func (s *service) HomeFailed(ctx context.Context, req *poolv1.HomeFailedRequest) (*poolv1.HomeFailedResponse, error) {
	c, err := s.caller(ctx)
	if err == nil && !isPeer(c) {
		err = fmt.Errorf("%w: only a home of a redundant segment reports a failed forward, and the caller is %s", errs.ErrAccessDenied, c.ident)
	}
	if err == nil {
		err = s.d.pool.homeFailed(strings.TrimPrefix(c.id(), peerClientPrefix), req)
	}
	if err != nil {
		s.d.refused("home-failed", c, req.HomeId, req.TargetNode, err)
		return nil, errs.ToStatus(err)
	}
	return &poolv1.HomeFailedResponse{}, nil
}

// homeFailed marks the target of a report from node lost: the record with
// a home at node of id req.HomeId that also has the target as a home.
func (p *core) homeFailed(node string, req *poolv1.HomeFailedRequest) error {
	p.mu.Lock()
	var seg uint64
	found := false
	for _, r := range p.segs {
		if r.redundant() && slices.Contains(r.idsOn(node), req.HomeId) && slices.Contains(r.idsOn(req.TargetNode), req.TargetHomeId) {
			seg, found = r.ID, true
			break
		}
	}
	p.mu.Unlock()
	if !found {
		return fmt.Errorf("%w: no redundant segment here has home %d at %s and home %d at %s (freed, or marked lost already)",
			errs.ErrNotFound, req.HomeId, node, req.TargetHomeId, req.TargetNode)
	}
	p.homeLost(seg, req.TargetNode, req.TargetHomeId, fmt.Sprintf("%s could not forward to it: %s", node, req.Reason), true)
	return nil
}
