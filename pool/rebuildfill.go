// This file holds the copy of a rebuild (rebuild.go): the new home of a
// replicated segment is filled by its primary, which pushes its bytes to
// it (movepush.go), that of an erasure-coded segment's shard decoded here
// from k surviving shards and written to it, both with the live move's
// copy-and-switch (move.go) while clients go on writing. The move of a
// home that leaves its host (movehome.go) fills its replacement the same
// way, pushed by the leaving home itself when it is a shard.

package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/reedsolomon"
	"golang.org/x/sync/errgroup"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
)

// rebuildFill fills one new home. Not safe for concurrent use, but for
// the mover's copy workers, which call decode in parallel.
type rebuildFill struct {
	p      *core
	r      record // the segment as the rebuild began
	i      int    // the index of the home rebuilt
	target homeRef
	m      *mover
	// id names this fill on its steps at the survivors (MoveOutRequest's
	// fill, nonzero): a fill of the same target again after a failure is
	// another, so a late step of the undone one is refused there.
	id uint64
	// moving: home i is alive and leaves (a move of it, movehome.go),
	// not lost: it is tracked and, a shard, copied from.
	moving bool
	// progress publishes the bytes copied so far; false when the fill is
	// moot (the record changed under it).
	progress func(n int64) bool
	// beforeSeal, if set, runs just before the writers are sealed.
	beforeSeal func()
	// ownSeal: the writers were not sealed (moves.mightSeal) before this
	// fill sealed them, so an ABORT of it at every tracked home leaves
	// none sealed.
	ownSeal bool

	// tracked are the surviving homes whose changes the copy follows:
	// the primary of replicas (every write lands there first), every OK
	// shard of an erasure-coded segment (a parity shard changes by the
	// data homes' deltas). The writers among them are sealed at the
	// switch-over; the others only report their last changes.
	tracked []rebuildPeer
	// sources are the k shards an erasure-coded shard is decoded from.
	sources []rebuildPeer
	// spares are the other surviving shards of a lost data shard's
	// stripe, read with the sources to check each decode (decode);
	// one that fails a read, or is late for a few batches in a row
	// (readShards), is down for the rest of the fill (the decode goes on
	// unchecked by it: its home is soon lost, or slow, and a rebuild must
	// not wait on more homes than it needs).
	spares []rebuildPeer
	down   []atomic.Bool
	late   []atomic.Int32 // per spare, the batches in a row it was late for
	// suspect are the chunks whose decode a spare disagreed with before
	// the seal; the sealed last round decodes them again.
	suspectMu sync.Mutex
	suspect   []byte
	// sealed: the writers are sealed, no write is in flight, so a parity
	// shard that still disagrees is out of line with the data shards for
	// good: its bytes as the decode makes them wait in repairs (by
	// position in sources, then spares) for repair, which writes them
	// (repaired counts their bytes), or it is outOfLine, marked lost by
	// repair (its repair failed, or would hold more than maxRepair).
	sealed    bool
	repairMu  sync.Mutex
	repairs   [][]repairSpan
	outOfLine []atomic.Bool
	repaired  atomic.Int64
	// fence raises the epoch of the homes at the given positions in
	// sources, then spares, and returns their new epochs (fenceHomes).
	fence func(ctx context.Context, pos []int) ([]uint64, error)
	// dirty are the chunks changed since the last round decoded.
	dirty []byte
	// pusher is the home that pushes its bytes to the target (f.m.target)
	// itself, one of tracked; nil: they are decoded here from sources.
	pusher *rebuildPeer
	enc    reedsolomon.Encoder
	bufs   sync.Pool // *[]byte of m.batch bytes, one per source and batch
}

// repairSpan is bytes a parity shard is to hold at off.
type repairSpan struct {
	off int64
	b   []byte
}

// maxRepair bounds the bytes a fill keeps to bring one parity shard in
// line: one that disagrees with the data shards in more is rebuilt
// instead (marked lost), not held in memory.
const maxRepair = 16 << 20

// rebuildPeer is one surviving home of the rebuild.
type rebuildPeer struct {
	idx    int
	home   homeRef
	pc     *session.Conn
	writer bool        // clients' writes land here: sealed at the switch-over
	conn   rdma.Conn   // decoded sources only
	reg    rdma.Region // decoded sources only
}

// newFill connects to the target and the survivors of r for the rebuild of
// home i at target.
func (rb *rebuilder) newFill(ctx context.Context, r record, i int, target homeRef) (*rebuildFill, error) {
	f, err := rb.p.newFill(ctx, r, i, target, rb.tls, rb.rate, false)
	if err == nil {
		f.progress = func(n int64) bool { return rb.p.setRebuilt(r.ID, i, target, n) }
	}
	return f, err
}

// newFill connects to the target and to the homes of r the fill of home
// i's place at target reads and tracks: the survivors (a rebuild), or,
// with moving, those and home i, which is alive and leaves. The copy
// goes at most rate (nil: unlimited).
func (p *core) newFill(ctx context.Context, r record, i int, target homeRef, tls moveTLS, rate *rateLimit, moving bool) (*rebuildFill, error) {
	size := r.shardSize()
	f := &rebuildFill{p: p, r: r, i: i, target: target, moving: moving, id: rand.Uint64() | 1}
	what := fmt.Sprintf("rebuild segment %d", r.ID)
	if moving {
		what = fmt.Sprintf("move a home of segment %d", r.ID)
	}
	dst, err := p.homeSession(ctx, target.Node, "rebuild target")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	f.m = &mover{p: p, rec: record{ID: r.ID, Size: size}, dst: dst, to: target.Node, tls: tls, chunk: moveChunk(size), rate: rate, fill: f.id}
	f.m.dirty = f.changed
	k := r.Redundancy.Data
	if f.tracked, err = p.okPeers(ctx, r, func(j int) bool { return (j != i || moving) && (r.Redundancy.Replicas == 0 || j == 0) }); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	// The source: the primary, or a moving shard itself, which pushes;
	// or the first k OK shards, decoded here (data shards first: their
	// bytes are the segment's, so a lost parity shard needs no decode of
	// data).
	from := f.tracked
	if k > 0 && moving {
		from = slices.DeleteFunc(slices.Clone(f.tracked), func(s rebuildPeer) bool { return s.idx != i })
	}
	n := 1
	if k > 0 && !moving {
		n = k
	}
	if len(from) < n {
		return nil, fmt.Errorf("%s: %w: %d homes to read from, and it needs %d", what, errs.ErrSegmentLost, len(from), n)
	}
	f.m.rec.Home, f.m.rec.HomeID = from[0].home.Node, from[0].home.HomeID // the pushing source; named in the copy's errors
	if n == 1 {
		f.pusher, f.m.src = &from[0], from[0].pc
		if err := f.letPush(ctx); err != nil {
			return nil, err
		}
		return f, nil
	}
	f.m.read = f.decode
	if err = f.dialShards(ctx, from, moveBatch/int64(k)); err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if f.m.dstConn, err = f.m.dial(ctx, target.Node, target.DataAddr, target.DataTLS, dst); err != nil {
		f.close()
		return nil, err
	}
	f.m.dstReg = homeRegion(target)
	if i < k {
		// A data shard's new home takes the fill's writes only. One a
		// switch-over left forwarding when it failed after telling it to
		// (switchOK) would send the parity shards each of them as a delta
		// from bytes the stripe may not hold, and take clients' writes.
		if f.m.dstReg.Epoch, err = f.holdTarget(ctx, nil); err != nil {
			f.close()
			return nil, fmt.Errorf("%s: have the new home on %s take the fill's writes only: %w", what, target.Node, err)
		}
	}
	return f, nil
}

// dialShards readies the decode of shard f.i of f.r from the surviving
// shards from (data shards first) in batches of up to batch bytes: the
// first k are its sources; for a data shard the others are spares, every
// one of them, since a data home that died between sending a write's
// parity deltas to one parity shard and to another left them disagreeing
// about that write, and the decode must settle which outcome holds. On an
// error the connections made are closed.
func (f *rebuildFill) dialShards(ctx context.Context, from []rebuildPeer, batch int64) (err error) {
	k, m := f.r.Redundancy.Data, f.r.Redundancy.Parity
	if f.enc, err = reedsolomon.New(k, m); err != nil {
		return fmt.Errorf("%w: erasure code %d+%d: %v", errs.ErrInvalid, k, m, err)
	}
	f.m.batch = max(moveChunkMin, batch/moveChunkMin*moveChunkMin)
	f.bufs.New = func() any { b := make([]byte, f.m.batch); return &b }
	read := from[:k]
	if f.i < k {
		read = from
	}
	for j, s := range read {
		if s.conn, err = f.m.dial(ctx, s.home.Node, s.home.DataAddr, s.home.DataTLS, s.pc); err != nil {
			f.close()
			return err
		}
		s.reg = homeRegion(s.home)
		if j < k {
			f.sources = append(f.sources, s)
		} else {
			f.spares = append(f.spares, s)
		}
	}
	f.down = make([]atomic.Bool, len(f.spares))
	f.late = make([]atomic.Int32, len(f.spares))
	f.repairs = make([][]repairSpan, len(read))
	f.outOfLine = make([]atomic.Bool, len(read))
	f.fence = f.fenceHomes
	return nil
}

// okPeers are the OK homes of r whose index keep selects, each with a
// session with its node; writer marks the homes clients write (the
// primary, the data shards).
func (p *core) okPeers(ctx context.Context, r record, keep func(j int) bool) ([]rebuildPeer, error) {
	var out []rebuildPeer
	k := r.Redundancy.Data
	for j, h := range r.Homes {
		if h.State != poolv1.HomeState_HOME_STATE_OK || !keep(j) {
			continue
		}
		pc, err := p.homeSession(ctx, h.Node, "home")
		if err != nil {
			return nil, err
		}
		out = append(out, rebuildPeer{idx: j, home: h, pc: pc, writer: k == 0 || j < k})
	}
	return out, nil
}

// letPush makes the pushing source a writer of the target's copy
// (holdTarget), which it writes as itself: a rebuild's target is in the
// record, and replicate makes its owner's clients only read it (a
// credential delegated to the source for it, as a single home's move has,
// would be refused then), and a copy's only writers are the homes that
// forward to it. The switch's replicate sets whom it takes writes from.
func (f *rebuildFill) letPush(ctx context.Context) error {
	t := f.target
	epoch, err := f.holdTarget(ctx, []string{f.pusher.home.Node})
	if err != nil {
		return fmt.Errorf("fill a home of segment %d: let %s write the new one on %s: %w", f.r.ID, f.pusher.home.Node, t.Node, err)
	}
	f.m.target = &poolv1.SegmentHome{Node: t.Node, HomeId: t.HomeID, DataAddr: t.DataAddr, Key: t.Key[:], Epoch: epoch, DataTls: t.DataTLS}
	return nil
}

// holdTarget tells the target how it is written while it is filled
// (Replicate at the record's epoch): by writers and this daemon, its
// owner, not forwarding, its clients only reading it. It returns the
// target's epoch.
func (f *rebuildFill) holdTarget(ctx context.Context, writers []string) (uint64, error) {
	t := f.target
	req := &poolv1.ReplicateRequest{HomeId: t.HomeID, Epoch: max(t.Epoch, f.r.Epoch), Writers: writers, ClientsReadOnly: true}
	resp, err := callAt(ctx, f.m.dst, moveStepTimeout, func(ctx context.Context, api poolv1.PoolClient) (*poolv1.ReplicateResponse, error) {
		return api.Replicate(ctx, req)
	})
	if err != nil {
		return 0, err
	}
	return resp.Epoch, nil
}

// homeRegion is the region of h's segment.
func homeRegion(h homeRef) rdma.Region {
	return rdma.Region{Segment: h.HomeID, Key: h.Key, Epoch: h.Epoch}
}

// close closes the data-plane connections.
func (f *rebuildFill) close() {
	if f.m.dstConn != nil {
		f.m.dstConn.Close()
	}
	for _, s := range slices.Concat(f.sources, f.spares) {
		s.conn.Close()
	}
}

// run fills the target: TRACK at the survivors, copy everything, copy
// what changed meanwhile until little does, SEAL the writers, copy the
// last changes, then switch (sw), which returns nil once the record names
// the target in its place and has unsealed the survivors. A failure
// before the switch unseals the survivors. A pushing source copies each
// round itself (PUSH; its SEAL pushes the last changes, or, not a writer,
// a PUSH after the writers' seal); the others' changes are not its.
func (f *rebuildFill) run(ctx context.Context, sw func(context.Context) error) error {
	m := f.m
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := f.publish(cancel)
	defer stop()
	// A previous run killed during its seal left the writers sealed (their
	// records say so); they serve again first.
	if _, _, err := f.step(ctx, poolv1.MoveOutPhase_MOVE_OUT_ABORT, func(s rebuildPeer) bool { return s.writer }); err != nil {
		return err
	}
	if _, _, err := f.step(ctx, poolv1.MoveOutPhase_MOVE_OUT_TRACK, func(rebuildPeer) bool { return true }); err != nil {
		f.unseal()
		return err
	}
	switched := false
	defer func() {
		if !switched {
			f.unseal()
		}
	}()
	if err := f.copyRounds(ctx); err != nil {
		return err
	}
	if f.r.Redundancy.Data > 0 {
		// No write to a lost data shard (lostwrite.go) lands after the
		// last round: it would change parity the copy no longer follows.
		st := f.p.stripe(f.r.ID)
		st.mu.Lock()
		defer st.mu.Unlock()
	}
	if f.beforeSeal != nil {
		f.beforeSeal()
	}
	f.ownSeal = !f.p.moving.mightSeal(f.r.ID)
	sealed := time.Now()
	m.rate = nil // writes wait for the last round: it goes at full speed
	if err := f.lastRound(ctx); err != nil {
		return err
	}
	m.res.rounds++
	stop() // the switch ends the state the publisher watches
	if err := sw(ctx); err != nil {
		return err
	}
	switched = true
	m.res.pause = time.Since(sealed)
	return nil
}

// copyRounds copies the whole home, then what changed meanwhile while
// each round leaves fewer chunks and more than a few remain; the last
// changes are left for lastRound. Decoded ones wait in f.dirty.
func (f *rebuildFill) copyRounds(ctx context.Context) error {
	m := f.m
	if f.pusher != nil {
		if err := m.pushSliced(ctx); err != nil {
			return err
		}
		return m.settlePushes(ctx)
	}
	if err := m.copyAll(ctx); err != nil {
		return err
	}
	var err error
	f.dirty, err = m.settle(ctx)
	return err
}

// lastRound seals the writers and copies the last changes. The writers
// go first: once they are sealed, no write is in flight and none comes,
// so the others' changes reported after are the last.
func (f *rebuildFill) lastRound(ctx context.Context) error {
	m := f.m
	last, _, err := f.step(ctx, poolv1.MoveOutPhase_MOVE_OUT_SEAL, func(s rebuildPeer) bool { return s.writer })
	if err != nil {
		return err
	}
	if f.pusher != nil {
		if f.pusher.writer {
			return nil // its SEAL pushed them
		}
		_, err := m.pushRange(ctx, false, 0, 0)
		return err
	}
	orBitmap(f.dirty, last)
	if last, _, err = f.step(ctx, poolv1.MoveOutPhase_MOVE_OUT_DIRTY, func(s rebuildPeer) bool { return !s.writer }); err != nil {
		return err
	}
	orBitmap(f.dirty, last)
	// A data home answers a write only once a parity shard that missed
	// its delta is marked lost, and the writers are sealed: every such
	// loss is in the record now.
	if err := f.lostRead(); err != nil {
		return err
	}
	f.dirty = orGrow(f.dirty, f.suspect)
	f.sealed = true
	if err := m.copyChunks(ctx, f.dirty); err != nil {
		return err
	}
	if err := f.repair(ctx); err != nil {
		return err
	}
	f.loseOutOfLine()
	return nil
}

// switchRebuilt is a rebuild's switch: the home marked OK, the writers
// forwarding to it (switchOK), then every survivor unsealed.
func (f *rebuildFill) switchRebuilt(ctx context.Context) error {
	if err := f.switchOK(ctx); err != nil {
		return err
	}
	f.unseal()
	return nil
}

// switchOK marks the target OK and has the writers forward to it; if they
// cannot be told, the home is REBUILDING again (the writers are still
// sealed, so nothing was written that it missed), and a data shard's no
// longer forwards.
func (f *rebuildFill) switchOK(ctx context.Context) error {
	p, r := f.p, f.r
	var epoch uint64
	if err := p.setHome(r.ID, f.i, f.target, func(h *homeRef) {
		h.State, h.Rebuilt = poolv1.HomeState_HOME_STATE_OK, 0
		// replicate raises the copy's epoch to the record's (a primary
		// promoted since it was placed); clients then use that one.
		h.Epoch = max(h.Epoch, r.Epoch)
		epoch = h.Epoch
	}); err != nil {
		return fmt.Errorf("rebuild segment %d: mark the home on %s OK: %w", r.ID, f.target.Node, err)
	}
	cur, ok := p.redundantRecord(r.ID)
	var err error
	if !ok {
		err = fmt.Errorf("%w: freed meanwhile", errs.ErrNotFound)
	} else {
		err = p.replicateJoining(ctx, &cur, &f.target)
	}
	if err == nil {
		return nil
	}
	done := f.target
	done.State, done.Rebuilt, done.Epoch = poolv1.HomeState_HOME_STATE_OK, 0, epoch
	undo := p.setHome(r.ID, f.i, done, func(h *homeRef) { h.State = poolv1.HomeState_HOME_STATE_REBUILDING })
	if f.i < r.Redundancy.Data {
		// The replicate may have told the new home to forward, taking
		// clients' writes: now, not at the next fill, it stops, since
		// writes to the lost shard go through this daemon meanwhile
		// (lostwrite.go), and a client's write there would send the
		// parity shards a change from bytes that lack them.
		if _, herr := f.holdTarget(ctx, nil); herr != nil {
			undo = errors.Join(undo, fmt.Errorf("have the new home on %s stop forwarding: %w", f.target.Node, herr))
		}
	}
	return errors.Join(fmt.Errorf("rebuild segment %d: have its writers forward to the new home on %s: %w", r.ID, f.target.Node, err), undo)
}

// step runs one MoveOut phase at the tracked survivors that pick selects,
// in parallel, and returns the union of the chunks they report changed
// and its count. Each step names the fill (f.id) but an ABORT: the one
// step sends, before the TRACK, undoes what a previous run left, not this
// fill (unseal's names it).
func (f *rebuildFill) step(ctx context.Context, phase poolv1.MoveOutPhase, pick func(rebuildPeer) bool) ([]byte, int, error) {
	var g errgroup.Group
	var mu sync.Mutex
	var union []byte
	for _, s := range f.tracked {
		if !pick(s) {
			continue
		}
		req := &poolv1.MoveOutRequest{HomeId: s.home.HomeID, Phase: phase, Chunk: f.m.chunk}
		if phase != poolv1.MoveOutPhase_MOVE_OUT_ABORT {
			req.Fill = f.id
		}
		if phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL && f.pusher != nil && s.idx == f.pusher.idx {
			req.Target = f.m.target // it pushes its last changes itself
		}
		g.Go(func() error {
			resp, err := moveOutReq(ctx, s.pc, req)
			if err != nil {
				err = fmt.Errorf("rebuild segment %d: %s at %s: %w", f.r.ID, phase, s.home.Node, err)
				if f.p.homeMissing(ctx, f.r.ID, s.home, err) {
					// A source gone: the rebuild looks at the record again.
					err = errors.Join(errRebuildAgain, err)
				}
				return err
			}
			f.m.copied.Add(int64(resp.PushedBytes))
			mu.Lock()
			defer mu.Unlock()
			if len(union) < len(resp.Dirty) {
				union = append(union, make([]byte, len(resp.Dirty)-len(union))...)
			}
			orBitmap(union, resp.Dirty)
			return nil
		})
	}
	err := g.Wait()
	n := 0
	for _, b := range union {
		n += bits.OnesCount8(b)
	}
	return union, n, err
}

// changed is the mover's report of changed chunks: the union of every
// tracked survivor's.
func (f *rebuildFill) changed(ctx context.Context) ([]byte, int, error) {
	return f.step(ctx, poolv1.MoveOutPhase_MOVE_OUT_DIRTY, func(rebuildPeer) bool { return true })
}

// unseal asks every tracked survivor to ABORT this fill (serve writes
// again, stop tracking, refuse a late step of it); one that cannot be told
// now is told in the background. When every one was told now and this
// fill's seal was the only one (ownSeal), no writer is sealed any more.
func (f *rebuildFill) unseal() {
	all := true
	for _, s := range f.tracked {
		all = f.p.unsealAt(s.home.Node, s.home.HomeID, f.id) && all
	}
	if all && f.ownSeal {
		f.p.moving.unsealed(f.r.ID)
	}
}

// unsealAt asks node to ABORT the move of its segment id, the fill fill
// (0: none named), retrying in the background while node is alive and
// cannot be told: a writer left sealed would refuse every write. It
// reports whether node took the ABORT now.
func (p *core) unsealAt(node string, id, fill uint64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
	err := p.unsealOnce(ctx, node, id, fill)
	cancel()
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if err == nil {
		return true
	}
	if closed { // the next start unseals it (unsealIdle)
		return false
	}
	p.log.Warn("rebuild: a surviving home is to unseal a segment; retrying", "node", node, "segment", id, "err", err)
	p.retryLater(func(ctx context.Context) error {
		if !p.alive(node) {
			return nil // not waited for once it is gone; unsealIdle unseals it if it returns
		}
		ctx, cancel := context.WithTimeout(ctx, moveStepTimeout)
		defer cancel()
		return p.unsealOnce(ctx, node, id, fill)
	})
	return false
}

// unsealOnce asks node once to ABORT the move of its segment id (unseal,
// stop tracking), the fill fill (0: none named); a segment that is gone
// or lost there is fine.
func (p *core) unsealOnce(ctx context.Context, node string, id, fill uint64) error {
	pc, err := p.homeSession(ctx, node, "rebuild source")
	if err == nil {
		_, err = moveOutReq(ctx, pc, &poolv1.MoveOutRequest{HomeId: id, Phase: poolv1.MoveOutPhase_MOVE_OUT_ABORT, Fill: fill})
	}
	if errors.Is(err, errs.ErrNotFound) || errors.Is(err, errs.ErrSegmentLost) {
		return nil
	}
	return err
}

// errUnsealBusy is an unsealIdle that waits: a move or rebuild of the
// segment is under way, and unseals its writers when it ends.
var errUnsealBusy = errs.Sub(errs.ErrLimit, "the segment is moving or rebuilding; its writers are unsealed once that ends")

// unsealIdle unseals the writer homes of segment id (every copy of
// replicas: a home move seals the backup that leaves too, and a backup
// becomes the primary when the primary is lost; the data shards of
// erasure coding) that are OK, when they may be sealed
// (moves.mightSeal), unless a move or rebuild of it is under way
// (errUnsealBusy), holding off any that would begin meanwhile. A fill
// seals them at its switch and unseals them after it, and a home move
// after its finish, but a daemon killed in between leaves them sealed,
// with nothing in the record that says so: a rebuild whose switch
// committed the new home OK leaves nothing to rebuild, a home move's
// intent is gone once its finish asked the homes (retrying in the
// background), and a rebuild that cannot place a new home never starts
// the fill that would unseal them first. So replicateLater calls this
// once its replicate has set the forwarding (every home the record names
// OK then takes the writes), which a restarted daemon runs for every
// redundant segment as the homes' nodes join, and again when a node
// returns. An ABORT of a home that is not sealed changes nothing, but it
// is a call to each writer after every replicate (thousands in a heal of
// the scale simulation), so it is sent only while a seal may be left:
// once every writer took one, the segment counts as unsealed.
func (p *core) unsealIdle(ctx context.Context, id uint64) error {
	if !p.moving.mayBeSealed(id) {
		return nil
	}
	if !p.moving.begin(id) {
		return errUnsealBusy
	}
	defer p.moving.end(id)
	if !p.moving.mayBeSealed(id) {
		return nil // the fill that ended meanwhile unsealed them
	}
	r, ok := p.redundantRecord(id)
	if !ok || r.Lost {
		return nil
	}
	var errsOf []error
	k := r.Redundancy.Data
	for i, h := range r.Homes {
		if h.State != poolv1.HomeState_HOME_STATE_OK || k > 0 && i >= k {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, moveStepTimeout)
		err := p.unsealOnce(ctx, h.Node, h.HomeID, 0)
		cancel()
		if err != nil {
			errsOf = append(errsOf, fmt.Errorf("unseal the %s on %s: %w", homeRoleName(&r, i), h.Node, err))
		}
	}
	if len(errsOf) > 0 {
		return errors.Join(errsOf...)
	}
	p.moving.unsealed(id)
	return nil
}

// mightSeal notes that the writer homes of segment id may be sealed from
// now on: a fill is about to seal them (until an ABORT of it reached every
// writer: rebuildFill.unseal, or unsealIdle unsealed them), or the
// segment was found at start (a run killed mid-fill leaves nothing that
// says whether it sealed them). It reports whether they might be sealed
// already.
func (ms *moves) mightSeal(id uint64) (before bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	if ms.sealed == nil {
		ms.sealed = map[uint64]bool{}
	}
	before = ms.sealed[id]
	ms.sealed[id] = true
	return before
}

// mayBeSealed reports whether the writer homes of segment id may be
// sealed (mightSeal).
func (ms *moves) mayBeSealed(id uint64) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return ms.sealed[id]
}

// unsealed notes that no writer home of segment id is sealed (every one
// took an ABORT), or that the segment is gone.
func (ms *moves) unsealed(id uint64) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	delete(ms.sealed, id)
}

// publish shows the bytes copied (f.progress: a rebuild's in the
// record's home, rebuilt_bytes) every rebuildProgress until the returned
// stop (idempotent) is called; once progress says the fill is moot (the
// record no longer names the target as REBUILDING, or a moving home as
// it was) it cancels the fill.
func (f *rebuildFill) publish(cancel context.CancelCauseFunc) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(rebuildProgress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if !f.progress(min(f.m.copied.Load(), f.m.rec.Size)) {
					cancel(fmt.Errorf("fill a home of segment %d on %s: the record changed meanwhile (a home lost, or the segment freed): %w", f.r.ID, f.target.Node, errs.ErrSegmentChanging))
					return
				}
				if err := f.lostRead(); err != nil {
					cancel(err)
					return
				}
			}
		}
	})
	var once sync.Once
	return func() {
		once.Do(func() {
			close(done)
			wg.Wait()
		})
	}
}

// decode fills buf with the lost shard's bytes of the batch's spans: it
// reads the same spans from the k sources (and the spares), in parallel,
// and reconstructs the shard from them (Reed-Solomon works on each byte
// column alone, so any sub-range of the shards decodes); each span's
// decode is checked against the spares. Before the seal a client's write
// may have reached some shards and not yet others, so a span a spare
// disagrees with only makes its chunks suspect, decoded again in the
// sealed last round. Sealed, nothing is in flight: a parity shard that
// still disagrees is to be rewritten in line with the data shards
// (keepRepairs, then repair), the decode's choice of outcome for a write
// their lost home did not finish, which was never acknowledged.
func (f *rebuildFill) decode(ctx context.Context, buf []byte, batch [][2]int64) error {
	read := slices.Concat(f.sources, f.spares)
	reads := make([][]byte, len(read))
	for j := range reads {
		b := f.bufs.Get().(*[]byte)
		defer f.bufs.Put(b)
		reads[j] = (*b)[:len(buf)]
	}
	ns := len(f.sources)
	up, late, err := f.readShards(ctx, read, batch, reads)
	if err != nil {
		return err
	}
	if late && !f.sealed {
		f.suspectBatch(batch) // unchecked by a spare: the sealed round checks it
	}
	k := f.r.Redundancy.Data
	var parity []int                  // the positions in read of the parity shards read
	want := make([][]byte, len(read)) // a parity shard's bytes as a decode makes them
	for j, s := range read {
		if up[j] && s.idx >= k {
			parity = append(parity, j)
			b := f.bufs.Get().(*[]byte)
			defer f.bufs.Put(b)
			want[j] = (*b)[:len(buf)]
		}
	}
	shards := make([][]byte, k+f.r.Redundancy.Parity)
	required := make([]bool, len(shards))
	// span decodes out, the lost shard's bytes at off in the batch, from
	// the shards read at positions from, and returns the positions of the
	// other parity shards read that disagree with the decode.
	span := func(from []int, out []byte, off int64) ([]int, error) {
		l := int64(len(out))
		clear(shards)
		clear(required)
		for _, j := range from {
			shards[read[j].idx] = reads[j][off : off+l]
		}
		for _, j := range parity {
			if !slices.Contains(from, j) {
				shards[read[j].idx], required[read[j].idx] = want[j][off:off:off+l], true
			}
		}
		shards[f.i], required[f.i] = out[:0], true // decoded in place
		if err := f.enc.ReconstructSome(shards, required); err != nil {
			return nil, err
		}
		if len(shards[f.i]) != int(l) {
			return nil, fmt.Errorf("%d bytes decoded of %d", len(shards[f.i]), l)
		}
		if &shards[f.i][0] != &out[0] {
			copy(out, shards[f.i])
		}
		var bad []int
		for _, j := range parity {
			if slices.Contains(from, j) {
				continue
			}
			if got := shards[read[j].idx]; &got[0] != &want[j][off] {
				copy(want[j][off:off+l], got)
			}
			if !bytes.Equal(want[j][off:off+l], reads[j][off:off+l]) {
				bad = append(bad, j)
			}
		}
		return bad, nil
	}
	sources := make([]int, ns)
	var data []int // the positions of the data shards among the sources
	for j := range sources {
		sources[j] = j
		if read[j].idx < k {
			data = append(data, j)
		}
	}
	// choose redoes a sealed span's decode that parity shards disagree
	// with (bad) from the parity shards the most others agree with, the
	// sources' on a tie. With one data shard missing, any one parity
	// shard gives an outcome of a write its dead home did not finish, but
	// one that missed a live data home's write (a loss the home could not
	// report: it answered the write INDETERMINATE, and the record still
	// says OK) gives bytes nobody wrote. With more missing, the decode
	// rests on as many parity shards, which the dead home's write may have
	// split: a decode from both sides of the split is bytes nobody wrote,
	// in the other missing data shards too, acknowledged bytes among them.
	// Only a side with more parity shards than the decode needs outvotes
	// the others; with exactly one spare every choice disagrees with it.
	// With more than maxVote choices the sources' stands.
	choose := func(out []byte, off int64, bad []int) ([]int, error) {
		need := ns - len(data)
		if need == 0 || choices(len(parity), need) > maxVote {
			return bad, nil
		}
		best, fewest := sources, len(bad)
		// Each set of need bits among len(parity), in increasing order
		// (the next one with as many bits set: Gosper's hack).
		for set := uint64(1)<<need - 1; set < 1<<len(parity); {
			from := slices.Clone(data)
			for b, j := range parity {
				if set&(1<<b) != 0 {
					from = append(from, j)
				}
			}
			if bad, err := span(from, out, off); err != nil {
				return nil, err
			} else if len(bad) < fewest {
				best, fewest = from, len(bad)
			}
			low := set & -set
			next := set + low
			set = ((next^set)>>2)/low | next
		}
		return span(best, out, off)
	}
	fixes := make([][]int, len(read)) // per position, the spans to rewrite
	offs := make([]int64, len(batch))
	off := int64(0)
	for x, s := range batch {
		offs[x] = off
		out := buf[off : off+s[1]-s[0]]
		off += s[1] - s[0]
		bad, err := span(sources, out, offs[x])
		if err == nil && len(bad) > 0 && f.sealed {
			bad, err = choose(out, offs[x], bad)
		}
		switch {
		case err != nil:
			return fmt.Errorf("decode shard %d at %d: %w", f.i, s[0], err)
		case len(bad) > 0 && !f.sealed:
			f.suspectBatch(batch[x : x+1])
		}
		for _, j := range bad {
			fixes[j] = append(fixes[j], x)
		}
	}
	if f.sealed {
		f.keepRepairs(batch, offs, fixes, want)
	}
	return nil
}

// Spare pacing: a spare's read of a batch may take spareSlack times as
// long as the sources' (at least spareGraceMin) before the batch goes on
// without it; a spare late for spareLateMax batches in a row is down for
// the rest of the fill, as one that fails.
const (
	spareSlack    = 4
	spareGraceMin = 20 * time.Millisecond
	spareLateMax  = 3
)

// readShards reads the batch's spans of the shards read (the sources,
// then the spares) into reads, in parallel, and reports which were read
// (up) and whether a spare was late. The sources' reads are waited for
// (one that fails fails the batch); before the seal a spare's only until
// spareSlack times the sources' took, so that a slow spare (one that
// answers, slowly) does not slow every batch: the rebuild waits on the k
// homes it decodes from. Sealed, the last changes and the suspect chunks
// are checked against every spare still up, waited for: a batch it was
// late for has no later round. A spare that fails, or is late
// spareLateMax times in a row, is dropped (dropSpare).
func (f *rebuildFill) readShards(ctx context.Context, read []rebuildPeer, batch [][2]int64, reads [][]byte) (up []bool, late bool, err error) {
	ns := len(f.sources)
	up = make([]bool, len(read))
	spareCtx, stopSpares := context.WithCancel(ctx)
	defer stopSpares()
	var sources errgroup.Group
	var spares sync.WaitGroup
	var lateAny atomic.Bool
	start := time.Now()
	for j, s := range read {
		if j < ns {
			sources.Go(func() error {
				if err := s.conn.Do(ctx, spanOps(rdma.OpRead, s.reg, batch, reads[j])...); err != nil {
					return fmt.Errorf("shard %d on %s: %w", s.idx, s.home.Node, err)
				}
				up[j] = true
				return nil
			})
			continue
		}
		if f.down[j-ns].Load() {
			continue
		}
		spares.Go(func() {
			err := s.conn.Do(spareCtx, spanOps(rdma.OpRead, s.reg, batch, reads[j])...)
			switch {
			case err == nil:
				up[j] = true
				f.late[j-ns].Store(0)
			case spareCtx.Err() != nil && ctx.Err() == nil:
				lateAny.Store(true)
				if n := f.late[j-ns].Add(1); n >= spareLateMax {
					f.dropSpare(j-ns, "read", fmt.Errorf("slower than the sources for %d batches in a row: %w", n, err))
				}
			default:
				f.dropSpare(j-ns, "read", err)
			}
		})
	}
	err = sources.Wait()
	switch {
	case err != nil:
		stopSpares()
	case !f.sealed:
		grace := time.AfterFunc(max(spareSlack*time.Since(start), spareGraceMin), stopSpares)
		defer grace.Stop()
	}
	spares.Wait()
	return up, lateAny.Load(), err
}

// suspectBatch marks the chunks of the batch's spans suspect.
func (f *rebuildFill) suspectBatch(batch [][2]int64) {
	f.suspectMu.Lock()
	defer f.suspectMu.Unlock()
	for _, s := range batch {
		set, _ := rangeChunks(s[0], s[1], f.m.chunk)
		f.suspect = orGrow(f.suspect, set)
	}
}

// maxVote bounds the decodes a sealed span's vote among the parity shards
// makes (decode): a code with many parity shards and several data shards
// missing has more choices than the writers' pause should wait for, and
// the sources' then stands.
const maxVote = 64

// choices is n choose r, or more than maxVote when it is.
func choices(n, r int) int {
	c := 1
	for x := range min(r, n-r) {
		c = c * (n - x) / (x + 1)
		if c > maxVote {
			return maxVote + 1
		}
	}
	return c
}

// lostRead reports a shard the fill decodes from or checks against (a
// source, a spare not down) that the record no longer names OK: marked
// lost since the fill began, because a data home could not forward a
// write's delta to it, say. Its bytes may then lack acknowledged writes,
// and a decode from it (or a vote it takes part in) would be bytes nobody
// wrote, so the fill must end; the next rebuild reads the shards left.
func (f *rebuildFill) lostRead() error {
	p := f.p
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, ok := p.segs[f.r.ID]
	if !ok {
		return fmt.Errorf("fill a home of segment %d on %s: %w: freed meanwhile", f.r.ID, f.target.Node, errs.ErrNotFound)
	}
	ns := len(f.sources)
	for j, s := range slices.Concat(f.sources, f.spares) {
		if j >= ns && f.down[j-ns].Load() || f.outOfLine[j].Load() || sameHome(cur, s.idx, s.home) {
			continue
		}
		return fmt.Errorf("fill a home of segment %d on %s: shard %d on %s, which the fill reads, is no longer OK in the record (it may lack writes); the rebuild starts again from the shards left: %w",
			f.r.ID, f.target.Node, s.idx, s.home.Node, errs.ErrSegmentChanging)
	}
	return nil
}

// dropSpare takes spare j out of the fill's checks after its op failed.
func (f *rebuildFill) dropSpare(j int, op string, err error) {
	if f.down[j].CompareAndSwap(false, true) {
		s := f.spares[j]
		f.p.log.Warn("rebuild: a spare shard failed; the decode goes on unchecked by it", "segment", f.r.ID, "shard", s.idx, "node", s.home.Node, "op", op, "err", err)
	}
}

// keepRepairs keeps, for repair, the bytes the sealed decode made of the
// parity shards read (want, at their positions in decode, at offs in the
// batch) in the spans that disagreed (fixes). A shard whose repairs would
// pass maxRepair is outOfLine instead.
func (f *rebuildFill) keepRepairs(batch [][2]int64, offs []int64, fixes [][]int, want [][]byte) {
	f.repairMu.Lock()
	defer f.repairMu.Unlock()
	for j, xs := range fixes {
		if len(xs) == 0 || f.outOfLine[j].Load() {
			continue
		}
		n := int64(0)
		for _, r := range f.repairs[j] {
			n += int64(len(r.b))
		}
		for _, x := range xs {
			l := batch[x][1] - batch[x][0]
			if n += l; n > maxRepair {
				f.outOfLine[j].Store(true)
				f.repairs[j] = nil
				break
			}
			f.repairs[j] = append(f.repairs[j], repairSpan{off: batch[x][0], b: slices.Clone(want[j][offs[x] : offs[x]+l])})
		}
	}
}

// repair writes the parity shards the sealed decode found out of line
// their bytes as it made them (keepRepairs), bringing them in line with
// the data shards, once fence has raised their epochs: a parity delta a
// data home sent before the seal may still be on its way (it timed out
// there, and the home could not have the shard marked lost: Server.Forward's
// OnFail), and, arriving after the repair, it would apply a write the
// repair holds already. Under the new epoch it is refused. A shard whose
// write fails is outOfLine. A fence that fails fails the fill, which
// writes nothing then and is retried.
func (f *rebuildFill) repair(ctx context.Context) error {
	var pos []int
	for j, r := range f.repairs {
		if len(r) > 0 && !f.outOfLine[j].Load() {
			pos = append(pos, j)
		}
	}
	if len(pos) == 0 {
		return nil
	}
	epochs, err := f.fence(ctx, pos)
	if err != nil {
		return fmt.Errorf("rebuild segment %d: raise the epochs of the parity shards to bring in line: %w", f.r.ID, err)
	}
	read := slices.Concat(f.sources, f.spares)
	var wg sync.WaitGroup
	for y, j := range pos {
		s, n := read[j], int64(0)
		reg := s.reg
		reg.Epoch = epochs[y]
		ops := make([]*rdma.Op, len(f.repairs[j]))
		for x, r := range f.repairs[j] {
			ops[x] = &rdma.Op{Kind: rdma.OpWrite, Region: reg, Offset: r.off, Buf: r.b}
			n += int64(len(r.b))
		}
		wg.Go(func() {
			var err error
			if hook := f.p.cfg.sim.repairing; hook != nil {
				err = hook(f.r.ID, s.idx)
			}
			if err == nil {
				err = s.conn.Do(ctx, ops...)
			}
			if err != nil {
				f.outOfLine[j].Store(true)
				f.p.log.Warn("rebuild: a parity shard out of line with the data shards could not be brought in line; it is marked lost and rebuilt", "segment", f.r.ID, "shard", s.idx, "node", s.home.Node, "err", err)
				return
			}
			f.repaired.Add(n)
		})
	}
	wg.Wait()
	if n := f.repaired.Load(); n > 0 {
		f.p.log.Warn("rebuild: parity shards disagreed about a write their lost data home had not finished; brought them in line with the data shards",
			"segment", f.r.ID, "shard", f.i, "bytes", n)
	}
	return nil
}

// fenceHomes raises the epoch of the homes at positions pos (in sources,
// then spares) to one past the record's and theirs, commits it, and has
// replicate tell every home (the parity shards take it before the data
// homes forward to them at it); it returns the new epochs.
func (f *rebuildFill) fenceHomes(ctx context.Context, pos []int) ([]uint64, error) {
	read := slices.Concat(f.sources, f.spares)
	epochs := make([]uint64, len(pos))
	next, err := f.p.updateRecord(f.r.ID, func(r *record) error {
		for y, j := range pos {
			s := read[j]
			if !sameHome(r, s.idx, s.home) {
				return fmt.Errorf("shard %d on %s changed meanwhile: %w", s.idx, s.home.Node, errs.ErrSegmentChanging)
			}
			h := &r.Homes[s.idx]
			h.Epoch = max(h.Epoch, r.Epoch) + 1
			epochs[y] = h.Epoch
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return epochs, f.p.replicate(ctx, &next)
}

// loseOutOfLine marks the parity shards the fill found out of line with
// the data shards and could not bring in line lost: each is rebuilt from
// the data shards after this fill, never read as they are.
func (f *rebuildFill) loseOutOfLine() {
	for j, s := range slices.Concat(f.sources, f.spares) {
		if f.outOfLine[j].Load() {
			f.p.homeLost(f.r.ID, s.home.Node, s.home.HomeID, "a rebuild found it out of line with the data shards and could not bring it in line", true)
		}
	}
}

// spanOps are ops of kind on reg, one per span of batch, their buffers
// laid out in turn in buf.
func spanOps(kind rdma.OpKind, reg rdma.Region, batch [][2]int64, buf []byte) []*rdma.Op {
	ops := make([]rdma.Op, len(batch))
	ptrs := make([]*rdma.Op, len(batch))
	off := int64(0)
	for x, span := range batch {
		ops[x] = rdma.Op{Kind: kind, Region: reg, Offset: span[0], Buf: buf[off : off+span[1]-span[0]]}
		ptrs[x] = &ops[x]
		off += span[1] - span[0]
	}
	return ptrs
}

// orGrow sets in dst the bits set in src, growing dst to src's length.
func orGrow(dst, src []byte) []byte {
	if len(dst) < len(src) {
		dst = append(dst, make([]byte, len(src)-len(dst))...)
	}
	orBitmap(dst, src)
	return dst
}
