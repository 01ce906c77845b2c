// This file holds the live move of one home of a redundant segment
// (docs/REDUNDANCY.md, "Moving a home"): when the host of a copy or shard
// evacuates, the origin places a replacement on another host, fills it
// with the rebuild's fill (rebuildfill.go) while the leaving home serves
// on, and switches the record over to it in the leaving home's place, so
// the segment never has fewer homes than its redundancy; then the
// forwarding is set again and the leaving home lets its copy go. The
// move's intent (moveintent.go) makes it durable: a restarted origin
// finishes a switched move and undoes any other.

package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// homeMovable checks that the home a peer asks to move (req.Home,
// req.HomeId) of the redundant segment r can move live (within the rdma
// tier, to a host placement picks: moveSubject refuses a request that
// names a node or tier).
func homeMovable(r *record, req *poolv1.MoveRequest) error {
	if r.Lost {
		return fmt.Errorf("move the home on %s of segment %d: %w: more homes are lost than %s covers", req.Home, r.ID, errs.ErrSegmentLost, r.Redundancy.spec())
	}
	return nil
}

// errHomeNotServing is a move of a home that is not OK: one being rebuilt
// moves once it serves.
var errHomeNotServing = errs.Sub(errs.ErrLimit, "the home is not serving yet (it is being rebuilt); its move waits")

// moveHome moves r's home on node (its id there homeID) to a host
// placement picks, without lowering r's redundancy meanwhile: the
// replacement is filled while the leaving home serves, then takes its
// place and role (the primary's or a data shard's too: the switch hands
// it over, with the writers sealed). moveSubject registered the move.
func (p *core) moveHome(ctx context.Context, r record, node string, homeID uint64, tls moveTLS) (res moveResult, err error) {
	res = moveResult{rec: r, from: node, fromTier: r.Tier}
	i := slices.IndexFunc(r.Homes, func(h homeRef) bool { return h.Node == node && h.HomeID == homeID })
	if i < 0 || r.Homes[i].State != poolv1.HomeState_HOME_STATE_OK {
		p.moving.end(r.ID)
		return res, fmt.Errorf("move the home on %s of segment %d: %w", node, r.ID, errHomeNotServing)
	}
	leaving := r.Homes[i]
	target, placed, err := p.placeHome(ctx, &r, nil)
	if err != nil {
		p.moving.end(r.ID)
		return res, fmt.Errorf("move the %s on %s of segment %d: %w", homeRoleName(&r, i), node, r.ID, err)
	}
	res.to = target.Node
	in := intent{ID: r.ID, From: node, FromID: homeID, To: target.Node, ToID: target.HomeID,
		FromAddr: leaving.DataAddr, FromKey: leaving.Key, FromEpoch: leaving.Epoch, FromTLS: leaving.DataTLS}
	p.moving.set(in)
	err = p.st.putIntent(in)
	placed() // the intent names the target (moves.held keeps it), or it is given up below
	if err != nil {
		p.moving.end(r.ID)
		p.freeLaterAt(target.Node, target.HomeID)
		return res, fmt.Errorf("move segment %d: commit the move intent: %w", r.ID, err)
	}
	p.log.Info("moving a home of a redundant segment", "segment", r.ID, "home", homeRoleName(&r, i), "from", node, "to", target.Node,
		"size", r.shardSize(), "redundancy", r.Redundancy.spec().String())
	var sw *pendingSwitch // from the writers' seal: Stat waits for the new homes
	defer func() {
		if err != nil {
			if sw != nil {
				sw.end()
			}
			p.abortMove(in, err)
		}
	}()
	var rate *rateLimit // the rebuilds' (--rebuild-rate), shared with them
	if p.rb != nil {
		rate = p.rb.rate
	}
	f, err := p.newFill(ctx, r, i, target, tls, rate, true)
	if err != nil {
		return res, err
	}
	defer f.close()
	f.progress = func(n int64) bool { return p.moving.progress(r.ID, n) && p.homeIs(r.ID, i, leaving) }
	f.beforeSeal = func() { sw = p.moving.sealing(r.ID) }
	err = f.run(ctx, func(ctx context.Context) error {
		next, err := p.switchHome(ctx, f, in, leaving)
		if err == nil {
			res.rec = next
			sw.announce(&next)
			sw.end()
			p.tellLater(r.ID) // the new home knows the owner alone (placeHome)
		}
		return err
	})
	res.bytes, res.rounds, res.pause = f.m.copied.Load(), f.m.res.rounds, f.m.res.pause
	if err == nil {
		p.log.Info("moved a home of a redundant segment", "segment", r.ID, "home", homeRoleName(&r, i), "from", node, "to", target.Node,
			"bytes", res.bytes, "rounds", res.rounds, "pause", res.pause)
	}
	return res, err
}

// homeRoleName names home i of r for messages: "primary", "backup 1",
// "data shard 2", "parity shard 0".
func homeRoleName(r *record, i int) string {
	k := r.Redundancy.Data
	switch {
	case k > 0 && i < k:
		return fmt.Sprintf("data shard %d", i)
	case k > 0:
		return fmt.Sprintf("parity shard %d", i-k)
	case i == 0:
		return "primary"
	}
	return fmt.Sprintf("backup %d", i)
}

// homeIs reports whether home i of segment id is still h (a home lost
// meanwhile ends the move: the rebuild takes over).
func (p *core) homeIs(id uint64, i int, h homeRef) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, ok := p.segs[id]
	return ok && !cur.Lost && sameHome(cur, i, h)
}

// switchHome is the switch of a home's move, the writers sealed and the
// target filled: a target that takes clients' writes (a primary, a data
// shard) is sealed too until it forwards them; the record naming the
// target in the leaving home's place and the intent marked switched are
// committed in one transaction; then finishSwitchedHome sets the
// forwarding, lets the leaving home go and unseals (in the background,
// retried, if it cannot now). It returns the record committed.
func (p *core) switchHome(ctx context.Context, f *rebuildFill, in intent, leaving homeRef) (record, error) {
	r, i, target := f.r, f.i, f.target
	if k := r.Redundancy.Data; k > 0 && i < k || k == 0 && i == 0 {
		for _, phase := range []poolv1.MoveOutPhase{poolv1.MoveOutPhase_MOVE_OUT_TRACK, poolv1.MoveOutPhase_MOVE_OUT_SEAL} {
			if _, err := moveOutAt(ctx, f.m.dst, target.HomeID, phase, f.m.chunk); err != nil {
				return record{}, fmt.Errorf("move segment %d: seal its new %s on %s until it forwards: %w", r.ID, homeRoleName(&r, i), target.Node, err)
			}
		}
	}
	next, err := p.commitHomeSwitch(r.ID, i, leaving, target, in, r.Epoch)
	if err != nil {
		return record{}, err
	}
	in.Switched = true
	p.moving.set(in)
	if err := p.finishSwitchedHome(ctx, in); err != nil {
		if errors.Is(err, errNewHomeLost) {
			// The leaving home took its place back; the move is undone
			// (moveHome: abortMove), its new home freed.
			return record{}, err
		}
		p.log.Warn("moved a home of a redundant segment: its homes are still to be told; retrying", "segment", r.ID, "from", in.From, "to", in.To, "err", err)
		p.resolveLater(in)
		return next, nil
	}
	p.moving.end(r.ID)
	if cur, ok := p.redundantRecord(r.ID); ok {
		next = cur // with the epochs replicate raised
	}
	return next, nil
}

// commitHomeSwitch commits the record of segment id with target, OK, as
// home i in place of leaving (which must still be there), and the intent
// in marked switched, in one transaction (store.switchMove). It returns
// the record committed. A replicated segment whose epoch is no longer
// epoch, the one its fill began at, is refused: a copy was promoted to
// primary meanwhile, which no seal held and which forwards its writes to
// the record's copies, the leaving home among them and not the target, so
// the target may lack writes it acknowledged; the move is undone and
// tried again.
//
// The commit is queued under p.mu, with the table switched in the same
// hold, so that any later change of the record is built on the switch
// and commits after it; its fsync is awaited outside p.mu, so that the
// daemon's other requests go on meanwhile. The table names the target
// before the commit is durable, which is safe because every writer of
// the segment is sealed from before this call (the fill's SEAL, and
// switchHome's of a target that takes writes) until finishHomeMove,
// which runs only once the commit is: no write or atomic is acknowledged
// while the switch is not durable, so the leaving home holds every
// acknowledged one. A crash then leaves the record naming the leaving
// home and the intent not switched, and the restarted origin undoes the
// move (every home unsealed, the target's copy freed) without losing a
// write; a client that learned of the target meanwhile is refused there
// and asks again. A commit that fails has the table switched back (and
// that committed, in case a later change committed the switch) before
// the move is undone.
func (p *core) commitHomeSwitch(id uint64, i int, leaving, target homeRef, in intent, epoch uint64) (record, error) {
	p.mu.Lock()
	cur, ok := p.segs[id]
	switch {
	case !ok:
		p.mu.Unlock()
		return record{}, fmt.Errorf("move segment %d: %w: it was freed during the move", id, errs.ErrNotFound)
	case cur.Lost || !sameHome(cur, i, leaving):
		p.mu.Unlock()
		return record{}, fmt.Errorf("move segment %d: its home %d on %s changed during the move (lost); a rebuild replaces it: %w", id, i, leaving.Node, errs.ErrSegmentChanging)
	case cur.Redundancy.Data == 0 && cur.Epoch != epoch:
		p.mu.Unlock()
		return record{}, fmt.Errorf("move segment %d: a copy became its primary during the move (epoch %d, the copy began at %d) and may have taken writes the new home lacks; the move is tried again: %w", id, cur.Epoch, epoch, errs.ErrSegmentChanging)
	}
	next := *cur
	next.Homes = slices.Clone(cur.Homes)
	h := target
	h.State, h.Rebuilt = poolv1.HomeState_HOME_STATE_OK, 0
	// replicate raises the copy's epoch to the record's; clients then use
	// that one.
	h.Epoch = max(h.Epoch, cur.Epoch)
	next.Homes[i] = h
	next.settle()
	wait := p.st.switchMove(&next, in)
	*cur = next
	// Reconcile keeps the leaving home's copy, which the table no longer
	// names, until the move is switched for good or undone.
	held := in
	held.switching = true
	p.moving.set(held)
	p.mu.Unlock()
	if err := wait(); err != nil {
		err = fmt.Errorf("move segment %d: commit the switch-over: %w", id, errors.Join(err, p.unswitchHome(id, i, leaving, target)))
		// A replicate meanwhile sent the switched record: the homes
		// forward to the target then, and are told the restored one.
		p.replicateLater(id)
		return record{}, err
	}
	return next, nil
}

// errNewHomeLost is a switched home move whose new home the record no
// longer names OK (its node no longer holds it, or is dead or cut off)
// before the leaving home was let go, and the segment is lost without it.
// The writers are sealed from before the switch until the leaving home is
// let go, so it holds every acknowledged write: it took its place back
// (keepLeaving), never let go for a copy that is gone or out of reach.
var errNewHomeLost = errs.Sub(errs.ErrUnavailable, "the home move's new home was lost before the leaving home was let go; the leaving home is kept")

// keepLeaving puts the leaving home of move in (its copy as the intent
// holds it) back as a home of its segment in place of the target, which
// the record names but not OK (errNewHomeLost), and commits that (a
// restart then finds the move not switched: loadMoves); then the homes
// are told how the record writes them, before the move's undo unseals
// them (or in the background, if they cannot be now). The target, lost
// or unreachable, leaves the record; its copy is freed with the undo.
//
// The leaving home is put back only while its node still holds its copy:
// it has not let it go (COMMIT, which comes before any writer is
// unsealed), so it holds every acknowledged write; and only while no
// copy that no seal held was promoted to primary since (the record's
// epoch is still the leaving home's). A node that cannot be asked now is
// asked again at the next try; the writers stay sealed meanwhile.
func (p *core) keepLeaving(ctx context.Context, in intent) error {
	if cur, ok := p.moving.get(in.ID); ok && cur.To == in.To && cur.ToID == in.ToID {
		in = cur // a try since may have given the leaving home up (forgetLeaving)
	}
	leaving, known := in.leaving()
	if !known {
		return fmt.Errorf("move segment %d: the move intent does not hold the leaving home's copy on %s (an intent of an older poold, or a leaving home given up); the move waits for its new home: %w", in.ID, in.From, errs.ErrSegmentChanging)
	}
	held, ok := p.reconcile(ctx, in.From)
	switch {
	case !ok:
		return fmt.Errorf("move segment %d: %s cannot be asked whether it still holds the leaving home; asking again: %w", in.ID, in.From, errs.ErrHomeUnreachable)
	case !held[in.FromID]:
		return fmt.Errorf("move segment %d: %s no longer holds the leaving home %d; the move waits for its new home: %w", in.ID, in.From, in.FromID, errs.ErrSegmentChanging)
	}
	var drop []homeRef
	next, err := p.updateRecord(in.ID, func(r *record) error {
		j := in.targetAt(r)
		if j < 0 || r.Homes[j].State == poolv1.HomeState_HOME_STATE_OK {
			return fmt.Errorf("segment %d: its new home on %s changed meanwhile: %w", in.ID, in.To, errs.ErrSegmentChanging)
		}
		if r.Redundancy.Data == 0 && r.Epoch > leaving.Epoch {
			// A promotion (its epoch) made a copy that no seal held the
			// primary since the move began: it may have acknowledged
			// writes the leaving home never got.
			return fmt.Errorf("segment %d: a copy became its primary under epoch %d since the move began (the leaving home's is %d), and may have taken writes the leaving home missed; the move waits for its new home: %w", in.ID, r.Epoch, leaving.Epoch, errs.ErrSegmentChanging)
		}
		back := leaving
		back.Epoch = max(leaving.Epoch, r.Homes[j].Epoch)
		r.Homes[j] = back
		drop = r.serveAgain()
		return nil
	})
	if err != nil {
		return fmt.Errorf("move segment %d: put the leaving home on %s back: %w", in.ID, leaving.Node, err)
	}
	for _, h := range drop {
		p.peers.freeLater(h.Node, h.HomeID)
	}
	p.log.Warn("a home move's new home was lost before the leaving home was let go; the leaving home is kept", "segment", in.ID, "leaving", leaving.Node, "new", in.To, "lost", next.Lost)
	if err := p.replicate(ctx, &next); err != nil {
		p.replicateLater(in.ID)
	}
	p.rebuildSoon(in.ID)
	return nil
}

// forgetLeaving commits move in without its leaving home's copy, before
// the writers serve without that home, which did not answer its COMMIT
// (finishSwitchedHome): should its node come back with the copy, neither
// a retry nor a restarted origin puts it back (keepLeaving).
func (p *core) forgetLeaving(in intent) error {
	in.FromAddr, in.FromKey, in.FromEpoch, in.FromTLS = "", rdma.Key{}, 0, false
	if err := p.st.putIntent(in); err != nil {
		return fmt.Errorf("move segment %d: forget the leaving home on %s in the move intent: %w", in.ID, in.From, err)
	}
	p.moving.set(in)
	return nil
}

// unswitchHome puts leaving back as home i of segment id in place of
// target, after the commit of their switch failed, and commits that.
func (p *core) unswitchHome(id uint64, i int, leaving, target homeRef) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, ok := p.segs[id]
	if !ok || cur.Homes[i].Node != target.Node || cur.Homes[i].HomeID != target.HomeID {
		return nil // freed, or changed meanwhile and committed so
	}
	back := *cur
	back.Homes = slices.Clone(cur.Homes)
	back.Homes[i] = leaving
	back.settle()
	*cur = back
	if err := p.st.put(&back); err != nil {
		return fmt.Errorf("commit the record without the switch: %w", err)
	}
	return nil
}

// finishHomeMove finishes the move of a home in (resolve's part for a
// redundant segment): a switched one as finishSwitchedHome says. One not
// switched, or whose leaving home took its place back, is undone: every
// home unsealed (the leaving one serves on), the target's copy freed.
// The intent goes last.
func (p *core) finishHomeMove(ctx context.Context, in intent) error {
	if in.Switched {
		err := p.finishSwitchedHome(ctx, in)
		if !errors.Is(err, errNewHomeLost) {
			return err
		}
		in.Switched = false // the leaving home is back: undone as not switched
	}
	if r, ok := p.redundantRecord(in.ID); ok && !r.Lost {
		p.unsealHomes(r, "")
	}
	in.undoing = true // the target's copy is an orphan now
	p.moving.set(in)
	p.freeLaterAt(in.To, in.ToID)
	return p.dropIntent(in)
}

// finishSwitchedHome finishes a switched home move: every home told how
// the record writes it now (replicate), the leaving home let go (MoveOut
// COMMIT: its key answers MOVED, its copy is freed) while the writers are
// still sealed, so no client reads it after a write it would miss; then
// the target unsealed before the others, which forward to it once they
// serve. A new home the record no longer names OK (lost or unreachable)
// while the segment is lost without it is no copy to let the leaving home
// go for: the leaving home takes its place back (keepLeaving) and
// errNewHomeLost is reported, the move to be undone; so too when an
// earlier try put it back.
func (p *core) finishSwitchedHome(ctx context.Context, in intent) error {
	r, ok := p.redundantRecord(in.ID)
	if ok && !in.switchedIn(&r) {
		return fmt.Errorf("move segment %d: %w", in.ID, errNewHomeLost)
	}
	ok = ok && !r.Lost
	var err error
	if ok {
		err = p.replicateJoining(ctx, &r, &homeRef{Node: in.To, HomeID: in.ToID})
	}
	// The replicate may have found the new home gone (homeMissing), or
	// its node died since the switch (before or after a restart of this
	// daemon). Without it the segment may be lost: the leaving home is
	// then the copy that holds its writes. (One not lost without it lets
	// the leaving home go, and the new home is rebuilt.)
	if cur, found := p.redundantRecord(in.ID); found && cur.Lost && !in.targetOK(&cur) {
		if crash := p.cfg.sim.newHomeLost; crash != nil && crash(in.ID) {
			return fmt.Errorf("move segment %d: %w: the test stopped the origin before the leaving home was put back", in.ID, errs.ErrUnavailable)
		}
		if kerr := p.keepLeaving(ctx, in); kerr != nil {
			return errors.Join(fmt.Errorf("move segment %d: its new home %d on %s is lost, and the segment without it; the leaving home is not back yet: %w", in.ID, in.ToID, in.To, kerr), err)
		}
		return fmt.Errorf("move segment %d: %w (new home %d on %s)", in.ID, errNewHomeLost, in.ToID, in.To)
	}
	if err != nil {
		return err
	}
	pc, err := p.homeSession(ctx, in.From, "leaving home")
	if err == nil {
		_, err = moveOutAt(ctx, pc, in.FromID, poolv1.MoveOutPhase_MOVE_OUT_COMMIT, 0)
	}
	if err != nil && !errors.Is(err, errs.ErrNotFound) {
		if !p.nodeGone(in.From) {
			return fmt.Errorf("let the leaving home on %s go: %w", in.From, err)
		}
		// A gone node frees the copy at its next reconcile: no record
		// names it once the intent goes. The writers serve without it
		// from now on: the intent forgets it first (forgetLeaving).
		if err := p.forgetLeaving(in); err != nil {
			return err
		}
	}
	if ok {
		if slices.Contains(r.idsOn(in.To), in.ToID) { // a lost one has nothing to unseal
			if pc, err = p.homeSession(ctx, in.To, "new home"); err == nil {
				_, err = moveOutAt(ctx, pc, in.ToID, poolv1.MoveOutPhase_MOVE_OUT_ABORT, 0)
			}
			if err != nil && !errors.Is(err, errs.ErrNotFound) {
				return fmt.Errorf("unseal the new home on %s: %w", in.To, err)
			}
		}
		p.unsealHomes(r, in.To)
	}
	return p.dropIntent(in)
}

// unsealHomes asks every home of r that is not lost, but the one on skip,
// to ABORT a move (unseal, stop tracking), retrying in the background.
// The ABORT names no fill: the fill of an undone move ABORTed its own
// (rebuildFill.unseal) when it failed, and an intent does not keep it. A
// writer a kill of this daemon left sealed meanwhile, the intent gone, is
// unsealed after its restart (replicateLater, unsealIdle).
func (p *core) unsealHomes(r record, skip string) {
	for _, h := range r.Homes {
		if h.State != poolv1.HomeState_HOME_STATE_LOST && h.Node != skip {
			p.unsealAt(h.Node, h.HomeID, 0)
		}
	}
}

// dropIntent removes the intent of a finished move.
func (p *core) dropIntent(in intent) error {
	if err := p.st.deleteIntent(in.ID); err != nil {
		return fmt.Errorf("remove the move intent: %w", err)
	}
	return nil
}

// isHomeMove reports whether the intent in moves a home of a redundant
// segment (its record here is redundant).
func (p *core) isHomeMove(in intent) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.segs[in.ID]
	return ok && r.redundant()
}

// get returns where the move of segment id stands; false when none is
// under way.
func (ms *moves) get(id uint64) (intent, bool) {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	in := ms.m[id]
	if in == nil {
		return intent{}, false
	}
	return *in, true
}

// progress notes n bytes copied by the move of segment id; false when no
// move of it is under way.
func (ms *moves) progress(id uint64, n int64) bool {
	ms.mu.Lock()
	defer ms.mu.Unlock()
	in := ms.m[id]
	if in == nil {
		return false
	}
	in.copied = n
	return true
}

// markMoving marks, among homes (segment id's, as the API describes
// them), the one a move fills a replacement for: the node it goes to,
// and the bytes copied so far.
func (ms *moves) markMoving(id uint64, homes []*poolv1.SegmentHome) {
	ms.mu.Lock()
	in := ms.m[id]
	var cp intent
	if in != nil {
		cp = *in
	}
	ms.mu.Unlock()
	if in == nil || cp.Switched || cp.undoing || cp.ToID == 0 {
		return
	}
	for _, h := range homes {
		if h.Node == cp.From && h.HomeId == cp.FromID {
			h.MovingTo, h.RebuiltBytes = cp.To, cp.copied
		}
	}
}
