// This file holds the origin side of a live move (docs/MOVE.md): the
// daemon that placed an rdma segment on a peer copies it to another peer
// while its clients use it, and switches its record over.

package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
)

// Tunables of the copy.
const (
	// moveMaxChunks bounds the chunks the source tracks a segment in (its
	// DIRTY bitmap is at most moveMaxChunks/8 bytes): a chunk is the
	// smallest power of two from moveChunkMin that keeps within it.
	moveMaxChunks = 1 << 20
	// moveRead is the most bytes one span of the copy covers.
	moveRead = 1 << 20
	// moveBatch is the most bytes, and moveBatchOps the most spans, one
	// batch of the copy moves: read (from the source's memory when it
	// pushes, else in one Do there), then written to the target in one Do.
	// Small batches hold the source's and the target's CPU only briefly
	// between the applications' operations.
	moveBatch    = 1 << 20
	moveBatchOps = 256
	// moveInflight is how many batches the copy keeps in flight.
	moveInflight = 2
	// pushLanes is how many connections the source of a push writes the
	// target on, one batch in flight on each: the target's data plane
	// applies one connection's operations in order, so one connection
	// keeps one of its cores busy at most. Two pushed a 1 GiB rebuild as
	// fast as four on a 2-core VM (README, Rebuilding redundant
	// segments) and left the source's clients twice the share.
	pushLanes = 2
	// moveSettled is the dirty chunk count at which the copy seals: the
	// last round, with operations waiting, copies these and what changed
	// while they were reported.
	moveSettled = 4
	// moveMaxRounds bounds the rounds of dirty chunks before the seal, for
	// a segment written faster than it is copied.
	moveMaxRounds = 8
	// moveStepTimeout bounds one MoveOut step, Alloc or Free at a home;
	// a push of a whole segment has a second more for each moveMinRate
	// bytes of it.
	moveStepTimeout = 10 * time.Second
	moveMinRate     = 4 << 20
)

// moveChunk is the chunk a segment of size bytes is tracked in.
func moveChunk(size int64) int64 {
	c := int64(moveChunkMin)
	for c*moveMaxChunks < size {
		c *= 2
	}
	return c
}

// errMoveHome is a move that failed because a home did not answer on its
// data plane; the segment stays where it was.
var errMoveHome = errs.Sub(errs.ErrUnavailable, "a home of the move did not answer; the segment stays where it was (retry the move)")

// errMoveBusy is a Move of a segment that is moving already.
var errMoveBusy = errs.Sub(errs.ErrLimit, "one move of a segment at a time, and one is under way")

// moves are the moves this daemon drives or still has to finish, by the
// segment's id here. Safe for concurrent use.
type moves struct {
	mu sync.Mutex
	m  map[uint64]*intent
	// switching are the switch-overs under way, from the seal of the
	// source to the commit (or undoing) of the move.
	switching map[uint64]*pendingSwitch
	// idle are closed when the move of their segment ends: a Stat that
	// asks for the settled segment waits on one (awaitIdle).
	idle map[uint64]chan struct{}
	// sealed are the redundant segments whose writer homes may be sealed
	// (mightSeal): unsealIdle unseals only these.
	sealed map[uint64]bool
}

// pendingSwitch is one switch-over under way: announced is closed when
// the table names the new home (or the switch-over was undone), and rec
// is then that record (nil: undone); done is closed when the switch-over
// is committed or undone.
type pendingSwitch struct {
	ms        *moves
	id        uint64
	announced chan struct{}
	done      chan struct{}
	rec       *record
	once      sync.Once
}

// sealing notes that the switch-over of segment id begins: Stat waits
// for its announcement (awaitSwitch), Free for its end (switchDone).
func (ms *moves) sealing(id uint64) *pendingSwitch {
	sw := &pendingSwitch{ms: ms, id: id, announced: make(chan struct{}), done: make(chan struct{})}
	ms.mu.Lock()
	if ms.switching == nil {
		ms.switching = map[uint64]*pendingSwitch{}
	}
	ms.switching[id] = sw
	ms.mu.Unlock()
	return sw
}

// announce answers the Stats waiting for the switch-over with rec, the
// record the table holds now; only the first call counts.
func (sw *pendingSwitch) announce(rec *record) {
	sw.once.Do(func() {
		sw.rec = rec
		close(sw.announced)
	})
}

// end ends the switch-over: committed, or undone (before an
// announcement: the Stats waiting are answered nothing).
func (sw *pendingSwitch) end() {
	sw.ms.mu.Lock()
	if sw.ms.switching[sw.id] == sw {
		delete(sw.ms.switching, sw.id)
		close(sw.done)
	}
	sw.ms.mu.Unlock()
	sw.announce(nil)
}

// switchDone is closed when the switch-over of segment id under way is
// committed or undone; nil when none is under way.
func (ms *moves) switchDone(id uint64) <-chan struct{} {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if sw := ms.switching[id]; sw != nil {
		return sw.done
	}
	return nil
}

// switchWait bounds how long a Stat waits for a switch-over to end.
const switchWait = time.Second

// awaitSwitch waits, up to switchWait or the end of ctx, while segment id
// is between the seal of its source and the announcement of its new home,
// and returns the record the switch-over announced (ok false: none was
// under way, or it was undone, or the wait ended first). A client told MOVED
// asks Stat, and is answered the new home as soon as there is one,
// rather than the old one to ask again after a backoff; the answer needs
// no p.mu, which another move's commit may hold.
func (ms *moves) awaitSwitch(ctx context.Context, id uint64) (rec record, ok bool) {
	ms.mu.Lock()
	sw := ms.switching[id]
	ms.mu.Unlock()
	if sw == nil {
		return record{}, false
	}
	t := time.NewTimer(switchWait)
	defer t.Stop()
	select {
	case <-sw.announced:
		if sw.rec != nil {
			return *sw.rec, true
		}
	case <-t.C:
	case <-ctx.Done():
	}
	return record{}, false
}

// awaitIdle returns once no move of segment id is under way, or
// ErrSegmentChanging when ctx ends first.
func (ms *moves) awaitIdle(ctx context.Context, id uint64) error {
	ms.mu.Lock()
	if _, moving := ms.m[id]; !moving {
		ms.mu.Unlock()
		return nil
	}
	if ms.idle == nil {
		ms.idle = map[uint64]chan struct{}{}
	}
	idle := ms.idle[id]
	if idle == nil {
		idle = make(chan struct{})
		ms.idle[id] = idle
	}
	ms.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("segment %d is still moving: %w", id, errs.ErrSegmentChanging)
	}
}

// begin registers a move of segment id; false when one is under way.
func (ms *moves) begin(id uint64) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[uint64]*intent{}
	}
	if _, ok := ms.m[id]; ok {
		return false
	}
	ms.m[id] = &intent{ID: id}
	return true
}

// set records where the move of in.ID stands.
func (ms *moves) set(in intent) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.m == nil {
		ms.m = map[uint64]*intent{}
	}
	ms.m[in.ID] = &in
}

// end forgets the move of segment id and wakes those waiting for it to
// end.
func (ms *moves) end(id uint64) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.m, id)
	if idle := ms.idle[id]; idle != nil {
		close(idle)
		delete(ms.idle, id)
	}
}

// involves reports whether a move (under way or left to finish) has node
// as its source or target: reconcile asks it even when no record names it.
func (ms *moves) involves(node string) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, in := range ms.m {
		if in.From == node || in.To == node {
			return true
		}
	}
	return false
}

// held adds to known the ids at node of segments no record here names
// that a move keeps: the target's copy until the switch-over, and the
// source's after it until the source lets it go (and, for the move of a
// redundant segment's home, from the moment the table names the target,
// before the switch is durable). Reconcile frees neither.
func (ms *moves) held(node string, known map[uint64]bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	for _, in := range ms.m {
		switch {
		case (in.Switched || in.switching) && in.From == node:
			known[in.FromID] = true
		case !in.Switched && !in.undoing && in.To == node:
			known[in.ToID] = true
		}
	}
}

// moveResult is what a move did.
type moveResult struct {
	rec      record // the segment's record after the move
	from     string
	fromTier poolv1.Tier
	bytes    int64
	rounds   int
	pause    time.Duration // from the seal to the switch-over announced
	to       string        // the new home's node when it is not rec.Home: a redundant segment's home moved
}

// Move moves a segment to another home while its clients use it.
func (s *service) Move(ctx context.Context, req *poolv1.MoveRequest) (*poolv1.MoveResponse, error) {
	c, err := s.caller(ctx)
	var resp *poolv1.MoveResponse
	if err == nil {
		resp, err = s.d.move(ctx, c, req)
	}
	if err != nil {
		s.d.refused("move", c, req.Id, req.Name, err)
		return nil, errs.ToStatus(err)
	}
	return resp, nil
}

// move runs a move for c, counts and logs it.
func (d *Daemon) move(ctx context.Context, c caller, req *poolv1.MoveRequest) (*poolv1.MoveResponse, error) {
	res, err := d.pool.move(ctx, c, req, d.moveTLS(), d.moveClients())
	d.metrics.moveDone(res, err)
	if err != nil {
		if res.from != "" { // it had begun: a home failed, not the request
			d.log.Warn("segment move failed; it stays where it was", "segment", res.rec.ID, "from", res.from, "bytes", res.bytes, "err", err)
		}
		return nil, err
	}
	d.log.Info("segment moved", "segment", res.rec.ID, "from", res.from, "to", cmp.Or(res.to, res.rec.Home),
		"bytes", res.bytes, "rounds", res.rounds, "pause", res.pause, "from-tier", tierName(res.fromTier), "tier", tierName(res.rec.Tier))
	seg := d.segmentProto(res.rec)
	if !isPeer(c) { // a peer's session holds no credentials for its own clients
		seg = d.forCaller(ctx, c, res.rec)
	}
	return &poolv1.MoveResponse{Segment: seg, FromNode: res.from,
		BytesCopied: uint64(res.bytes), Rounds: uint32(res.rounds), PauseUs: res.pause.Microseconds(), FromTier: res.fromTier}, nil
}

// moveTLS is how a move reaches the homes' data planes: ca verifies those
// that serve TLS, and byDefault is whether a home whose record predates
// the homes saying so does (as this node does: one configuration for the
// cluster).
type moveTLS struct {
	ca        []byte
	byDefault bool
}

// moveTLS is this daemon's moveTLS.
func (d *Daemon) moveTLS() moveTLS { return moveTLS{ca: d.data.ca, byDefault: d.data.server != nil} }

// moveClients is how a move reaches the clients of the segment it moves:
// through the daemon, which holds their sessions' credentials. Its zero
// value reaches none. Immutable.
type moveClients struct {
	// cred is the credential a home delegates to one of this daemon's
	// clients (Daemon.delegatedCred).
	cred func(ctx context.Context, home, client string) []byte
	// describe is the segment r as Stat describes it to client
	// (Daemon.forCaller).
	describe func(ctx context.Context, client string, r record) *poolv1.Segment
}

// moveClients is this daemon's moveClients.
func (d *Daemon) moveClients() moveClients {
	return moveClients{cred: d.delegatedCred, describe: func(ctx context.Context, id string, r record) *poolv1.Segment {
		return d.forCaller(ctx, caller{client: &client{id: id}}, r)
	}}
}

// move moves the segment req names to the home it names (or one placement
// picks): see docs/MOVE.md. clients is how it reaches the segment's
// clients.
func (p *core) move(ctx context.Context, c caller, req *poolv1.MoveRequest, tls moveTLS, clients moveClients) (moveResult, error) {
	r, err := p.moveSubject(c, req)
	if err != nil {
		return moveResult{}, err
	}
	if r.redundant() {
		return p.moveHome(ctx, r, req.Home, req.HomeId, tls) // movehome.go
	}
	if changesTier(&r, req.ToTier) {
		return p.moveTier(ctx, c, r, req, tls) // tiermove.go
	}
	src, err := p.homeSession(ctx, r.Home, "source")
	if err != nil {
		p.moving.end(r.ID)
		return moveResult{}, fmt.Errorf("move segment %d: %w", r.ID, err)
	}
	to, dst, err := p.moveTarget(ctx, req.ToNode, r)
	if err != nil {
		p.moving.end(r.ID)
		return moveResult{}, fmt.Errorf("move segment %d: %w", r.ID, err)
	}
	m := &mover{p: p, rec: r, src: src, dst: dst, to: to, tls: tls, chunk: moveChunk(r.Size), clients: clients, rate: p.moveRate}
	return m.run(ctx)
}

// moveSubject finds the segment req names, checks that c may move it and
// that it can move, and registers its move.
func (p *core) moveSubject(c caller, req *poolv1.MoveRequest) (record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var r *record
	var err error
	if req.Home != "" {
		if !isPeer(c) || c.id() != peerClientPrefix+req.Home {
			return record{}, fmt.Errorf("move segment %d of node %s: %w: only that node's daemon may ask by its id there, and the caller is %s", req.HomeId, req.Home, errs.ErrAccessDenied, c.ident)
		}
		// A home asks that the segment leave it (evacuation, rebalance);
		// where it goes is this daemon's placement's to pick, within the
		// rdma tier: a home may not send it to a node of its choosing,
		// nor into this host's memory.
		if req.ToNode != "" || req.ToTier != poolv1.Tier_TIER_UNSPECIFIED {
			return record{}, fmt.Errorf("move segment %d of node %s: %w: a home asks only that the segment move away from it, and this node's placement picks where; the request named node %q and tier %s: ask without them",
				req.HomeId, req.Home, errs.ErrAccessDenied, req.ToNode, tierName(req.ToTier))
		}
		for _, x := range p.segs {
			if slices.Contains(x.idsOn(req.Home), req.HomeId) {
				r = x
				break
			}
		}
		if r == nil {
			return record{}, fmt.Errorf("segment %d of node %s: %w: no record here names it", req.HomeId, req.Home, errs.ErrNotFound)
		}
	} else {
		if req.Id == 0 && req.Name == "" {
			return record{}, fmt.Errorf("%w: move needs a segment id or name", errs.ErrInvalid)
		}
		if r, err = p.lookup(req.Id, req.Name); err != nil {
			return record{}, err
		}
		if !mayUse(c, r) && !mayFree(c, r) {
			return record{}, fmt.Errorf("move segment %d: %w: only its owner, its attachers, identities granted the free right and administrators may move it, not %s", r.ID, errs.ErrAccessDenied, c.ident)
		}
	}
	check := movable(r, req.ToTier, p.cfg.Node)
	if r.redundant() && req.Home != "" { // a peer moves its home of the segment away
		check = homeMovable(r, req)
	}
	if check != nil {
		return record{}, check
	}
	if !p.moving.begin(r.ID) {
		return record{}, fmt.Errorf("move segment %d: %w; wait for it to end", r.ID, errMoveBusy)
	}
	return *r, nil
}

// movable checks that r can move live to tier (unspecified: its own).
func movable(r *record, tier poolv1.Tier, self string) error {
	if r.redundant() {
		return fmt.Errorf("move segment %d: %w: it is redundant (%s), with a home per copy or shard, so it does not move as a whole; a home moves live off a host that evacuates ('memctl drain NODE --evacuate' of that home's node), and a lost one is rebuilt elsewhere", r.ID, errs.ErrNotSupported, r.Redundancy.spec())
	}
	if changesTier(r, tier) {
		return tierMovable(r, tier)
	}
	switch {
	case r.Tier != poolv1.Tier_TIER_RDMA:
		return fmt.Errorf("move segment %d on the %s tier: %w: a load/store segment is this host's memory and moves only to the rdma tier (--tier rdma); allocate one on another load/store tier, copy, and free this one",
			r.ID, tierName(r.Tier), errs.ErrInvalid)
	case r.Home == "":
		return fmt.Errorf("move segment %d: %w: it is homed on this node (%s) for this node's own clients, and only segments placed on a peer move; allocate a new one and copy", r.ID, errs.ErrNotSupported, self)
	case r.Lost:
		return fmt.Errorf("move segment %d: its home %s is unreachable: %w", r.ID, r.Home, errs.ErrSegmentLost)
	}
	return nil
}

// homeSession is the session with node, an alive member; role names it in
// errors.
func (p *core) homeSession(ctx context.Context, node, role string) (*session.Conn, error) {
	if p.cl == nil {
		return nil, fmt.Errorf("%s node %q: this daemon gossips with nobody, so it reaches no other node: %w", role, node, errs.ErrHomeUnreachable)
	}
	m, ok := p.cl.Member(node)
	if !ok || m.State != cluster.StateAlive || m.Meta.GRPCAddr == "" {
		state := "unknown"
		if ok {
			state = cluster.StateString(m.State)
		}
		return nil, fmt.Errorf("%s node %q is %s: %w", role, node, state, errs.ErrHomeUnreachable)
	}
	return p.peers.get(ctx, m.Name, m.Meta.GRPCAddr)
}

// moveTarget is the node a segment moves to and the session with it: the
// node named, or, for "", one placement picks among the alive members
// other than this node and the segment's home (by capacity, then by the
// read latency this node measured of them, as for a new segment).
func (p *core) moveTarget(ctx context.Context, node string, r record) (string, *session.Conn, error) {
	if node == "" {
		p.mu.Lock()
		pl := plan{peers: p.peerFigures()}
		p.mu.Unlock()
		m, pc, err := p.pickPeer(ctx, r.Size, pl, r.Home)
		if err != nil {
			return "", nil, fmt.Errorf("no peer to move %d bytes to: %w", r.Size, err)
		}
		return m.Name, pc, nil
	}
	switch node {
	case r.Home:
		return "", nil, fmt.Errorf("%w: the segment lives on %s already; name another node with --to", errs.ErrInvalid, node)
	case p.cfg.Node:
		return "", nil, fmt.Errorf("%w: %s is this node, which places its clients' rdma segments on peers; name a peer with --to", errs.ErrInvalid, node)
	}
	m, ok := p.cl.Member(node)
	if !ok || m.State != cluster.StateAlive {
		return "", nil, unknownNode(node, m, ok, p.cl.Members())
	}
	if m.Meta.Draining {
		return "", nil, fmt.Errorf("node %q: %w: it is draining and takes no new segments ('memctl drain %s --undo' ends that); name another node or none", node, errs.ErrInvalid, node)
	}
	t, ok := m.Meta.Tier(tierName(poolv1.Tier_TIER_RDMA))
	if !ok || t.Free < r.Size {
		return "", nil, fmt.Errorf("node %q has %d bytes free on the rdma tier for a segment of %d bytes: %w", node, t.Free, r.Size, errs.ErrNoCapacity)
	}
	pc, err := p.peers.get(ctx, m.Name, m.Meta.GRPCAddr)
	return node, pc, err
}

// mover is one move under way at this origin.
type mover struct {
	p        *core
	rec      record // the segment as it was when the move began
	src, dst *session.Conn
	to       string
	tls      moveTLS
	in       intent
	chunk    int64 // bytes a tracked chunk
	res      moveResult
	copied   atomic.Int64 // bytes copied so far (res.bytes at the end)

	// The data-plane connections and regions of the copy.
	srcConn, dstConn rdma.Conn
	srcReg, dstReg   rdma.Region
	// local is this node's mapping of the segment when one end of the
	// copy is a load/store tier here (tiermove.go), and localKind how the
	// copy reaches the other end: OpWrite to the target, OpRead from the
	// source.
	local     []byte
	localKind rdma.OpKind
	// target is the target's copy as the source pushes to it: a move
	// within the rdma tier's with the credential delegated to the source
	// there; a rebuild's or a home move's without one (the source writes
	// as itself, rebuildFill.letPush).
	target *poolv1.SegmentHome

	// clients reaches the segment's clients (core.move).
	clients moveClients

	// rate paces the copy's bytes, and the pushes': a rebuild's
	// (rebuild.go) and a home move's Config.RebuildRate, a move's
	// Config.MoveRate; nil for the last round, which writes wait for. A
	// rebuild (rebuild.go) sets these others; a move leaves them zero:
	// read fills a batch's spans
	// instead of a read at the source (an erasure-coded shard decoded
	// from the others), in batches of at most batch bytes; dirty reports
	// the chunks changed since its last call instead of the source's
	// DIRTY.
	rate  *rateLimit
	read  func(ctx context.Context, buf []byte, batch [][2]int64) error
	batch int64
	dirty func(ctx context.Context) (bitmap []byte, n int, err error)
	// fill names a rebuild's fill on the source's PUSH steps
	// (rebuildFill.id).
	fill uint64
}

// run allocates the target, copies, and switches over; on a failure before
// the switch-over it leaves the segment at the source and frees the target.
// The switch-over is announced (Stat names the target) before its commit
// is durable, and is never undone after: a commit that fails is retried
// (commitLater), and a restart in between rolls it forward (rollForward).
func (m *mover) run(ctx context.Context) (res moveResult, err error) {
	p, r := m.p, m.rec
	m.res.from, m.res.rec, m.res.fromTier = r.Home, r, r.Tier
	defer func() {
		res = m.res
		res.bytes = m.copied.Load()
	}()
	// The intent before the target's allocation, and again with its id
	// there: a restart in between finds the target to check (resolve).
	m.in = intent{ID: r.ID, From: r.Home, FromID: r.HomeID, To: m.to}
	p.moving.set(m.in)
	if err := p.st.putIntent(m.in); err != nil {
		p.moving.end(r.ID)
		return m.res, fmt.Errorf("move segment %d: commit the move intent: %w", r.ID, err)
	}
	announced := false
	defer func() {
		if err != nil && !announced {
			// Not announced, but the source may have answered the SEAL
			// (the answer was lost, or the switch failed after it) and
			// handed the segment over, and clients written the copy:
			// resolve asks it, and rolls forward if its last chunks
			// reached the target, else undoes. A move rolled forward
			// happened: it succeeds.
			if p.abortMove(m.in, err) {
				p.mu.Lock()
				if cur, ok := p.segs[r.ID]; ok {
					m.res.rec = *cur
				}
				p.mu.Unlock()
				err = nil
			}
		}
	}()
	seg, err := m.allocTarget(ctx)
	if err != nil {
		return m.res, fmt.Errorf("move segment %d: alloc on %s: %w", r.ID, m.to, err)
	}
	// The intent with the target's copy commits while the copy runs, and
	// before the seal: until then a restart finds the intent without it,
	// and the source never sealed, as it did before the allocation's
	// answer. Submitted now, it commits before any later change of the
	// store (an abort's removal of the intent included); its commit is
	// awaited in the background, as the first waiter of a group commits
	// it.
	intentWait := p.st.submitIntent(m.in)
	intentDone := make(chan error, 1)
	go func() { intentDone <- intentWait() }()
	if err := m.authorize(ctx, r.Attached, seg.Id, false); err != nil {
		return m.res, err
	}
	if err := m.delegateSource(ctx, seg); err != nil {
		return m.res, err
	}
	m.warmCredentials(ctx, seg)
	if _, err := m.moveOut(ctx, poolv1.MoveOutPhase_MOVE_OUT_TRACK); err != nil {
		return m.res, err
	}
	if err := m.pushAll(ctx); err != nil {
		return m.res, err
	}
	if err := m.settlePushes(ctx); err != nil {
		return m.res, err
	}
	if err := <-intentDone; err != nil {
		return m.res, fmt.Errorf("move segment %d: commit the move intent: %w", r.ID, err)
	}
	sw := p.moving.sealing(r.ID)
	defer sw.end()
	next, err := m.sealAndSwitch(ctx, sw)
	if err != nil {
		return m.res, err
	}
	announced = true
	if crash := p.cfg.sim.announced; crash != nil && crash(r.ID) {
		return m.res, fmt.Errorf("move segment %d: %w: the test stopped the origin after the announcement", r.ID, errs.ErrUnavailable)
	}
	// In the background: describing the segment to a client may ask the
	// target for its credential, which the commit is not to wait for (a
	// client told MOVED meanwhile has its Stat answered the new home).
	p.peers.later(moveStepTimeout, func(ctx context.Context) { m.tellMoved(ctx, next) })
	cerr := p.commitSwitch(m.in)
	sw.end()
	if cerr != nil {
		p.log.Warn("moved segment: commit the switch-over; retrying (clients use the new home meanwhile)", "segment", r.ID, "err", cerr)
		p.commitLater(m.in)
	} else {
		p.finishMove(m.in)
	}
	m.syncAttachers()
	p.withdrawSource(m.in)
	return m.res, nil
}

// withdrawSource takes back, in the background, the source's right to
// write the target's copy of move in (delegateSource): the move is over.
func (p *core) withdrawSource(in intent) {
	p.peers.later(moveStepTimeout, func(ctx context.Context) {
		pc, err := p.homeSession(ctx, in.To, "target")
		if err == nil {
			err = authorizeAt(ctx, pc, in.ToID, moveSourceClient(in.From), true)
		}
		if err != nil {
			p.log.Warn("moved segment: its old home may still write it at the new one until this daemon's session there ends", "segment", in.ID, "err", err)
		}
	})
}

// rolledForward settles, once its intent is gone, a move that failed
// after its SEAL and rolled forward (resolve): as at the end of a move
// that succeeded, the target is told who may use the copy now (clients
// attached or detached during the move), retried until told
// (tellLater), and the source's right to write the copy is withdrawn.
func (p *core) rolledForward(in intent) {
	p.peers.later(moveStepTimeout, func(ctx context.Context) {
		if err := p.tellHomes(ctx, in.ID); err != nil {
			p.log.Warn("moved segment (rolled forward): its new home is not told yet who may use it; retrying", "segment", in.ID, "node", in.To, "err", err)
			p.tellLater(in.ID)
		}
	})
	p.withdrawSource(in)
}

// sealAndSwitch asks the source to seal the segment and push the last
// changed chunks, then switches the table over and announces the target
// to the Stats waiting meanwhile (moves.awaitSwitch). It notes the pause:
// from the seal to the announcement.
func (m *mover) sealAndSwitch(ctx context.Context, sw *pendingSwitch) (record, error) {
	last, err := m.moveOut(ctx, poolv1.MoveOutPhase_MOVE_OUT_SEAL)
	if err != nil {
		return record{}, err
	}
	answered := time.Now()
	if hook := m.p.cfg.sim.sealAnswered; hook != nil {
		if err := hook(m.rec.ID); err != nil {
			return record{}, err
		}
	}
	m.copied.Add(int64(last.PushedBytes))
	m.res.rounds++
	next, err := m.switchOver()
	if err != nil {
		return record{}, err
	}
	sw.announce(&next)
	m.res.pause = time.Duration(last.SealedUs)*time.Microsecond + time.Since(answered)
	return next, nil
}

// warmCredentials has the target delegate, before the seal, the
// credentials the segment's owner and attachers will reach it with: the
// Stat that names them the target at the switch-over finds them cached,
// rather than asking the target while their operations wait. One that
// fails is asked for again at that Stat. Each of those clients that got
// its credential is told, on its sessions, where the segment is going
// (SegmentEvents.moving: the target's node, data address, TLS name and
// the client's credential there, and the copy's id, epoch and key), so
// that it connects to the target's data plane during the copy rather than
// in the pause, and goes to the copy at once when the source hands the
// segment over (its MOVED with the move's token); a client that misses
// the notice connects at its first operation there, and follows the
// segment through its daemon, as without one.
func (m *mover) warmCredentials(ctx context.Context, seg *poolv1.Segment) {
	if m.clients.cred == nil {
		return
	}
	notices := map[string]*poolv1.SegmentEvents{}
	for _, client := range append([]string{m.rec.Owner}, m.rec.Attached...) {
		cred := m.clients.cred(ctx, m.to, client)
		if cred == nil {
			continue
		}
		mv := &poolv1.SegmentMoving{Id: m.rec.ID, Node: m.to, DataAddr: seg.DataAddr, DataCredential: cred,
			HomeId: seg.Id, Epoch: seg.Epoch, Key: seg.Key}
		if seg.DataTls {
			mv.DataTls, mv.DataTlsCa, mv.DataServerName = true, m.tls.ca, m.to
		}
		notices[client] = &poolv1.SegmentEvents{Moving: []*poolv1.SegmentMoving{mv}}
	}
	m.p.notify(notices)
}

// tellMoved sends each of the segment's clients its description at the
// new home, as Stat gives it that client, on its sessions
// (SegmentEvents.moved), once the switch-over is announced: the client's
// next operation on it goes to the new home without asking Stat, and an
// operation told MOVED before the notice arrived asks Stat as ever.
func (m *mover) tellMoved(ctx context.Context, r record) {
	if m.clients.describe == nil {
		return
	}
	notices := map[string]*poolv1.SegmentEvents{}
	for _, client := range append([]string{r.Owner}, r.Attached...) {
		notices[client] = &poolv1.SegmentEvents{Moved: []*poolv1.Segment{m.clients.describe(ctx, client, r)}}
	}
	m.p.notify(notices)
}

// moveSourceClient is the client id, among the origin's at the target,
// that the source of a move writes the target's copy as: the origin
// delegates a credential for it to the source and authorizes it on the
// copy for the move.
func moveSourceClient(source string) string { return moveSourcePrefix + source }

// moveSourcePrefix starts the client ids of move sources, which no session
// may take (bindSession): a client of this daemon bound to one would have
// its credential at a target delegated for its own identity, which
// withdraws the source's and cuts its pushes.
const moveSourcePrefix = "move-from-"

// delegateSource gets the credential the source writes the target's copy
// seg with (a credential the target delegates over this daemon's session
// for moveSourceClient, authorized on seg alone), and notes the target
// as the source is to push to it.
func (m *mover) delegateSource(ctx context.Context, seg *poolv1.Segment) error {
	client := moveSourceClient(m.rec.Home)
	d, err := callAt(ctx, m.dst, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.DelegateResponse, error) {
		return api.Delegate(ctx, &poolv1.DelegateRequest{ClientId: client, Identity: "cn:" + m.rec.Home})
	})
	if err != nil {
		return fmt.Errorf("move segment %d: a credential for the source %s on %s: %w", m.rec.ID, m.rec.Home, m.to, err)
	}
	if err := m.authorize(ctx, []string{client}, seg.Id, false); err != nil {
		return err
	}
	m.target = &poolv1.SegmentHome{Node: m.to, HomeId: seg.Id, DataAddr: seg.DataAddr, Key: seg.Key, Epoch: seg.Epoch,
		DataCredential: d.DataCredential, DataTls: seg.DataTls}
	return nil
}

// allocTarget allocates the segment's copy at the target and notes its id
// there in the move: from then on reconcile keeps it (moves.held); until
// then the allocation counts as pending there, so that reconcile does not
// take it for an orphan meanwhile.
func (m *mover) allocTarget(ctx context.Context) (*poolv1.Segment, error) {
	p := m.p
	defer p.placing(m.to)()
	seg, err := callAt(ctx, m.dst, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.Segment, error) {
		return api.Alloc(ctx, &poolv1.AllocRequest{Size: m.rec.Size, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: m.rec.Owner})
	})
	if err != nil {
		p.mayHoldOrphans(m.to, err) // the allocation may have been made, its answer lost
		return nil, err
	}
	m.in.ToID, m.in.ToAddr, m.in.ToEpoch, m.in.ToTLS = seg.Id, seg.DataAddr, seg.Epoch, seg.DataTls
	copy(m.in.ToKey[:], seg.Key)
	p.moving.set(m.in)
	return seg, nil
}

// callAt runs one call on the session with a home, within timeout.
func callAt[T any](ctx context.Context, pc *session.Conn, timeout time.Duration, call func(context.Context, poolv1.PoolClient) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := call(cctx, pc.API())
	return v, errs.FromStatus(err)
}

// moveOut runs one MoveOut step at the source; a SEAL pushes the last
// changed chunks to the target.
func (m *mover) moveOut(ctx context.Context, phase poolv1.MoveOutPhase) (*poolv1.MoveOutResponse, error) {
	req := &poolv1.MoveOutRequest{HomeId: m.rec.HomeID, Phase: phase, Chunk: m.chunk}
	if phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL {
		req.Target = m.target
	}
	return m.step(ctx, req, moveStepTimeout)
}

// push asks the source to write chunks to the target: all, or those
// changed since the last round, whose bytes then count against the rate
// (after the fact: only the source knows them before). It returns how
// many chunks it wrote.
func (m *mover) push(ctx context.Context, all bool) (int, error) {
	resp, err := m.pushRange(ctx, all, 0, 0)
	if err != nil {
		return 0, err
	}
	m.res.rounds++
	if !all {
		if err := m.rate.paid(ctx, int64(resp.PushedBytes)); err != nil {
			return 0, err
		}
	}
	return int(resp.DirtyChunks), nil
}

// pushAll asks the source to write the whole segment to the target: in
// one PUSH, or in slices under the rate when the copy is paced.
func (m *mover) pushAll(ctx context.Context) error {
	if m.rate != nil {
		return m.pushSliced(ctx)
	}
	_, err := m.push(ctx, true)
	return err
}

// pushSlice is the most bytes of one PUSH of a paced whole copy
// (pushSliced): small enough that the copy's progress shows and the rate
// holds within a fraction of a second, large enough that a step's round
// trip costs little beside its bytes.
const pushSlice = 32 << 20

// pushSliced asks the source to write the whole segment to the target,
// pushSlice bytes a step (fewer at a rate that goes less in a quarter
// second), each step's bytes waiting for their turn under the rate first.
func (m *mover) pushSliced(ctx context.Context) error {
	slice := int64(pushSlice)
	if m.rate != nil {
		slice = min(slice, int64(m.rate.perSec/4))
	}
	slice = max(slice/m.chunk, 1) * m.chunk
	for off := int64(0); off < m.rec.Size; off += slice {
		n := min(slice, m.rec.Size-off)
		if err := m.rate.wait(ctx, n); err != nil {
			return err
		}
		resp, err := m.pushRange(ctx, true, off, n)
		if err != nil {
			return err
		}
		if int64(resp.PushedBytes) > n { // a source that pushes the whole segment for any range
			break
		}
	}
	m.res.rounds++
	return nil
}

// pushRange asks the source for one PUSH: all the chunks of [off,
// off+n) (n 0: to the end), or those changed since the last round; it
// counts the bytes written.
func (m *mover) pushRange(ctx context.Context, all bool, off, n int64) (*poolv1.MoveOutResponse, error) {
	timeout := moveStepTimeout
	if all { // at the least rate a move expects
		bytes := n
		if bytes == 0 {
			bytes = m.rec.Size - off
		}
		timeout += time.Duration(bytes/moveMinRate) * time.Second
	}
	resp, err := m.step(ctx, &poolv1.MoveOutRequest{HomeId: m.rec.HomeID, Phase: poolv1.MoveOutPhase_MOVE_OUT_PUSH, Target: m.target, All: all, Offset: off, Length: n, Fill: m.fill}, timeout)
	if err != nil {
		return nil, err
	}
	m.copied.Add(int64(resp.PushedBytes))
	return resp, nil
}

// step runs one MoveOut request at the source, within timeout.
func (m *mover) step(ctx context.Context, req *poolv1.MoveOutRequest, timeout time.Duration) (*poolv1.MoveOutResponse, error) {
	resp, err := callAt(ctx, m.src, timeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.MoveOutResponse, error) {
		return api.MoveOut(ctx, req)
	})
	if err != nil {
		return nil, fmt.Errorf("move segment %d: %s at the source %s: %w", m.rec.ID, req.Phase, m.rec.Home, err)
	}
	return resp, nil
}

// moveOutAt asks pc's node for one MoveOut step on its segment id.
func moveOutAt(ctx context.Context, pc *session.Conn, id uint64, phase poolv1.MoveOutPhase, chunk int64) (*poolv1.MoveOutResponse, error) {
	return moveOutReq(ctx, pc, &poolv1.MoveOutRequest{HomeId: id, Phase: phase, Chunk: chunk})
}

// moveOutReq asks pc's node for the MoveOut step req.
func moveOutReq(ctx context.Context, pc *session.Conn, req *poolv1.MoveOutRequest) (*poolv1.MoveOutResponse, error) {
	return callAt(ctx, pc, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.MoveOutResponse, error) {
		return api.MoveOut(ctx, req)
	})
}

// authorize tells the target that the clients may (or, with withdraw, may
// no longer) use its copy id, as they may the segment.
func (m *mover) authorize(ctx context.Context, clients []string, id uint64, withdraw bool) error {
	for _, a := range clients {
		if err := authorizeAt(ctx, m.dst, id, a, withdraw); err != nil {
			return fmt.Errorf("move segment %d: authorize client %q on %s: %w", m.rec.ID, a, m.to, err)
		}
	}
	return nil
}

// authorizeAt tells the node of pc that client may (or, with withdraw,
// may no longer) use its segment id.
func authorizeAt(ctx context.Context, pc *session.Conn, id uint64, client string, withdraw bool) error {
	_, err := callAt(ctx, pc, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.AuthorizeResponse, error) {
		return api.Authorize(ctx, &poolv1.AuthorizeRequest{Ids: []uint64{id}, ClientId: client, Withdraw: withdraw})
	})
	return err
}

// connect dials the source's and the target's data planes with this
// daemon's credentials there: it owns both segments.
func (m *mover) connect(ctx context.Context, seg *poolv1.Segment) error {
	r := m.rec
	srcTLS := m.tls.byDefault
	if r.DataTLS != nil {
		srcTLS = *r.DataTLS
	}
	var err error
	if m.srcConn, err = m.dial(ctx, r.Home, r.DataAddr, srcTLS, m.src); err != nil {
		return err
	}
	if m.dstConn, err = m.dial(ctx, m.to, seg.DataAddr, seg.DataTls, m.dst); err != nil {
		m.srcConn.Close()
		return err
	}
	var key rdma.Key
	copy(key[:], seg.Key)
	m.srcReg = rdma.Region{Segment: r.HomeID, Key: r.Key, Epoch: r.Epoch}
	m.dstReg = rdma.Region{Segment: seg.Id, Key: key, Epoch: seg.Epoch}
	return nil
}

// dial connects to node's data plane at addr, one connection (the copy's
// writes keep their order), over TLS when the node serves it.
func (m *mover) dial(ctx context.Context, node, addr string, useTLS bool, pc *session.Conn) (rdma.Conn, error) {
	c, err := dialHome(ctx, node, addr, useTLS, m.tls.ca, pc.DataCredential())
	if err != nil {
		return nil, fmt.Errorf("move segment %d: %w", m.rec.ID, err)
	}
	return c, nil
}

// copyAll copies the whole segment.
func (m *mover) copyAll(ctx context.Context) error {
	all, _ := rangeChunks(0, m.rec.Size, m.chunk)
	if err := m.copyChunks(ctx, all); err != nil {
		return err
	}
	m.res.rounds++
	return nil
}

// settle copies the chunks written since the last round while each round
// leaves fewer and more than moveSettled remain, at most moveMaxRounds
// times; it returns the chunks of the last report, not copied yet.
func (m *mover) settle(ctx context.Context) ([]byte, error) {
	prev := -1
	for range moveMaxRounds {
		dirty, n, err := m.changed(ctx)
		if err != nil {
			return nil, err
		}
		if n <= moveSettled || prev >= 0 && n >= prev {
			return dirty, nil
		}
		if err := m.copyChunks(ctx, dirty); err != nil {
			return nil, err
		}
		m.res.rounds++
		prev = n
	}
	dirty, _, err := m.changed(ctx)
	return dirty, err
}

// changed returns the chunks changed since the last call, and how many.
func (m *mover) changed(ctx context.Context) ([]byte, int, error) {
	if m.dirty != nil {
		return m.dirty(ctx)
	}
	resp, err := m.moveOut(ctx, poolv1.MoveOutPhase_MOVE_OUT_DIRTY)
	if err != nil {
		return nil, 0, err
	}
	return resp.Dirty, int(resp.DirtyChunks), nil
}

// batchBytes is the most bytes one batch of the copy moves.
func (m *mover) batchBytes() int64 {
	if m.batch > 0 {
		return m.batch
	}
	return moveBatch
}

// settlePushes asks the source to push the chunks written since the last round
// while each round leaves fewer and more than moveSettled were written, at
// most moveMaxRounds times; the seal's round pushes the rest.
func (m *mover) settlePushes(ctx context.Context) error {
	prev := -1
	for range moveMaxRounds {
		n, err := m.push(ctx, false)
		if err != nil {
			return err
		}
		if n <= moveSettled || prev >= 0 && n >= prev {
			return nil
		}
		prev = n
	}
	return nil
}

// copyChunks copies the chunks set in bitmap: runs of them, cut into
// spans of at most moveRead bytes, in batches (copyBatch), moveInflight
// batches at a time; the first failure ends it.
func (m *mover) copyChunks(ctx context.Context, bitmap []byte) error {
	if m.local != nil {
		return m.copyLocal(ctx, bitmap)
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	work := make(chan [][2]int64)
	var wg sync.WaitGroup
	for range moveInflight {
		wg.Go(func() {
			buf := make([]byte, m.batchBytes())
			for batch := range work {
				if err := m.copyBatch(ctx, buf, batch); err != nil {
					cancel(err)
				}
			}
		})
	}
	var batch [][2]int64
	var n int64
	send := func() bool {
		select {
		case work <- batch:
		case <-ctx.Done():
			return false
		}
		batch, n = nil, 0
		return true
	}
	for span := range spansOf(bitmap, m.chunk, m.rec.Size, min(moveRead, m.batchBytes())) {
		if len(batch) == moveBatchOps || n+span[1]-span[0] > m.batchBytes() {
			if !send() {
				break
			}
		}
		batch = append(batch, span)
		n += span[1] - span[0]
	}
	if len(batch) > 0 {
		send()
	}
	close(work)
	wg.Wait()
	if err := context.Cause(ctx); err != nil {
		return fmt.Errorf("move segment %d: %w: copy from %s to %s: %w", m.rec.ID, errMoveHome, m.rec.Home, m.to, err)
	}
	return nil
}

// copyBatch copies the spans of one batch, source to target: their reads
// in one Do, into buf, then their writes in one Do.
func (m *mover) copyBatch(ctx context.Context, buf []byte, batch [][2]int64) error {
	if ctx.Err() != nil {
		return nil
	}
	var n int64
	for _, span := range batch {
		n += span[1] - span[0]
	}
	ptrs := spanOps(rdma.OpRead, m.srcReg, batch, buf)
	if err := m.rate.wait(ctx, n); err != nil {
		return err
	}
	var err error
	if m.read != nil {
		err = m.read(ctx, buf[:n], batch)
	} else {
		err = m.srcConn.Do(ctx, ptrs...)
	}
	if err != nil {
		return fmt.Errorf("read %d spans (%d bytes) from %d: %w", len(batch), n, batch[0][0], err)
	}
	for _, op := range ptrs {
		op.Kind, op.Region = rdma.OpWrite, m.dstReg
	}
	if err := m.dstConn.Do(ctx, ptrs...); err != nil {
		return fmt.Errorf("write %d spans (%d bytes) from %d: %w", len(batch), n, batch[0][0], err)
	}
	m.copied.Add(n)
	return nil
}

// spans yields the byte ranges [start, end) of the runs of chunks (of
// chunk bytes) set in bitmap, cut at size and into pieces of at most
// moveRead bytes.
func spans(bitmap []byte, chunk, size int64) func(func([2]int64) bool) {
	return spansOf(bitmap, chunk, size, moveRead)
}

// spansOf is spans in pieces of at most most bytes.
func spansOf(bitmap []byte, chunk, size, most int64) func(func([2]int64) bool) {
	return func(yield func([2]int64) bool) {
		start := int64(-1)
		flush := func(end int64) bool {
			for start < end {
				e := min(start+most, end)
				if !yield([2]int64{start, e}) {
					return false
				}
				start = e
			}
			start = -1
			return true
		}
		for i, b := range bitmap {
			for bit := range 8 {
				off := (int64(i)*8 + int64(bit)) * chunk
				if off >= size {
					break
				}
				switch set := b&(1<<bit) != 0; {
				case set && start < 0:
					start = off
				case !set && start >= 0:
					if !flush(off) {
						return
					}
				}
			}
		}
		if start >= 0 { // the run ends where the bitmap does
			flush(min(size, int64(len(bitmap))*8*chunk))
		}
	}
}

// orBitmap sets in dst every bit set in src (dst is as long as any report).
func orBitmap(dst, src []byte) {
	for i := range min(len(dst), len(src)) {
		dst[i] |= src[i]
	}
}

// switchOver switches the table's record over to the target, once the
// source answered the SEAL (the target's copy is whole and the source
// takes no write): Stat names the target from then on, before the commit
// (commitSwitch). The record may have changed meanwhile (attachers); it
// must still be the segment at the source. It returns the record.
func (m *mover) switchOver() (record, error) {
	p := m.p
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, ok := p.segs[m.rec.ID]
	if !ok || cur.Home != m.rec.Home || cur.HomeID != m.rec.HomeID {
		return record{}, fmt.Errorf("move segment %d: %w: it was freed during the move", m.rec.ID, errs.ErrNotFound)
	}
	*cur = m.in.switched(*cur)
	m.res.rec = *cur
	m.in.Switched = true
	p.moving.set(m.in) // reconcile keeps the source's segment until it COMMITs
	return *cur, nil
}

// commitSwitch commits the switch-over of move in as the table holds it:
// the record that names the target, with whatever changed since, and the
// intent marked switched. The commit is queued under p.mu, so that it
// commits before any later change, and runs outside it, so that
// concurrent switch-overs share one transaction (storeFile.submit) and
// Stat, Alloc and other moves go on during its fsync. A segment freed
// since has nothing to commit: its removal was.
func (p *core) commitSwitch(in intent) error {
	p.mu.Lock()
	r, ok := p.segs[in.ID]
	if !ok || r.Home != in.To || r.HomeID != in.ToID {
		p.mu.Unlock()
		return nil
	}
	next := *r
	wait := p.st.switchMove(&next, in)
	p.mu.Unlock()
	if err := wait(); err != nil {
		return fmt.Errorf("move segment %d: commit the switch-over: %w", in.ID, err)
	}
	return nil
}

// commitLater retries commitSwitch in the background, backing off from a
// second to 30 s, then finishes the move (a restarted daemon rolls it
// forward from the intent instead).
func (p *core) commitLater(in intent) {
	p.retryLater(func(context.Context) error {
		if err := p.commitSwitch(in); err != nil {
			p.log.Debug("commit a switch-over: retrying", "segment", in.ID, "err", err)
			return err
		}
		p.finishMove(in)
		return nil
	})
}

// rollForward decides, for a restarted origin, a move left before its
// switch-over was committed: it may have been announced, and clients may
// have written the target's copy since. It asks the source (STATUS):
// once a SEAL pushed the last chunks to the target and answered, the
// target's copy is whole and the source took no write since (it is
// sealed): the move rolls forward, switched over and committed here
// (true). A source that is not sealed, holds the segment no more, or
// was cut short in the SEAL's push (sealed, no push noted, writes not
// tracked: it restarted) never answered the SEAL, so nobody was told of
// the target: the move is undone (false). A source still in its SEAL is
// asked again later (an error).
func (p *core) rollForward(ctx context.Context, in intent) (bool, error) {
	p.mu.Lock()
	r, ok := p.segs[in.ID]
	named := ok && r.Home == in.To && r.HomeID == in.ToID
	p.mu.Unlock()
	switch {
	case !ok:
		return false, nil // freed: its removal was committed
	case named: // rolled forward by an earlier try, whose commit failed
		return true, p.commitSwitch(in)
	}
	src, err := p.homeSession(ctx, in.From, "source")
	var st *poolv1.MoveOutResponse
	if err == nil {
		st, err = callAt(ctx, src, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.MoveOutResponse, error) {
			return api.MoveOut(ctx, &poolv1.MoveOutRequest{HomeId: in.FromID, Phase: poolv1.MoveOutPhase_MOVE_OUT_STATUS,
				Target: &poolv1.SegmentHome{Node: in.To, HomeId: in.ToID}})
		})
	}
	switch {
	case errors.Is(err, errs.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("ask the source %s where the switch-over stands: %w", in.From, err)
	case !st.Sealed || !st.Pushed && !st.Tracked:
		return false, nil
	case !st.Pushed:
		return false, fmt.Errorf("the source %s is sealed and pushing the last chunks: %w", in.From, errMoveHome)
	}
	p.mu.Lock()
	r, ok = p.segs[in.ID]
	atSource := ok && r.Home == in.From && r.HomeID == in.FromID
	atTarget := ok && r.Home == in.To && r.HomeID == in.ToID
	if atSource {
		*r = in.switched(*r)
		in.Switched = true
		p.moving.set(in)
	}
	p.mu.Unlock()
	if !atSource && !atTarget {
		return false, nil // freed, or at neither home: nothing to roll forward
	}
	if err := p.commitSwitch(in); err != nil {
		return false, err
	}
	p.log.Info("a move left at its switch-over rolled forward: the source had pushed its last chunks to the target", "segment", in.ID, "from", in.From, "to", in.To)
	return true, nil
}

// finishMove tells the source of a switched move to let the segment go and
// forgets the intent; when the source cannot be told now, it is told later
// (resolveLater).
//
// The intent goes in the background once the source has answered: the
// move is done then, and a restart that still finds the intent only asks
// the source again, which holds the segment no more.
func (p *core) finishMove(in intent) {
	ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
	defer cancel()
	if err := p.resolveHomes(ctx, in); err != nil {
		p.log.Warn("moved segment: its old home is to let it go; retrying", "segment", in.ID, "node", in.From, "err", err)
		p.resolveLater(in)
		return
	}
	p.peers.later(moveStepTimeout, func(context.Context) {
		if err := p.st.deleteIntent(in.ID); err != nil {
			p.log.Warn("moved segment: remove the move intent; retrying", "segment", in.ID, "err", err)
			p.resolveLater(in)
			return
		}
		p.moving.end(in.ID)
	})
}

// abortMove undoes a move that failed before its switch-over: the source
// unseals and stops tracking, the target's copy is freed, the intent goes;
// or, when the source handed the segment over, rolls it forward (resolve),
// and reports true. What cannot be done now is retried (resolveLater).
func (p *core) abortMove(in intent, why error) bool {
	ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
	defer cancel()
	fwd, err := p.resolve(ctx, in)
	if err != nil {
		p.log.Warn("failed move: the old home is to unseal the segment; retrying", "segment", in.ID, "node", in.From, "move-err", why, "err", err)
		p.resolveLater(in)
		return false
	}
	p.moving.end(in.ID)
	if fwd {
		p.rolledForward(in)
	}
	return fwd
}

// resolve finishes a move intent: a switched one by the source's COMMIT,
// another by the source's ABORT and a free of the target's copy, unless it
// may have been announced and rolls forward (rollForward); then the intent
// goes. A source or target that holds the segment no more has nothing
// left to do. The source refuses the ABORT once it handed the segment
// over (errHandedOver: a SEAL that completed after the origin gave up on
// it, and after its STATUS): the move then rolls forward. fwd reports a
// move that rolled forward here. The move of a redundant segment's home
// finishes as finishHomeMove says.
func (p *core) resolve(ctx context.Context, in intent) (fwd bool, err error) {
	if p.isHomeMove(in) {
		return false, p.finishHomeMove(ctx, in) // movehome.go
	}
	mayForward := !in.Switched && in.ToAddr != "" // it may have been announced
	if mayForward {
		if fwd, err = p.rollForward(ctx, in); err != nil {
			return false, err
		}
		in.Switched = fwd
	}
	err = p.resolveHomes(ctx, in)
	if mayForward && !in.Switched && errors.Is(err, errs.ErrInUse) {
		if fwd, err = p.rollForward(ctx, in); err != nil {
			return false, err
		}
		if !fwd {
			return false, fmt.Errorf("the source %s refused to undo the move, and no handover is noted there: %w", in.From, errMoveHome)
		}
		in.Switched = true
		err = p.resolveHomes(ctx, in)
	}
	if err != nil {
		return false, err
	}
	if err := p.st.deleteIntent(in.ID); err != nil {
		return false, fmt.Errorf("remove the move intent: %w", err)
	}
	return fwd, nil
}

// resolveHomes is resolve but for the intent: the source's COMMIT or
// ABORT, and the target's copy of an undone move freed.
func (p *core) resolveHomes(ctx context.Context, in intent) error {
	phase := poolv1.MoveOutPhase_MOVE_OUT_ABORT
	if in.Switched {
		phase = poolv1.MoveOutPhase_MOVE_OUT_COMMIT
	}
	src, err := p.homeSession(ctx, in.From, "source")
	if err == nil {
		// The ABORT of a move that may roll forward (resolve) names the
		// target: the source refuses it once it handed the segment over
		// to that copy (errHandedOver).
		req := &poolv1.MoveOutRequest{HomeId: in.FromID, Phase: phase}
		if !in.Switched && in.ToAddr != "" {
			req.Target = &poolv1.SegmentHome{Node: in.To, HomeId: in.ToID}
		}
		_, err = moveOutReq(ctx, src, req)
	}
	if err != nil && !errors.Is(err, errs.ErrNotFound) {
		return fmt.Errorf("%s at %s: %w", phase, in.From, err)
	}
	switch {
	case !in.Switched && in.ToID != 0:
		in.undoing = true // the target's copy is an orphan now
		p.moving.set(in)
		p.freeLaterAt(in.To, in.ToID)
	case !in.Switched && in.To != p.cfg.Node: // a promotion's target is this node's memory, freed by the mover
		// The target's allocation may have happened, unrecorded: the
		// target is asked what it holds for this node, and frees what no
		// record names (reconcile; the intent makes it ask).
		if _, ok := p.reconcile(ctx, in.To); !ok {
			return fmt.Errorf("ask %s for a copy it may hold: %w", in.To, errMoveHome)
		}
	}
	return nil
}

// freeLaterAt frees segment id at node in the background (a session with
// node is dialed if there is none: a restarted daemon undoing a move has
// none yet); a node that cannot be asked is asked again what it holds once
// it answers (mayHoldOrphans), and frees it then.
func (p *core) freeLaterAt(node string, id uint64) {
	p.peers.later(moveStepTimeout, func(ctx context.Context) {
		pc, err := p.homeSession(ctx, node, "target")
		if err == nil {
			err = freeOn(ctx, pc, id)
		}
		if err != nil {
			p.log.Info("the copy of a failed move is not freed yet; its node is asked again once it answers", "node", node, "segment", id, "err", err)
			p.mayHoldOrphans(node, nil)
		}
	})
}

// resolveLater retries resolve in the background, backing off from a
// second to 30 s, until it succeeds or the daemon closes (a restarted
// daemon resumes from the intent).
func (p *core) resolveLater(in intent) {
	p.moving.set(in)
	p.retryLater(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, moveStepTimeout)
		defer cancel()
		fwd, err := p.resolve(ctx, in)
		if err != nil {
			p.log.Debug("finish a move: retrying", "segment", in.ID, "err", err)
			return err
		}
		p.log.Info("move finished after a retry", "segment", in.ID, "from", in.From, "to", in.To)
		p.moving.end(in.ID)
		if fwd {
			p.rolledForward(in)
		}
		return nil
	})
}

// retryLater runs try in the background, first after a second and then
// backing off to 30 s, until it succeeds or the daemon closes.
func (p *core) retryLater(try func(ctx context.Context) error) {
	p.peers.later(0, func(ctx context.Context) {
		for wait := time.Second; ; wait = min(2*wait, 30*time.Second) {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			if try(ctx) == nil {
				return
			}
		}
	})
}

// loadMoves takes the moves a previous run of this daemon left (their
// intents in the store) at start, before any peer is asked what it holds:
// a move whose record names the target switched over; any other is to be
// rolled forward or undone (resolve; one whose segment was freed as its
// intent says). resumeMoves finishes them.
func (p *core) loadMoves() error {
	ins, err := p.st.intents()
	if err != nil {
		return fmt.Errorf("the moves the last run left: %w", err)
	}
	for _, in := range ins {
		if r, ok := p.segs[in.ID]; ok {
			// The record says: an intent marked switched whose record
			// names the source again lost a race with a change to the
			// record (switchOver), and its move is undone. A redundant
			// segment's record names the target among its homes, lost
			// too: the leaving home is kept then (keepLeaving), or let
			// go, but never freed as no record's.
			in.Switched = in.switchedIn(r)
		}
		p.moving.set(in)
		p.leftMoves = append(p.leftMoves, in)
	}
	return nil
}

// resumeMoves finishes, in the background, the moves loadMoves found.
func (p *core) resumeMoves() {
	for _, in := range p.leftMoves {
		p.log.Info("finishing a move the last run left", "segment", in.ID, "from", in.From, "to", in.To, "switched", in.Switched)
		p.resolveLater(in)
	}
	p.leftMoves = nil
}

func newMoveMetrics(f promFactory) *copyMetrics {
	return newCopyMetrics(f, "moves_total", "Live moves of segments this daemon drove, by result (ok, failed).",
		"move_bytes_total", "Bytes copied by live moves, the re-copied dirty chunks included.",
		"move_pause_seconds", "Switch-over pause of each live move: from the seal of the source (writes wait) to the announcement of the new home.",
		// 100µs to 6.5 s.
		prometheus.ExponentialBuckets(100e-6, 3, 11))
}

// moveDone counts one Move call's outcome.
func (m *metrics) moveDone(res moveResult, err error) {
	if m == nil {
		return
	}
	m.moves.bytes.Add(float64(res.bytes))
	if err != nil {
		m.moves.runs.WithLabelValues("failed").Inc()
		return
	}
	m.moves.runs.WithLabelValues("ok").Inc()
	m.moves.took.Observe(res.pause.Seconds())
}
