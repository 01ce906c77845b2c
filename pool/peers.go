package pool

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
)

// peerClientPrefix marks the client id a daemon uses at its peers: the
// peer-held segments of node A belong to client "poold/A", kept alive by
// one session from A, and reclaimed by the peer when A's lease ends.
const peerClientPrefix = "poold/"

// isPeerDaemon reports whether client id names a peer daemon (poold/NODE),
// not one of its clients (poold/NODE/CLIENT, a delegated credential's).
func isPeerDaemon(id string) bool {
	node, ok := strings.CutPrefix(id, peerClientPrefix)
	return ok && node != "" && !strings.Contains(node, "/")
}

// peers holds this daemon's sessions with the daemons it places segments on.
// It is safe for concurrent use.
type peers struct {
	self string
	log  *slog.Logger
	tls  *tls.Config // this node's certificate for calls to peers; nil with --insecure
	// onUp runs when a session with a peer is (re)established.
	onUp func(node string)
	// onOrphan runs when a free at a peer failed or could not be sent:
	// the peer may hold a segment no record names (core.mayHoldOrphans).
	onOrphan func(node string)

	mu    sync.Mutex
	conns map[string]*session.Conn
	// used is when get last returned each node's session: closeIdle
	// closes those that nothing asked for within peerIdle and that no
	// segment needs.
	used map[string]time.Time
	// proven is the address at which each node's session last proved its
	// name (certificate and Welcome): it outlives closeIdle, so that what
	// counts proven members (the rebalancer's mean) does not redial a
	// session nothing else needs every time closeIdle closes it.
	proven map[string]string
	// refused holds the nodes whose certificate or Welcome named another
	// node, until refuseFor passes or the node announces another address.
	refused map[string]refusal

	// epochs counts the membership changes of each node that homeChanged
	// handled, so that an overtaken one does not apply its verdict.
	epochs map[string]uint64
	// judges serialize the verdicts on each node's redundant homes
	// (homeChanged): a return is judged only after a death that began
	// before it has marked every home.
	judges map[string]*sync.Mutex

	// frees are the frees freeLater queued at each node and not yet
	// answered (freeQueue).
	frees map[string]*freeQueue

	wg   sync.WaitGroup // asynchronous frees
	done bool
	// stop cancels asynchronous frees at close: a peer that does not answer
	// is asked again by the next run of this daemon (orphans), and reclaims
	// the segments itself when this daemon's lease there ends.
	stop chan struct{}
}

// refuseFor is how long a node refused for its name is neither dialed
// nor chosen for placements, unless it announces another address.
const refuseFor = 30 * time.Second

// refusal is why and when a node was refused (peers.refuse).
type refusal struct {
	addr   string
	err    error
	at     time.Time
	logged time.Time // last log line about it: at most one a refuseFor
}

// errPeerRefused marks a peer whose certificate, or whose answer, names
// another node than the one dialed.
var errPeerRefused = fmt.Errorf("%w: the peer is not the node it was dialed as", errs.ErrAccessDenied)

// get returns the session with node, dialing it at addr. With TLS the
// peer's certificate must name node (certs.CheckName), and with or
// without it the daemon must answer as node (Welcome.node): a gossip
// member announcing another node's address under a name of its own gets
// no session, so nothing this daemon does for it reaches that node.
func (ps *peers) get(ctx context.Context, node, addr string) (*session.Conn, error) {
	ps.mu.Lock()
	if ps.done {
		ps.mu.Unlock()
		return nil, fmt.Errorf("peers: %w", errs.ErrUnavailable)
	}
	if c := ps.conns[node]; c != nil && c.Addr() == addr {
		ps.useLocked(node)
		ps.mu.Unlock()
		return c, nil
	}
	ps.mu.Unlock()
	if why := ps.refusal(node, addr); why != nil {
		return nil, fmt.Errorf("peer %s at %s: %w: %w", node, addr, errPeerRefused, why)
	}
	var tc *tls.Config
	var wrongName atomic.Pointer[error]
	if ps.tls != nil {
		tc = ps.tls.Clone()
		tc.VerifyConnection = func(cs tls.ConnectionState) error {
			err := certs.CheckName(cs, node)
			if err != nil {
				wrongName.Store(&err)
			}
			return err
		}
	}
	c, err := session.Dial(ctx, "tcp", addr, session.Options{
		ClientID: peerClientPrefix + ps.self, ClientName: "poold " + ps.self, TLS: tc,
		OnUp: func(string) {
			if ps.onUp != nil {
				go ps.onUp(node)
			}
		},
	})
	if e := wrongName.Load(); e != nil {
		return nil, ps.refuse(node, addr, "peer refused: its certificate does not name it", *e)
	}
	if err != nil {
		return nil, fmt.Errorf("peer %s at %s: %w", node, addr, err)
	}
	if got := c.Node(); got != node {
		c.Close()
		return nil, ps.refuse(node, addr, "peer refused: it answers as another node", fmt.Errorf("the daemon at %s answers as node %q", addr, got))
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.done {
		c.Close()
		return nil, fmt.Errorf("peers: %w", errs.ErrUnavailable)
	}
	ps.useLocked(node)
	if old := ps.conns[node]; old != nil {
		if old.Addr() == addr {
			c.Close()
			return old, nil
		}
		old.Close()
	}
	delete(ps.refused, node)
	ps.conns[node] = c
	if ps.proven == nil {
		ps.proven = map[string]string{}
	}
	ps.proven[node] = addr
	return c, nil
}

// isProven reports whether a session proved node's name at addr (get),
// whether or not it is still open.
func (ps *peers) isProven(node, addr string) bool {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.proven[node] == addr && addr != ""
}

// useLocked notes that node's session was asked for now; ps.mu is held.
func (ps *peers) useLocked(node string) {
	if ps.used == nil {
		ps.used = map[string]time.Time{}
	}
	ps.used[node] = time.Now()
}

// peerIdle is how long a session with a peer that no segment needs stays
// open after it was last asked for (peers.get): the sessions a home opens
// to report a failed forward to its origin, a rebuild's with the homes it
// read from, would otherwise stay for good, one TCP connection and a lease
// at the peer each. A daemon whose segments live on every peer keeps every
// session; one that needs a peer again dials it again.
const peerIdle = time.Minute

// idle lists the nodes whose sessions get has not returned since before.
func (ps *peers) idle(before time.Time) []string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	var out []string
	for node := range ps.conns {
		if ps.used[node].Before(before) {
			out = append(out, node)
		}
	}
	return out
}

// closeIdle closes the sessions with nodes that get has not returned
// since before (one asked for meanwhile stays).
func (ps *peers) closeIdle(nodes []string, before time.Time) {
	var idle []*session.Conn
	ps.mu.Lock()
	for _, node := range nodes {
		if c := ps.conns[node]; c != nil && ps.used[node].Before(before) {
			delete(ps.conns, node)
			delete(ps.used, node)
			idle = append(idle, c)
		}
	}
	ps.mu.Unlock()
	for _, c := range idle {
		c.Close()
	}
}

// closeIdleConns closes the connections to peers that no segment needs
// any more: pushes idle for pusherIdle, and the sessions that nothing
// asked for within peerIdle with nodes where no record here has a home
// (one marked lost included: its lease there keeps a home that is only
// cut off), no allocation or move is under way, and no copy or shard here
// forwards or pushes to.
func (p *core) closeIdleConns(now time.Time) {
	p.pushing.closeIdle(now.Add(-pusherIdle))
	before := now.Add(-peerIdle)
	idle := p.peers.idle(before)
	if len(idle) == 0 {
		return
	}
	need := map[string]bool{}
	p.fwd.nodes(need)
	p.pushing.nodes(need)
	p.mu.Lock()
	for _, r := range p.segs {
		if r.Home != "" && !r.redundant() {
			need[r.Home] = true
		}
		for _, h := range r.Homes {
			if h.State != poolv1.HomeState_HOME_STATE_LOST {
				need[h.Node] = true
			}
		}
	}
	for node, n := range p.pendingRemote {
		need[node] = need[node] || n > 0
	}
	p.mu.Unlock()
	idle = slices.DeleteFunc(idle, func(node string) bool { return need[node] || p.moving.involves(node) })
	p.peers.closeIdle(idle, before)
}

// refuse records that node, dialed at addr, is not who it says, logs it
// (at most once a refuseFor per node: a rogue member must not flood the
// log), and returns the error for the caller.
func (ps *peers) refuse(node, addr, msg string, why error) error {
	now := time.Now()
	ps.mu.Lock()
	if ps.refused == nil {
		ps.refused = map[string]refusal{}
	}
	r := ps.refused[node]
	log := r.addr != addr || now.Sub(r.logged) >= refuseFor
	r.addr, r.err, r.at = addr, why, now
	if log {
		r.logged = now
	}
	ps.refused[node] = r
	delete(ps.proven, node)
	ps.mu.Unlock()
	if log {
		ps.log.Warn(msg, "node", node, "addr", addr, "err", why)
	}
	return fmt.Errorf("peer %s at %s: %w: %w", node, addr, errPeerRefused, why)
}

// isRefused reports whether node, announcing addr, was refused within
// refuseFor: placements do not choose it.
func (ps *peers) isRefused(node, addr string) bool { return ps.refusal(node, addr) != nil }

// refusal is why node, announcing addr, was refused within refuseFor;
// nil if it was not.
func (ps *peers) refusal(node, addr string) error {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if r, ok := ps.refused[node]; ok && r.addr == addr && time.Since(r.at) < refuseFor {
		return r.err
	}
	return nil
}

// drop closes the session with node, if any: the node left,
// or it answered as another node.
func (ps *peers) drop(node string) {
	ps.mu.Lock()
	c := ps.conns[node]
	delete(ps.conns, node)
	delete(ps.used, node)
	ps.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// conn returns the existing session with node, if any.
func (ps *peers) conn(node string) *session.Conn {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.conns[node]
}

// freeQueue is the segments freeLater is to free at one node, in order,
// and the set of them (queued, also those being freed): a segment is
// queued once however often it is asked for (a reconcile every few
// seconds lists the orphans whose frees are still under way).
type freeQueue struct {
	ids    []uint64
	queued map[uint64]bool
}

// Frees at a node: freeAtOnce sent together, each bounded by freeTimeout.
const (
	freeAtOnce  = 4
	freeTimeout = 10 * time.Second
)

// freeLater frees a segment at its home in the background: one worker per
// node sends the frees queued there, freeAtOnce at a time, so that a heal
// that finds thousands of orphans neither sends one twice nor floods the
// node. When a free fails without an answer (outcomeUnknown), or a
// whole batch is refused, the rest of the node's queue is dropped and the
// home is asked again once it answers (onOrphan: a reconcile lists what
// it still holds and frees it), so that a node that does not answer, or
// refuses everything, costs one batch, not one per segment; a free it
// refuses among others that it does is asked again that way while the
// others go on.
func (ps *peers) freeLater(node string, homeID uint64) {
	ps.mu.Lock()
	if ps.done {
		ps.mu.Unlock()
		return
	}
	q := ps.frees[node]
	start := q == nil
	if start {
		q = &freeQueue{queued: map[uint64]bool{}}
		if ps.frees == nil {
			ps.frees = map[string]*freeQueue{}
		}
		ps.frees[node] = q
	}
	if !q.queued[homeID] {
		q.queued[homeID] = true
		q.ids = append(q.ids, homeID)
	}
	ps.mu.Unlock()
	if start {
		ps.later(0, func(ctx context.Context) { ps.sendFrees(ctx, node, q) })
	}
}

// sendFrees sends the frees queued at node (q) until none is left; the
// queue is gone when it returns, and the next freeLater starts another.
// The frees the node refused are logged once, when it returns.
func (ps *peers) sendFrees(ctx context.Context, node string, q *freeQueue) {
	var refused []error
	defer func() {
		if len(refused) > 0 {
			ps.log.Warn("frees at the home node refused; it is asked again later", "node", node,
				"refused", len(refused), "err", refused[0])
			ps.orphaned(node)
		}
	}()
	for {
		ps.mu.Lock()
		batch := slices.Clone(q.ids[:min(freeAtOnce, len(q.ids))])
		q.ids = q.ids[len(batch):]
		if len(batch) == 0 {
			delete(ps.frees, node)
		}
		ps.mu.Unlock()
		if len(batch) == 0 {
			return
		}
		c := ps.conn(node)
		if c == nil || ctx.Err() != nil {
			ps.dropFrees(node)
			ps.orphaned(node)
			return
		}
		if got := c.Node(); got != node {
			ps.log.Warn("not freeing segments at a peer that answers as another node", "node", node, "answers-as", got, "segments", len(batch)+ps.dropFrees(node))
			return
		}
		failed := make([]error, len(batch))
		var wg sync.WaitGroup
		for i, id := range batch {
			wg.Go(func() {
				fctx, cancel := context.WithTimeout(ctx, freeTimeout)
				defer cancel()
				failed[i] = freeOn(fctx, c, id)
			})
		}
		wg.Wait()
		ps.mu.Lock()
		for _, id := range batch {
			delete(q.queued, id)
		}
		ps.mu.Unlock()
		err := errors.Join(failed...)
		if err == nil {
			continue
		}
		if ctx.Err() != nil { // closing: the next run of this daemon asks again
			ps.dropFrees(node)
			return
		}
		failed = slices.DeleteFunc(failed, func(e error) bool { return e == nil })
		if len(failed) == len(batch) || slices.ContainsFunc(failed, outcomeUnknown) {
			// No answer, or a node that refuses every free now (this
			// daemon's session there ended, say): the rest waits for
			// the reconcile once it answers.
			ps.log.Warn("free at the home node failed; it is asked again once it answers", "node", node,
				"failed", len(failed), "of", len(batch), "put-off", ps.dropFrees(node), "err", err)
			ps.orphaned(node)
			return
		}
		// The node refused some of these: the others are freed all the
		// same (one it keeps refusing must not hold them up).
		refused = append(refused, failed...)
	}
}

// dropFrees forgets the frees queued at node, ending its queue, and
// returns how many there were.
func (ps *peers) dropFrees(node string) int {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	q := ps.frees[node]
	if q == nil {
		return 0
	}
	delete(ps.frees, node)
	return len(q.ids)
}

// orphaned reports that node may hold a segment of this daemon's that no
// record names (onOrphan).
func (ps *peers) orphaned(node string) {
	if ps.onOrphan != nil {
		ps.onOrphan(node)
	}
}

// freeOn frees segment id at the node of session c; one that is gone
// already is no error.
func freeOn(ctx context.Context, c *session.Conn, id uint64) error {
	cctx, _, err := c.Call(ctx)
	if err == nil {
		_, err = c.API().Free(cctx, &poolv1.FreeRequest{Id: id})
		err = errs.FromStatus(err)
	}
	if errors.Is(err, errs.ErrNotFound) {
		return nil
	}
	return err
}

// later runs fn in the background, with a context that ends at close or
// after timeout (0: none); nothing runs once the peers are closing.
func (ps *peers) later(timeout time.Duration, fn func(ctx context.Context)) {
	ps.mu.Lock()
	if ps.done {
		ps.mu.Unlock()
		return
	}
	ps.wg.Add(1)
	ps.mu.Unlock()
	go func() {
		defer ps.wg.Done()
		ctx, stop := untilClosed(context.Background(), ps.stop)
		defer stop()
		if timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, timeout)
			defer cancel()
		}
		fn(ctx)
	}()
}

func (ps *peers) close() {
	ps.mu.Lock()
	if !ps.done {
		close(ps.stop)
	}
	ps.done = true
	conns := ps.conns
	ps.conns = map[string]*session.Conn{}
	ps.mu.Unlock()
	ps.wg.Wait()
	for _, c := range conns {
		c.Close()
	}
}

// allocRemote places a segment on a peer chosen by pickPeer and records
// it here; an error matching cluster.ErrNoPeer when no peer can take it.
func (p *core) allocRemote(ctx context.Context, c caller, req allocRequest, pl plan) (*record, error) {
	if p.cl == nil {
		return nil, fmt.Errorf("%w: this daemon gossips with nobody", cluster.ErrNoPeer)
	}
	p.mu.Lock()
	why, err := p.admit(c, poolv1.Tier_TIER_RDMA, req.Size)
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if why != "" {
		return nil, fmt.Errorf("%w: %s", cluster.ErrNoPeer, why)
	}
	m, pc, err := p.pickPeer(ctx, req.Size, pl)
	if err != nil {
		return nil, err
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return nil, err
	}
	// Until the record is committed below, reconcile must not take the new
	// segment for an orphan.
	defer p.placing(m.Name)()
	seg, err := pc.API().Alloc(cctx, &poolv1.AllocRequest{Size: req.Size, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: c.id()})
	if err != nil {
		p.mayHoldOrphans(m.Name, err) // the allocation may have been made, its answer lost
		return nil, fmt.Errorf("alloc on peer %s: %w", m.Name, errs.FromStatus(err))
	}
	var key rdma.Key
	copy(key[:], seg.Key)
	p.mu.Lock()
	defer p.mu.Unlock()
	if req.Name != "" {
		if _, ok := p.names[req.Name]; ok {
			p.peers.freeLater(m.Name, seg.Id)
			return nil, fmt.Errorf("alloc %q: %w", req.Name, errs.ErrExists)
		}
	}
	id, err := p.newID()
	if err != nil {
		p.peers.freeLater(m.Name, seg.Id)
		return nil, err
	}
	dataTLS := seg.DataTls
	r := &record{
		ID: id, Name: req.Name, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: req.Size,
		Owner: c.id(), Persist: req.Persist, Epoch: seg.Epoch, Created: p.now().UTC(), Key: key,
		Home: m.Name, HomeID: seg.Id, DataAddr: seg.DataAddr, DataTLS: &dataTLS,
	}
	r.grant(c, req)
	if err := p.st.put(r); err != nil {
		p.peers.freeLater(m.Name, seg.Id)
		return nil, fmt.Errorf("alloc: commit to the metadata store: %w", err)
	}
	p.link(r)
	p.usage.add(r)
	if r.Name != "" {
		p.names[r.Name] = id
	}
	p.log.Debug("alloc on peer", "segment", id, "node", m.Name, "home-id", seg.Id, "size", r.Size)
	cp := *r
	return &cp, nil
}

// placing counts an allocation on node as under way until the function it
// returns is called: reconcile takes no segment there for an orphan
// meanwhile.
func (p *core) placing(node string) (done func()) {
	p.mu.Lock()
	p.pendingRemote[node]++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		p.pendingRemote[node]--
		p.mu.Unlock()
	}
}

// pickPeer chooses a peer for size bytes among the members not refused
// for their name nor named in skip and, when pl has a budget, among those
// whose measured figures meet it (an unmeasured peer meets no budget:
// placement never guesses). Capacity comes first, then nearness:
// cluster.PickNear with the read latency this daemon measured of each peer
// (pl.peers; an unmeasured peer is judged by capacity alone). It returns
// the peer's session; a member refused while dialing it is left out and
// another chosen, each member at most once.
func (p *core) pickPeer(ctx context.Context, size int64, pl plan, skip ...string) (cluster.Member, *session.Conn, error) {
	members := slices.DeleteFunc(p.cl.Members(), func(m cluster.Member) bool {
		return p.peers.isRefused(m.Name, m.Meta.GRPCAddr) || slices.Contains(skip, m.Name)
	})
	if pl.budget.set() {
		var over []string
		fit := 0
		members = slices.DeleteFunc(members, func(m cluster.Member) bool {
			if _, ok := m.Meta.Tier(tierName(poolv1.Tier_TIER_RDMA)); !ok || m.Name == p.cfg.Node || !m.Usable() {
				return false // Pick leaves it out and says why
			}
			if miss := pl.budget.miss(pl.peers[m.Name]); miss != "" {
				over = append(over, m.Name+" "+miss)
				return true
			}
			fit++
			return false
		})
		if fit == 0 && len(over) > 0 {
			return cluster.Member{}, nil, fmt.Errorf("%w: no peer meets %s: %s", cluster.ErrNoPeer, pl.budget, strings.Join(over, "; "))
		}
	}
	for len(members) > 0 {
		m, err := cluster.PickNear(members, tierName(poolv1.Tier_TIER_RDMA), size, p.cfg.Node, nil, pl.near)
		if err != nil {
			return m, nil, err
		}
		pc, err := p.peers.get(ctx, m.Name, m.Meta.GRPCAddr)
		if errors.Is(err, errPeerRefused) && ctx.Err() == nil {
			// Refused now: left out, the others are still fine.
			members = slices.DeleteFunc(members, func(o cluster.Member) bool { return o.Name == m.Name })
			continue
		}
		return m, pc, err
	}
	return cluster.Member{}, nil, fmt.Errorf("%w: every member was refused for its name", cluster.ErrNoPeer)
}

// reconcileRetry is the first pause before homeChanged asks a home again.
const reconcileRetry = 200 * time.Millisecond

// homeChanged marks the segments homed on node lost (down) or asks the
// home which of them it still holds for this node and marks those
// reachable again (up), and tells their owners. One List call at the home
// answers for all of them (one Stat per segment took as many calls, and a
// slow home ran them out of time, leaving live segments marked lost). When
// the home cannot be asked, the segments keep their state and the call is
// repeated (backing off from reconcileRetry to 5 s) until it is answered,
// a newer change of the node overtakes it, or the daemon stops: after a
// partition heals, every node reconciles with every node of the other side
// at once, some calls time out or find their connection reset, and a lone
// attempt left live segments marked lost for good (measured by the scale
// simulation, docs/scale.md). A call that a newer one for the same node
// overtook does not apply its verdict.
//
// Only records that existed before the home was asked are judged: a
// segment placed there while the List was under way is missing from its
// answer but alive, and judging it marked it lost for good.
//
// The redundant homes on node are judged under node's judge lock. A death
// takes it before its epoch and holds it while it marks the homes lost or
// kept (one store commit each); a return takes it once the home has
// answered, and applies its verdict only if no newer change of node began.
// So a return that began during a death's marking sees every home the
// death kept and restores it (judged concurrently, a kept home marked
// after the return's look stayed unreachable until the node's next
// return), and a return overtaken by a death restores nothing.
func (p *core) homeChanged(node string, up bool) {
	judge := p.peers.judge(node)
	if !up {
		judge.Lock()
	}
	epoch := p.peers.nextEpoch(node)
	if up && p.orphans.firstReturn(node) {
		// What was in flight there when this daemon stopped is not
		// recorded: node is asked for it, once this judgment is done (a
		// mark now would have the reconcile below dial every peer, and
		// retry one that does not answer for as long as it is up).
		defer p.mayHoldOrphans(node, nil)
	}
	asked := map[*record]bool{}
	p.mu.Lock()
	for _, r := range p.segs {
		if !r.redundant() && r.Home == node {
			asked[r] = true
		}
	}
	askedHomes := p.homesOn(node)
	p.mu.Unlock()
	var held map[uint64]bool
	for wait := reconcileRetry; up; wait = min(2*wait, 5*time.Second) {
		var ok bool
		if held, ok = p.reconcileWith(context.Background(), node, false); ok && held == nil {
			return // nothing homed there
		} else if ok {
			break
		}
		select {
		case <-p.peers.stop:
			return
		case <-time.After(wait):
		}
		if p.peers.epoch(node) != epoch {
			return // a newer change of node decides
		}
	}
	if up {
		judge.Lock()
	}
	if hook := p.cfg.sim.judging; hook != nil {
		hook(node, up)
	}
	stale := p.peers.epoch(node) != epoch
	if !stale || !up {
		p.redundantChanged(node, up, held, askedHomes)
	}
	judge.Unlock()
	if stale {
		return // a newer change of node decides the rest
	}
	p.mu.Lock()
	var homed []*record
	for _, r := range p.segs {
		if !r.redundant() && r.Home == node && (!up || asked[r]) {
			homed = append(homed, r)
		}
	}
	p.mu.Unlock()
	if len(homed) == 0 {
		return
	}
	dataAddr := ""
	if up && p.cl != nil {
		if m, ok := p.cl.Member(node); ok {
			dataAddr = m.Meta.DataAddr
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.peers.epoch(node) != epoch {
		return // a newer change of node decides
	}
	byOwner := map[string]*poolv1.SegmentEvents{}
	n := 0
	for _, r := range homed {
		lost := !held[r.HomeID]
		if !lost && dataAddr != "" {
			r.DataAddr = dataAddr // a restarted home may serve on another port
		}
		if r.Lost == lost || p.segs[r.ID] != r {
			continue
		}
		r.Lost = lost
		n++
		ev := byOwner[r.Owner]
		if ev == nil {
			ev = &poolv1.SegmentEvents{}
			byOwner[r.Owner] = ev
		}
		ev.Lost = appendIf(ev.Lost, r.ID, lost)
		ev.Restored = appendIf(ev.Restored, r.ID, !lost)
		for _, a := range r.Attached {
			if byOwner[a] == nil {
				byOwner[a] = &poolv1.SegmentEvents{}
			}
			byOwner[a].Lost = appendIf(byOwner[a].Lost, r.ID, lost)
			byOwner[a].Restored = appendIf(byOwner[a].Restored, r.ID, !lost)
		}
	}
	if n > 0 {
		if up {
			p.log.Info("segments on a returning node", "node", node, "restored", countIf(homed, false), "lost", countIf(homed, true))
		} else {
			p.log.Warn("segments lost: their home node is gone", "node", node, "segments", n)
		}
		p.notifyLocked(byOwner)
	}
}

// reconcile asks node for the segments it holds for this daemon: it
// returns the ids (at node) of those that are active, and frees those
// that no record here names any more (a free that failed while node was
// unreachable), so that their capacity returns even while this daemon's
// session there lives. Without a session (or with one to the address node
// had before it restarted), it opens one when segments are homed on node
// (this daemon restarted), which also keeps them leased there, or when
// node may hold orphans (orphans: their marks clear once node answered).
// ok is false when node could not be asked; without a session and with
// neither there is nothing to ask: held is nil and ok true.
func (p *core) reconcile(ctx context.Context, node string) (held map[uint64]bool, ok bool) {
	return p.reconcileWith(ctx, node, true)
}

// reconcileWith is reconcile; orphans says whether a suspicion of orphans
// at node (orphans.marked) is reason enough to ask it. homeChanged, which
// asks again until node answered, leaves those to the time-limited check
// (checkOrphans), so that a node that gossip lists alive but that cannot
// be called is not called every few seconds for as long as that lasts.
func (p *core) reconcileWith(ctx context.Context, node string, orphans bool) (held map[uint64]bool, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	started, suspect := time.Now(), orphans && p.orphans.marked(node)
	pc := p.peers.conn(node)
	if pc != nil && p.cl != nil {
		if m, found := p.cl.Member(node); found && m.Meta.GRPCAddr != "" && m.Meta.GRPCAddr != pc.Addr() {
			pc = nil // node restarted at another address: its session from before answers no more
		}
	}
	if pc == nil {
		p.mu.Lock()
		homed := slices.ContainsFunc(slices.Collect(maps.Values(p.segs)), func(r *record) bool { return r.homedOn(node) })
		p.mu.Unlock()
		homed = homed || p.moving.involves(node) || suspect
		if !homed || p.cl == nil {
			return nil, true // nothing to ask about
		}
		m, found := p.cl.Member(node)
		if !found || m.Meta.GRPCAddr == "" {
			return nil, false
		}
		var err error
		if pc, err = p.peers.get(ctx, node, m.Meta.GRPCAddr); err != nil {
			return nil, false
		}
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return nil, false
	}
	segs, err := poolv1.ListAll(cctx, pc.API(), &poolv1.ListRequest{}, 0)
	if err != nil {
		return nil, false
	}
	// The answer must come from node itself: freeing what another node
	// lists, against the records of node, frees live segments of that
	// other node's.
	if got := pc.Node(); got != node {
		p.refuseAnswer(node, pc, fmt.Errorf("its session answers as node %q", got))
		return nil, false
	}
	for _, seg := range segs {
		if seg.Owner == peerClientPrefix+p.cfg.Node && seg.Node != node {
			p.refuseAnswer(node, pc, fmt.Errorf("it lists segment %d as held by node %q", seg.Id, seg.Node))
			return nil, false
		}
	}
	p.mu.Lock()
	pending := p.pendingRemote[node]
	known := map[uint64]bool{}
	for _, r := range p.segs {
		for _, id := range r.idsOn(node) {
			known[id] = true
		}
	}
	// Under the same hold as the records: a switch-over between the two
	// reads would leave a moved segment's new home out of both.
	p.moving.held(node, known)
	p.mu.Unlock()
	held = map[uint64]bool{}
	var freeing []uint64
	for _, seg := range segs {
		if seg.Owner != peerClientPrefix+p.cfg.Node {
			continue
		}
		held[seg.Id] = seg.State == poolv1.SegmentState_SEGMENT_STATE_ACTIVE
		// An allocation there not recorded yet is no orphan; the next
		// reconnect checks again.
		if !known[seg.Id] && pending == 0 {
			freeing = append(freeing, seg.Id)
			p.peers.freeLater(node, seg.Id)
		}
	}
	if len(freeing) > 0 {
		p.log.Info("freeing segments a peer still holds for this node but no record names", "node", node,
			"segments", len(freeing), "first", freeing[:min(8, len(freeing))])
	}
	if suspect && pending == 0 {
		p.orphans.clear(node, started) // a free that fails marks it again
	}
	return held, true
}

// sweepPeers asks every peer this daemon has a session with which
// segments it holds for this daemon, and frees those no record here names
// (reconcile does both). Such an orphan is left by an allocation whose
// answer never came back (the call timed out after the peer had allocated);
// the session keeps it leased, so without a sweep it stayed until the
// session next came up, for good on a steady one (the scale simulation
// found two after a 200-host run). Only alive members are asked; the
// sessions of nodes that left are dropped (a dead node's session stays). It
// returns early when ctx ends.
func (p *core) sweepPeers(ctx context.Context) {
	p.peers.mu.Lock()
	nodes := slices.Collect(maps.Keys(p.peers.conns))
	p.peers.mu.Unlock()
	for _, node := range p.orphans.nodes() {
		if !slices.Contains(nodes, node) {
			nodes = append(nodes, node)
		}
	}
	for _, node := range nodes {
		if ctx.Err() != nil {
			return
		}
		if p.cl != nil {
			m, ok := p.cl.Member(node)
			if ok && m.State == cluster.StateLeft {
				// Departed: its session only held a lease there for
				// segments already marked lost.
				p.peers.drop(node)
				p.orphans.forget(node)
				continue
			}
			if !ok || m.State != cluster.StateAlive {
				// Dead, or dead long enough to be forgotten: the session
				// stays, so that its lease holds the segments there if
				// the node was only cut off from gossip and comes back.
				continue
			}
		}
		p.reconcile(ctx, node)
	}
}

// refuseAnswer drops the session with node whose answer came from another
// node, and refuses node for a while (peers.refuse logs it).
func (p *core) refuseAnswer(node string, pc *session.Conn, why error) {
	p.peers.drop(node)
	_ = p.peers.refuse(node, pc.Addr(), "peer refused: it answers as another node", why)
}

// nextEpoch starts a new change of node's state; epoch tells whether a
// newer one started since.
func (ps *peers) nextEpoch(node string) uint64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.epochs == nil {
		ps.epochs = map[string]uint64{}
	}
	ps.epochs[node]++
	return ps.epochs[node]
}

// judge returns node's judge lock (peers.judges).
func (ps *peers) judge(node string) *sync.Mutex {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.judges == nil {
		ps.judges = map[string]*sync.Mutex{}
	}
	m := ps.judges[node]
	if m == nil {
		m = &sync.Mutex{}
		ps.judges[node] = m
	}
	return m
}

func (ps *peers) epoch(node string) uint64 {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return ps.epochs[node]
}

func appendIf(ids []uint64, id uint64, ok bool) []uint64 {
	if ok && !slices.Contains(ids, id) {
		return append(ids, id)
	}
	return ids
}

func countIf(rs []*record, lost bool) int {
	n := 0
	for _, r := range rs {
		if r.Lost == lost {
			n++
		}
	}
	return n
}
