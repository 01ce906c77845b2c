// This file holds the source side of a live move (docs/MOVE.md): the
// MoveOut steps a peer daemon asks of the home of a segment it placed here
// while it copies the segment to another home.

package pool

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// moveChunkMin is the smallest chunk the data plane tracks writes in.
const moveChunkMin = 4096

// MoveOut runs one step of moving a segment away from this home; only a
// peer daemon's session may ask, and only for a segment it placed here.
func (s *service) MoveOut(ctx context.Context, req *poolv1.MoveOutRequest) (*poolv1.MoveOutResponse, error) {
	c, err := s.caller(ctx)
	if err == nil && !isPeer(c) {
		err = fmt.Errorf("%w: only the peer daemon that placed a segment may move it away from its home, and the caller is %s", errs.ErrAccessDenied, c.ident)
	}
	var resp *poolv1.MoveOutResponse
	if err == nil {
		resp, err = s.d.pool.moveOut(ctx, c, req, s.d.moveTLS())
	}
	if err != nil {
		s.d.refused("move-out", c, req.HomeId, "", err)
		return nil, errs.ToStatus(err)
	}
	return resp, nil
}

// moveOut runs one MoveOut step on segment req.HomeId, which c must own.
// The data plane's steps run outside p.mu: a seal waits for the writes in
// flight, a withdrawal for every operation, a push for the target.
func (p *core) moveOut(ctx context.Context, c caller, req *poolv1.MoveOutRequest, tls moveTLS) (*poolv1.MoveOutResponse, error) {
	r, seg, err := p.moveOutSubject(c, req)
	if err != nil {
		return nil, err
	}
	p.evac.steps.saw(seg.ID) // the move this node asked for goes on
	if hook := p.cfg.sim.moveOutStep; hook != nil {
		if err := hook(c, req); err != nil {
			return nil, err
		}
	}
	what := fmt.Sprintf("move segment %d away (%s)", seg.ID, req.Phase)
	if m, ok := moveOf(seg.ID, req); ok && lateRefused(req.Phase) && p.aborted.has(m) {
		return nil, fmt.Errorf("%s: %w (%s)", what, errMoveAborted, m)
	}
	resp := &poolv1.MoveOutResponse{}
	switch req.Phase {
	case poolv1.MoveOutPhase_MOVE_OUT_TRACK:
		if req.Chunk < moveChunkMin || req.Chunk&(req.Chunk-1) != 0 {
			return nil, fmt.Errorf("%s: %w: chunk of %d bytes; use a power of two from %d", what, errs.ErrInvalid, req.Chunk, moveChunkMin)
		}
		if p.dp.coh.isShared(seg.ID) {
			return nil, fmt.Errorf("%s: %w: it is a shared segment, whose pages sharers cache under leases from this home's coherence directory; it is not moved (detach its sharers and allocate a new segment where it should live)", what, errs.ErrInvalid)
		}
		err = p.trackOut(seg.ID, req)
	case poolv1.MoveOutPhase_MOVE_OUT_DIRTY:
		resp.Dirty, err = p.dirtyOf(seg.ID, req, resp)
	case poolv1.MoveOutPhase_MOVE_OUT_PUSH:
		err = p.pushOf(ctx, seg, req, tls, resp)
	case poolv1.MoveOutPhase_MOVE_OUT_SEAL:
		err = p.sealOut(ctx, r, seg, req, tls, resp)
	case poolv1.MoveOutPhase_MOVE_OUT_COMMIT:
		p.pushing.retire(seg.ID)
		err = p.letGo(r, seg.ID) // the push note goes with the record
		p.trackFills.drop(seg.ID)
	case poolv1.MoveOutPhase_MOVE_OUT_ABORT:
		err = p.abortOut(r, seg, req)
	case poolv1.MoveOutPhase_MOVE_OUT_STATUS:
		err = p.moveStatus(seg, req.Target, resp)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return resp, nil
}

// pushOf runs a PUSH step and sets what it wrote in resp.
func (p *core) pushOf(ctx context.Context, seg record, req *poolv1.MoveOutRequest, tls moveTLS, resp *poolv1.MoveOutResponse) error {
	bytes, n, err := p.push(ctx, seg, req, tls)
	resp.PushedBytes, resp.DirtyChunks = uint64(bytes), uint32(n)
	return err
}

// sealOut runs a SEAL step: the sealed flag is committed first, while
// writes still go on (a restarted source seals the segment again from it,
// which only holds writes back until the origin commits or aborts); with
// req.Target, the chunks changed since the last round are pushed to it
// while writes still go on; then the data plane refuses writes and waits
// out those in flight, and the last changed chunks are pushed to
// req.Target (or answered, without one).
// A push that reached the target is noted (putPushed) before the answer:
// the origin announces the target on that answer, before its own commit
// is durable, and an origin restarted in between asks (STATUS) whether
// the target's copy is whole. On a failure the segment is unsealed, and
// the move cannot go on. The record's seal, each take of changed chunks,
// the data plane's seal and the unseal run only while the SEAL's move or
// fill is still the segment's (whileCurrent): a SEAL that an ABORT or a
// later fill's TRACK ended seals nothing, takes no chunk, and leaves the
// seal and the tracking as the step that ended it left them.
func (p *core) sealOut(ctx context.Context, r *record, seg record, req *poolv1.MoveOutRequest, tls moveTLS, resp *poolv1.MoveOutResponse) error {
	if err := p.whileCurrent(seg.ID, req, func() error { return p.setSealed(r, true) }); err != nil {
		return err
	}
	// One more round while writes still go on, right before the seal:
	// the sealed round, which operations wait for, then has only what
	// changed during this one to push, mostly nothing, rather than what
	// changed since the origin's last round and during the commit above
	// (one round trip to the target a chunk or more).
	var early int64
	var earlyChunks int
	var err error
	if req.Target != nil {
		early, earlyChunks, err = p.push(ctx, seg, req, tls)
	}
	sealed := time.Now()
	if err == nil {
		err = p.sealData(seg, req)
	}
	if err == nil {
		if req.Target != nil {
			if err = p.pushOf(ctx, seg, req, tls, resp); err == nil {
				err = p.handOver(ctx, r, seg, req)
			}
		} else {
			resp.Dirty, err = p.dirtyOf(seg.ID, req, resp)
		}
	}
	// A failure to take the changes means they are unknown (not tracked:
	// this daemon restarted since TRACK); one to push them, that the
	// target lacks them; a SEAL whose caller gave up, or that an ABORT
	// overtook, is not to hand over. Either way the move cannot go on.
	// (Nothing fails after the handover: a segment handed over is never
	// unsealed here but by an ABORT that names no target.)
	if err != nil {
		return errors.Join(err, p.unsealOut(r, seg.ID, req))
	}
	resp.PushedBytes += uint64(early) // both rounds
	resp.DirtyChunks += uint32(earlyChunks)
	resp.SealedUs = time.Since(sealed).Microseconds()
	return nil
}

// errMoveAborted is a PUSH or SEAL (or a fill's TRACK or DIRTY: lateRefused)
// refused because it names a move or fill whose ABORT ran here
// (abortedMoves), or that a later TRACK ended (whileCurrent): it arrived
// late, after its origin gave up on it. From the check that refused it
// on, nothing of it ran: it took no chunk from a later move's tracking,
// sealed nothing and handed nothing over (a seal it set before is the
// ABORT's or TRACK's that ended it to undo or keep). It matches
// ErrNotFound: the move it names is no more; an origin that got it would
// fail the move as for any SEAL that failed (STATUS finds the segment not
// sealed: undone).
var errMoveAborted = errs.Sub(errs.ErrNotFound, "the move this step names was undone here (its ABORT ran, and its target's copy is freed): nothing was pushed, sealed or handed over for it; start a new move")

// errHandedOver is an ABORT refused because the SEAL of the move it
// names pushed its last chunks to the target and handed the segment over:
// clients may have written the copy since, so the move rolls forward.
var errHandedOver = errs.Sub(errs.ErrInUse, "the segment was handed over to its move's target, whose copy clients may have written: the move is not undone; roll it forward (ask STATUS, then COMMIT)")

// trackOut runs a TRACK step: it starts tracking segment id's writes
// afresh for the move or fill req belongs to, and notes its fill
// (p.trackFills). A tracked fill other than req's is remembered as
// aborted (endTrackedFill), so that a late DIRTY, PUSH or SEAL of it
// cannot take or seal what the new tracking is for. It runs under
// p.handing, so that an ABORT sees the tracking and its fill as one, and
// a step's check before it takes chunks or seals (whileCurrent) sees
// them before or after this TRACK.
func (p *core) trackOut(id uint64, req *poolv1.MoveOutRequest) error {
	p.handing.Lock()
	defer p.handing.Unlock()
	p.waitSealing(id)
	if m, ok := moveOf(id, req); ok && p.aborted.has(m) {
		return fmt.Errorf("%w (%s)", errMoveAborted, m) // its ABORT ran since moveOut checked
	}
	p.endTrackedFill(id, req.Fill)
	if err := p.dp.track(id, req.Chunk); err != nil {
		return err
	}
	p.trackFills.set(id, req.Fill)
	return nil
}

// endTrackedFill remembers the fill segment id is tracked for as
// aborted, unless it is fill: the origin, which runs one fill of a
// segment at a time, is done with it when it starts a move or fill of the
// segment, or undoes any (an ABORT that names no fill), though the fill's
// own ABORT may still be on its way. Under p.handing.
func (p *core) endTrackedFill(id, fill uint64) {
	if prev := p.trackFills.of(id); prev != 0 && prev != fill && p.tracked(id) {
		p.aborted.add(abortedMove{seg: id, fill: prev}, time.Now())
	}
}

// tracked reports whether the data plane tracks segment id's writes.
func (p *core) tracked(id uint64) bool {
	_, err := p.dp.srv.Chunk(id)
	return err == nil
}

// abortOut runs an ABORT step: it unseals the segment and drops its push
// note, unless req's target names the move whose SEAL noted a push to it
// (the segment was handed over: errHandedOver). The move or fill it
// undoes (moveOf) is remembered (p.aborted), so that a step of it that
// arrives later is refused (errMoveAborted). A fill's ABORT is not
// refused for a push note: the fill's SEAL pushed to a new home of a
// redundant segment that its record names only once the fill switched,
// and the fill is undone on any failure before. A fill's ABORT that
// arrives while the segment is tracked for another fill (p.trackFills: a
// retry of it that arrived after the origin's next fill began) changes
// nothing else: that fill's seal and tracking are its own to end. An
// ABORT that names neither (the one a fill sends before its TRACK, a
// home move's undo after its fill's own ABORT, or an older origin's)
// unseals as ever, and is not remembered; the fill it ends the tracking
// of is (endTrackedFill). It runs under p.handing, so
// that a SEAL that completes late, after its origin gave up on it, either
// notes its push before this check or fails for the unseal or the
// remembered ABORT, and so that a TRACK runs wholly before or after it.
func (p *core) abortOut(r *record, seg record, req *poolv1.MoveOutRequest) error {
	p.handing.Lock()
	defer p.handing.Unlock()
	p.waitSealing(seg.ID)
	if m, ok := moveOf(seg.ID, req); ok {
		if m.fill == 0 {
			node, id, ok, err := p.st.pushed(&seg)
			if err != nil {
				return err
			}
			if ok && node == m.node && id == m.id {
				return fmt.Errorf("%w (target %s, id %d there)", errHandedOver, node, id)
			}
		}
		p.aborted.add(m, time.Now())
		if other := p.trackFills.of(seg.ID); m.fill != 0 && other != 0 && other != m.fill && p.tracked(seg.ID) {
			p.log.Debug("a fill's ABORT after the next fill's TRACK leaves that fill be", "segment", seg.ID, "aborted", m, "tracked", fmt.Sprintf("fill %#x", other))
			return nil
		}
	}
	p.endTrackedFill(seg.ID, req.Fill)
	p.pushing.retire(seg.ID)
	// A copy whose writes are held until its origin sets its
	// forwarding again (replicate.go) stays sealed: a rebuild that
	// sealed it ends with Replicate, which releases it.
	if !p.fwd.holding(seg.ID) {
		p.unsealData(seg.ID)
	}
	return p.setSealed(r, false) // and the push note with the seal
}

// handOver notes that seg's last chunks reached target (putPushed) and
// hands the segment over: the segment's clients that know the copy (the
// moving notice) go there on their next MOVED, rather than through their
// daemon once the SEAL's answer reached it. Under p.handing, it checks
// first that the SEAL's caller still waits for it (an origin that gave
// up asks STATUS and may undo the move), that its move or fill is still
// the segment's (ended: no ABORT of it, nor a later fill's TRACK, ran
// since the last take of changed chunks), and that no ABORT unsealed the
// segment since it was sealed.
func (p *core) handOver(ctx context.Context, r *record, seg record, req *poolv1.MoveOutRequest) error {
	target := req.Target
	p.handing.Lock()
	defer p.handing.Unlock()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("the SEAL's caller gave up before the handover: %w", err)
	}
	if err := p.ended(seg.ID, req); err != nil {
		return err
	}
	p.mu.Lock()
	sealed := p.segs[seg.ID] == r && r.Sealed
	p.mu.Unlock()
	if !sealed {
		return fmt.Errorf("segment %d: an ABORT unsealed it or it was freed during the SEAL: %w", seg.ID, errs.ErrSegmentChanging)
	}
	if err := p.st.putPushed(&seg, target); err != nil {
		return err
	}
	if len(target.Key) == len(rdma.Key{}) {
		if err := p.dp.handover(seg.ID, rdma.MoveToken(rdma.Key(target.Key), target.HomeId)); err != nil {
			p.log.Debug("hand over a sealed segment", "segment", seg.ID, "err", err)
		}
	}
	return nil
}

// moveOutSubject finds the segment of a MoveOut step and checks it: an
// rdma segment this node serves, c's, not lost, and a known phase. It
// returns the record in the table and a copy of it to read outside p.mu.
func (p *core) moveOutSubject(c caller, req *poolv1.MoveOutRequest) (*record, record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(req.HomeId, "")
	if err != nil {
		return nil, record{}, err
	}
	what := fmt.Sprintf("move segment %d away (%s)", r.ID, req.Phase)
	switch {
	case r.Owner != c.id():
		return nil, record{}, fmt.Errorf("%s: %w: it belongs to %s, not to the caller %s", what, errs.ErrAccessDenied, r.Owner, c.id())
	case p.dp == nil || r.Key.IsZero() || r.Home != "":
		return nil, record{}, fmt.Errorf("%s: %w: it is not an rdma segment this node's data plane serves", what, errs.ErrInvalid)
	case r.Lost:
		return nil, record{}, fmt.Errorf("%s: %w", what, errs.ErrSegmentLost)
	case poolv1.MoveOutPhase_name[int32(req.Phase)] == "":
		return nil, record{}, fmt.Errorf("move segment %d away: %w: unknown phase %d; use TRACK, DIRTY, PUSH, SEAL, COMMIT, ABORT or STATUS", r.ID, errs.ErrInvalid, req.Phase)
	}
	return r, *r, nil
}

// letGo lets a segment go once its move committed elsewhere: the
// record goes first (a crash after it leaves nothing here; a failed
// commit leaves the segment sealed for the mover to retry), then the data
// plane withdraws it (MOVED for its key from then on) and its memory is
// released.
func (p *core) letGo(r *record, id uint64) error {
	p.mu.Lock()
	if p.segs[id] != r {
		p.mu.Unlock()
		return fmt.Errorf("segment %d: %w: freed meanwhile", id, errs.ErrNotFound)
	}
	p.hide(r) // nobody else frees it meanwhile, nor takes its name
	p.mu.Unlock()
	if err := p.st.delete(r); err != nil {
		p.mu.Lock()
		p.link(r)
		p.mu.Unlock()
		return fmt.Errorf("commit to the metadata store: %w", err)
	}
	p.stopForwarding(id)
	p.dp.moveAway(id)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropName(r)
	p.release(r, "freed")
	p.log.Debug("segment moved away", "segment", r.ID, "owner", r.Owner, "size", r.Size)
	return nil
}

// moveStatus answers where the switch-over of seg's move to target
// stands: sealed; its last chunks pushed to target (a SEAL answered); its
// writes tracked (no restart since TRACK). A sealed segment whose push is
// not noted and whose writes are not tracked was never answered a SEAL:
// the push was cut short by a restart.
func (p *core) moveStatus(seg record, target *poolv1.SegmentHome, resp *poolv1.MoveOutResponse) error {
	if target == nil || target.Node == "" {
		return fmt.Errorf("%w: STATUS names no target (node and home id)", errs.ErrInvalid)
	}
	node, id, ok, err := p.st.pushed(&seg)
	if err != nil {
		return err
	}
	_, untracked := p.dp.srv.Chunk(seg.ID)
	resp.Sealed, resp.Pushed, resp.Tracked = seg.Sealed, ok && node == target.Node && id == target.HomeId, untracked == nil
	return nil
}

// pushedPrefix starts the meta bucket's keys of the source's notes that a
// SEAL pushed a segment's last chunks to its move's target, each followed
// by the segment's id as 8 big-endian bytes; the value is the target's id
// there as 8 big-endian bytes, then its node name. A note is in the file
// of the segment's record: it lasts as long as the segment's memory, and
// no longer than the record's seal (store.put and store.delete remove it
// in the transaction that commits the record unsealed or removes it).
var pushedPrefix = []byte("pushed/")

func pushedKey(id uint64) []byte {
	return binary.BigEndian.AppendUint64(bytes.Clone(pushedPrefix), id)
}

// putPushed commits the note that r's last chunks reached target.
func (s *store) putPushed(r *record, target *poolv1.SegmentHome) error {
	v := append(binary.BigEndian.AppendUint64(nil, target.HomeId), target.Node...)
	return s.fileFor(r).update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Put(pushedKey(r.ID), v) }, false)
}

// pushed reads r's note: the target node and id its last chunks reached.
func (s *store) pushed(r *record) (node string, id uint64, ok bool, err error) {
	err = s.fileFor(r).db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketMeta).Get(pushedKey(r.ID))
		if len(v) <= 8 {
			return nil // none (a shorter value is none that can match)
		}
		node, id, ok = string(v[8:]), binary.BigEndian.Uint64(v), true
		return nil
	})
	return node, id, ok, err
}

// dirtyOf takes the chunks of segment id changed since the last call, if
// step req's move or fill is still the segment's (whileCurrent), and sets
// their count in resp.
func (p *core) dirtyOf(id uint64, req *poolv1.MoveOutRequest, resp *poolv1.MoveOutResponse) ([]byte, error) {
	var bm []byte
	var n int
	err := p.whileCurrent(id, req, func() (err error) {
		bm, n, err = p.dp.dirty(id)
		return err
	})
	resp.DirtyChunks = uint32(n)
	return bm, err
}

// whileCurrent runs do under p.handing if step req's move or fill is
// still segment id's: not aborted (p.aborted), and the segment's writes
// tracked for its fill (p.trackFills; for none, if it names none) or not
// tracked at all (then the chunks' take fails, as after a restart).
// Otherwise it returns errMoveAborted and do does not run. moveOut checks
// the first before it runs a step, but an ABORT or a later fill's TRACK
// (which ends the fill the segment was tracked for: endTrackedFill) may
// run between that check and the step's taking of changed chunks or
// sealing: do is where those run, then, so that a late step of an ended
// fill cannot take the next fill's changed chunks (the next fill's copy
// would lack writes this home acknowledged) nor seal for it. do must not
// wait on the network: every MoveOut step of this node takes p.handing.
func (p *core) whileCurrent(id uint64, req *poolv1.MoveOutRequest, do func() error) error {
	if hook := p.cfg.sim.moveOutRecheck; hook != nil {
		hook(req)
	}
	p.handing.Lock()
	defer p.handing.Unlock()
	p.waitSealing(id)
	if err := p.ended(id, req); err != nil {
		return err
	}
	return do()
}

// ended returns errMoveAborted if step req's move or fill is no longer
// segment id's (whileCurrent), nil if it is. Under p.handing.
func (p *core) ended(id uint64, req *poolv1.MoveOutRequest) error {
	if m, ok := moveOf(id, req); ok && p.aborted.has(m) {
		return fmt.Errorf("%w (%s)", errMoveAborted, m)
	}
	if fill := p.trackFills.of(id); fill != req.Fill && p.tracked(id) {
		owner := "a move or fill that names none"
		if fill != 0 {
			owner = fmt.Sprintf("fill %#x", fill)
		}
		return fmt.Errorf("%w (its writes are tracked for %s since)", errMoveAborted, owner)
	}
	return nil
}

// sealData seals segment id in the data plane for SEAL req, if its move
// or fill is still the segment's (whileCurrent). The seal waits out the
// writes in flight, a stalled one's payload up to the data plane's
// interrupt, which is not to hold p.handing (and every other segment's
// steps): the segment is noted as sealing (p.sealing) instead, and a
// TRACK or ABORT of it, or another check, waits until it is sealed
// (waitSealing), so that none runs between the check and the seal.
func (p *core) sealData(seg record, req *poolv1.MoveOutRequest) error {
	done := make(chan struct{})
	if err := p.whileCurrent(seg.ID, req, func() error {
		if p.sealing == nil {
			p.sealing = make(map[uint64]chan struct{})
		}
		p.sealing[seg.ID] = done
		return nil
	}); err != nil {
		return err
	}
	err := p.dp.seal(seg.ID, seg.Owner)
	p.handing.Lock()
	delete(p.sealing, seg.ID)
	p.handing.Unlock()
	close(done)
	return err
}

// waitSealing returns, under p.handing, once no SEAL is sealing segment
// id (sealData); it lets p.handing go while it waits.
func (p *core) waitSealing(id uint64) {
	for done := p.sealing[id]; done != nil; done = p.sealing[id] {
		p.handing.Unlock()
		<-done
		p.handing.Lock()
	}
}

// unsealOut undoes a SEAL that failed: it unseals segment id and commits
// r unsealed, unless the SEAL's move or fill is no longer the segment's
// (whileCurrent): the ABORT or TRACK that ended it left the seal and the
// tracking as they are to be, another fill's by now perhaps.
func (p *core) unsealOut(r *record, id uint64, req *poolv1.MoveOutRequest) error {
	err := p.whileCurrent(id, req, func() error {
		p.unsealData(id)
		return p.setSealed(r, false)
	})
	if errors.Is(err, errMoveAborted) {
		return nil
	}
	return err
}

// unsealData serves segment id again and stops tracking it (and forgets
// the fill it was tracked for); one that was not sealed or tracked is
// fine as it is.
func (p *core) unsealData(id uint64) {
	if err := p.dp.unseal(id); err != nil {
		p.log.Debug("unseal a segment", "segment", id, "err", err)
	}
	p.trackFills.drop(id)
}

// setSealed commits r's sealed flag (a restarted home seals it again when
// it re-exports it).
func (p *core) setSealed(r *record, sealed bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.segs[r.ID] != r { // r.ID under p.mu: r is the table's
		return fmt.Errorf("segment %d: %w: freed meanwhile", r.ID, errs.ErrNotFound)
	}
	if r.Sealed == sealed {
		return nil
	}
	next := *r
	next.Sealed = sealed
	if err := p.st.put(&next); err != nil {
		return fmt.Errorf("commit to the metadata store: %w", err)
	}
	*r = next
	return nil
}

// isShared reports whether segment seg has a coherence directory here: a
// sharer attached it since this daemon started.
func (h *coherenceHost) isShared(seg uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.homes[seg] != nil
}

// resealData seals a restored segment whose record says a move of it was
// at its switch-over when this daemon stopped: operations stay refused
// (but the mover's reads) until the mover commits or aborts.
func (p *core) resealData(r *record) error {
	if err := p.dp.seal(r.ID, r.Owner); err != nil {
		return fmt.Errorf("seal segment %d again, as a move left it: %w", r.ID, err)
	}
	return nil
}

const (
	// abortedMax bounds the moves abortedMoves remembers (under 200 KiB
	// of them), the oldest forgotten first.
	abortedMax = 1024
	// abortedFor is how long abortedMoves remembers a move: well beyond
	// moveStepTimeout, which bounds the SEAL's call at the origin and,
	// from its arrival, its handler's context here.
	abortedFor = 6 * moveStepTimeout
)

// abortedMoves remembers, on this node as the source of moves, the moves
// and fills whose ABORT named them (moveOf): the origin undid them and
// frees the target's copy. A step of one that arrives after its ABORT
// (its call failed at the origin before the handler ran) is refused
// (errMoveAborted, lateRefused). Without that, once a later move's (or
// fill's) TRACK has the segment's writes tracked again (the ABORT stopped
// tracking them, and a push fails without), a PUSH or SEAL of it would
// take that move's changed chunks and push them to the aborted move's
// copy, which the later move's copy then lacks (a fill's DIRTY would take
// them too, and its TRACK start the tracking afresh); a SEAL would also
// seal the segment and hand it over to that copy, where a client told of
// it would write until it is freed, and other clients bounce until the
// later move seals or aborts. Each is remembered for abortedFor, at most
// abortedMax of them. Nothing survives a restart, and needs not: a step
// in flight is lost with the connection it came on, and the origin sends
// none again. Safe for concurrent use.
type abortedMoves struct {
	mu   sync.Mutex
	at   map[abortedMove]abortedAt
	ring []abortedMove // abortedMax moves, the one at n%abortedMax overwritten next
	n    uint64        // ABORTs remembered so far
}

// abortedMove names one move of a segment from this node: the segment's
// id here and either the fill it is (MoveOutRequest.fill: a rebuild's or
// a home move's, which may fill the same new home again after a failure)
// or its target's copy (node and id there), which each move of a whole
// segment allocates anew.
type abortedMove struct {
	seg  uint64
	fill uint64
	node string
	id   uint64
}

// String names m for messages.
func (m abortedMove) String() string {
	if m.fill != 0 {
		return fmt.Sprintf("fill %#x", m.fill)
	}
	return fmt.Sprintf("target %s, id %d there", m.node, m.id)
}

// moveOf names the move or fill of segment seg that step req belongs to:
// its fill, if it names one, else its target; ok is false for a step
// that names neither.
func moveOf(seg uint64, req *poolv1.MoveOutRequest) (m abortedMove, ok bool) {
	switch {
	case req.Fill != 0:
		return abortedMove{seg: seg, fill: req.Fill}, true
	case req.Target != nil && req.Target.Node != "":
		return abortedMove{seg: seg, node: req.Target.Node, id: req.Target.HomeId}, true
	}
	return abortedMove{}, false
}

// lateRefused reports whether a step of phase that names an aborted move
// is refused: those that track, take or push the segment's changes, or
// seal it. (A move of a whole segment names its target on PUSH and SEAL
// only.) ABORT, COMMIT and STATUS only settle the move's end.
func lateRefused(phase poolv1.MoveOutPhase) bool {
	switch phase {
	case poolv1.MoveOutPhase_MOVE_OUT_TRACK, poolv1.MoveOutPhase_MOVE_OUT_DIRTY, poolv1.MoveOutPhase_MOVE_OUT_PUSH, poolv1.MoveOutPhase_MOVE_OUT_SEAL:
		return true
	}
	return false
}

// abortedAt is when a move's last ABORT ran, and its number
// (abortedMoves.n), which names its slot in the ring.
type abortedAt struct {
	time time.Time
	n    uint64
}

// add remembers move m, aborted at now.
func (a *abortedMoves) add(m abortedMove, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.at == nil {
		a.at = make(map[abortedMove]abortedAt)
		a.ring = make([]abortedMove, abortedMax)
	}
	// The slot's move is forgotten unless a later ABORT of it is in
	// another slot.
	slot := a.n % abortedMax
	if a.n >= abortedMax {
		if old := a.ring[slot]; a.at[old].n == a.n-abortedMax {
			delete(a.at, old)
		}
	}
	a.ring[slot] = m
	a.at[m] = abortedAt{time: now, n: a.n}
	a.n++
}

// has reports whether move m was aborted here less than abortedFor ago.
func (a *abortedMoves) has(m abortedMove) bool {
	a.mu.Lock()
	at, ok := a.at[m]
	a.mu.Unlock()
	return ok && time.Since(at.time) < abortedFor
}

// trackFills is, on this node as the source of moves, the fill
// (MoveOutRequest.fill) whose TRACK started the tracking of each
// segment's writes, for the segments a fill's TRACK tracked last. It is
// in memory as the tracking is (the data plane's, which a restart ends).
// An entry outlives the tracking only until the segment's next TRACK,
// unseal or move away; readers check that the segment is still tracked.
// Safe for concurrent use.
type trackFills struct {
	mu sync.Mutex
	m  map[uint64]uint64
}

// of returns the fill segment id was last tracked for, 0 for none.
func (t *trackFills) of(id uint64) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.m[id]
}

// set notes that segment id is tracked for fill (0: a move or fill that
// names none).
func (t *trackFills) set(id, fill uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if fill == 0 {
		delete(t.m, id)
		return
	}
	if t.m == nil {
		t.m = make(map[uint64]uint64)
	}
	t.m[id] = fill
}

// drop forgets segment id's fill: its tracking ended.
func (t *trackFills) drop(id uint64) { t.set(id, 0) }
