// This file holds the copy of a rebuild (rebuild.go): the new home of a
// replicated segment is filled from its primary, that of an erasure-coded
// segment's shard decoded from k surviving shards, both with the live
// move's copy-and-switch (move.go) while clients go on writing. The move
// of a home that leaves its host (movehome.go) fills its replacement the
// same way, from the leaving home itself when it is a shard.

package pool

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"
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
	// moving: home i is alive and leaves (a move of it, movehome.go),
	// not lost: it is tracked and, a shard, copied from.
	moving bool
	// progress publishes the bytes copied so far; false when the fill is
	// moot (the record changed under it).
	progress func(n int64) bool
	// beforeSeal, if set, runs just before the writers are sealed.
	beforeSeal func()

	// tracked are the surviving homes whose changes the copy follows:
	// the primary of replicas (every write lands there first), every OK
	// shard of an erasure-coded segment (a parity shard changes by the
	// data homes' deltas). The writers among them are sealed at the
	// switch-over; the others only report their last changes.
	tracked []rebuildPeer
	// sources are the k shards an erasure-coded shard is decoded from.
	sources []rebuildPeer
	extra   []rdma.Conn // the copy workers' own connections
	enc     reedsolomon.Encoder
	bufs    sync.Pool // *[]byte of m.batch bytes, one per source and batch
}

// rebuildPeer is one surviving home of the rebuild.
type rebuildPeer struct {
	idx    int
	home   homeRef
	pc     *session.Conn
	writer bool        // clients' writes land here: sealed at the switch-over
	conn   rdma.Conn   // sources only
	reg    rdma.Region // sources only
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
	f := &rebuildFill{p: p, r: r, i: i, target: target, moving: moving}
	what := fmt.Sprintf("rebuild segment %d", r.ID)
	if moving {
		what = fmt.Sprintf("move a home of segment %d", r.ID)
	}
	dst, err := p.homeSession(ctx, target.Node, "rebuild target")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	f.m = &mover{p: p, rec: record{ID: r.ID, Size: size}, dst: dst, to: target.Node, tls: tls, chunk: moveChunk(size), rate: rate}
	f.m.dirty = f.changed
	k := r.Redundancy.Data
	for j, h := range r.Homes {
		if j == i && !moving || h.State != poolv1.HomeState_HOME_STATE_OK || r.Redundancy.Replicas > 0 && j > 0 {
			continue
		}
		pc, err := p.homeSession(ctx, h.Node, "rebuild source")
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		f.tracked = append(f.tracked, rebuildPeer{idx: j, home: h, pc: pc, writer: k == 0 || j < k})
	}
	// The sources: the primary; a moving shard itself; or the first k OK
	// shards (data shards first: their bytes are the segment's, so a lost
	// parity shard needs no decode of data).
	from := f.tracked
	n := 1
	switch {
	case k > 0 && moving:
		from = slices.DeleteFunc(slices.Clone(f.tracked), func(s rebuildPeer) bool { return s.idx != i })
	case k > 0:
		n = k
		if f.enc, err = reedsolomon.New(k, r.Redundancy.Parity); err != nil {
			return nil, fmt.Errorf("%s: %w: erasure code %d+%d: %v", what, errs.ErrInvalid, k, r.Redundancy.Parity, err)
		}
		f.m.read = f.decode
		f.m.batch = max(moveChunkMin, moveBatch/int64(k)/moveChunkMin*moveChunkMin)
		f.bufs.New = func() any { b := make([]byte, f.m.batch); return &b }
	}
	if len(from) < n {
		return nil, fmt.Errorf("%s: %w: %d homes to read from, and it needs %d", what, errs.ErrSegmentLost, len(from), n)
	}
	f.m.rec.Home = from[0].home.Node // named in the copy's errors
	defer func() {
		if err != nil {
			f.close()
		}
	}()
	if f.m.dstConn, err = f.m.dial(ctx, target.Node, target.DataAddr, target.DataTLS, dst); err != nil {
		return nil, err
	}
	f.m.dstReg = homeRegion(target)
	for _, s := range from[:n] {
		if s.conn, err = f.m.dial(ctx, s.home.Node, s.home.DataAddr, s.home.DataTLS, s.pc); err != nil {
			return nil, err
		}
		s.reg = homeRegion(s.home)
		f.sources = append(f.sources, s)
	}
	if f.m.read == nil { // one source, copied as it is
		f.m.src, f.m.srcConn, f.m.srcReg = f.sources[0].pc, f.sources[0].conn, f.sources[0].reg
		for range moveInflight - 1 {
			s, d := f.sources[0], f.target
			var lane copyLane
			if lane.src, err = f.m.dial(ctx, s.home.Node, s.home.DataAddr, s.home.DataTLS, s.pc); err != nil {
				return nil, err
			}
			f.extra = append(f.extra, lane.src)
			if lane.dst, err = f.m.dial(ctx, d.Node, d.DataAddr, d.DataTLS, dst); err != nil {
				return nil, err
			}
			f.extra = append(f.extra, lane.dst)
			f.m.lanes = append(f.m.lanes, lane)
		}
		f.m.lanes = append(f.m.lanes, copyLane{f.m.srcConn, f.m.dstConn})
	}
	return f, nil
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
	for _, s := range f.sources {
		s.conn.Close()
	}
	for _, c := range f.extra {
		c.Close()
	}
}

// run fills the target: TRACK at the survivors, copy everything, copy
// what changed meanwhile until little does, SEAL the writers, copy the
// last changes, then switch (sw), which returns nil once the record names
// the target in its place and has unsealed the survivors. A failure
// before the switch unseals the survivors.
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
	if err := m.copyAll(ctx); err != nil {
		return err
	}
	dirty, err := m.settle(ctx)
	if err != nil {
		return err
	}
	if f.beforeSeal != nil {
		f.beforeSeal()
	}
	sealed := time.Now()
	// The writers first: once they are sealed, no write is in flight and
	// none comes, so the others' changes reported after are the last.
	last, _, err := f.step(ctx, poolv1.MoveOutPhase_MOVE_OUT_SEAL, func(s rebuildPeer) bool { return s.writer })
	if err != nil {
		return err
	}
	orBitmap(dirty, last)
	if last, _, err = f.step(ctx, poolv1.MoveOutPhase_MOVE_OUT_DIRTY, func(s rebuildPeer) bool { return !s.writer }); err != nil {
		return err
	}
	orBitmap(dirty, last)
	m.rate = nil // writes wait for this round: it goes at full speed
	if err := m.copyChunks(ctx, dirty); err != nil {
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
// sealed, so nothing was written that it missed).
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
		err = p.replicate(ctx, &cur)
	}
	if err == nil {
		return nil
	}
	done := f.target
	done.State, done.Rebuilt, done.Epoch = poolv1.HomeState_HOME_STATE_OK, 0, epoch
	undo := p.setHome(r.ID, f.i, done, func(h *homeRef) { h.State = poolv1.HomeState_HOME_STATE_REBUILDING })
	return errors.Join(fmt.Errorf("rebuild segment %d: have its writers forward to the new home on %s: %w", r.ID, f.target.Node, err), undo)
}

// step runs one MoveOut phase at the tracked survivors that pick selects,
// in parallel, and returns the union of the chunks they report changed
// and its count.
func (f *rebuildFill) step(ctx context.Context, phase poolv1.MoveOutPhase, pick func(rebuildPeer) bool) ([]byte, int, error) {
	var g errgroup.Group
	var mu sync.Mutex
	var union []byte
	for _, s := range f.tracked {
		if !pick(s) {
			continue
		}
		g.Go(func() error {
			resp, err := moveOutAt(ctx, s.pc, s.home.HomeID, phase, f.m.chunk)
			if err != nil {
				return fmt.Errorf("rebuild segment %d: %s at %s: %w", f.r.ID, phase, s.home.Node, err)
			}
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

// unseal asks every tracked survivor to ABORT (serve writes again, stop
// tracking); one that cannot be told now is told in the background.
func (f *rebuildFill) unseal() {
	for _, s := range f.tracked {
		f.p.unsealAt(s.home.Node, s.home.HomeID)
	}
}

// unsealAt asks node to ABORT the move of its segment id, retrying in the
// background while node is alive and cannot be told: a writer left
// sealed would refuse every write.
func (p *core) unsealAt(node string, id uint64) {
	try := func(ctx context.Context) error {
		pc, err := p.homeSession(ctx, node, "rebuild source")
		if err == nil {
			_, err = moveOutAt(ctx, pc, id, poolv1.MoveOutPhase_MOVE_OUT_ABORT, 0)
		}
		if errors.Is(err, errs.ErrNotFound) || errors.Is(err, errs.ErrSegmentLost) {
			return nil
		}
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
	err := try(ctx)
	cancel()
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if err == nil || closed { // closed: the next start's rebuild unseals it first
		return
	}
	p.log.Warn("rebuild: a surviving home is to unseal a segment; retrying", "node", node, "segment", id, "err", err)
	p.retryLater(func(ctx context.Context) error {
		if !p.alive(node) {
			return nil // not waited for once it is gone
		}
		ctx, cancel := context.WithTimeout(ctx, moveStepTimeout)
		defer cancel()
		return try(ctx)
	})
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
					cancel(fmt.Errorf("fill a home of segment %d on %s: %w: the record changed meanwhile (a home lost, or the segment freed)", f.r.ID, f.target.Node, errs.ErrUnavailable))
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
// reads the same spans from the k sources, in parallel, and reconstructs
// the shard from them (Reed-Solomon works on each byte column alone, so
// any sub-range of the shards decodes).
func (f *rebuildFill) decode(ctx context.Context, buf []byte, batch [][2]int64) error {
	reads := make([][]byte, len(f.sources))
	for j := range reads {
		b := f.bufs.Get().(*[]byte)
		defer f.bufs.Put(b)
		reads[j] = (*b)[:len(buf)]
	}
	var g errgroup.Group
	for j, s := range f.sources {
		g.Go(func() error {
			ops := make([]rdma.Op, len(batch))
			ptrs := make([]*rdma.Op, len(batch))
			off := int64(0)
			for x, span := range batch {
				ops[x] = rdma.Op{Kind: rdma.OpRead, Region: s.reg, Offset: span[0], Buf: reads[j][off : off+span[1]-span[0]]}
				ptrs[x] = &ops[x]
				off += span[1] - span[0]
			}
			if err := s.conn.Do(ctx, ptrs...); err != nil {
				return fmt.Errorf("shard %d on %s: %w", s.idx, s.home.Node, err)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	total := f.r.Redundancy.Data + f.r.Redundancy.Parity
	shards := make([][]byte, total)
	required := make([]bool, total)
	required[f.i] = true
	off := int64(0)
	for _, span := range batch {
		l := span[1] - span[0]
		clear(shards)
		for j, s := range f.sources {
			shards[s.idx] = reads[j][off : off+l]
		}
		out := buf[off : off+l]
		shards[f.i] = out[:0] // decoded in place
		if err := f.enc.ReconstructSome(shards, required); err != nil {
			return fmt.Errorf("decode shard %d at %d: %w", f.i, span[0], err)
		}
		if len(shards[f.i]) != int(l) {
			return fmt.Errorf("decode shard %d at %d: %d bytes decoded of %d", f.i, span[0], len(shards[f.i]), l)
		}
		if &shards[f.i][0] != &out[0] {
			copy(out, shards[f.i])
		}
		off += l
	}
	return nil
}
