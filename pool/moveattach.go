package pool

import (
	"context"
	"fmt"
	"slices"

	"github.com/farmem/farmem/internal/session"
)

// The attachments of a moved segment at its new home. A move authorizes
// the segment's attachers at the target when it allocates the copy there
// (mover.run, moveTier); clients attach and detach meanwhile at the
// source, which the record names until the switch-over. Once switched,
// the target is told what changed: a client attached meanwhile gets
// access there, and one detached (or whose attachment was revoked)
// meanwhile loses it. The withdrawal matters most: the target serves the
// copy to every principal its record names, so a client left there would
// keep reading and writing a segment no longer its own with any
// credential the target delegates to it (one for another segment of its
// there will do). What cannot be told now is retried in the background
// until told, and every try reads the record as it is then: the client
// may have attached again, or the segment gone elsewhere, meanwhile.

// attachSync is what a moved segment's target is to be told of the
// clients whose access there may differ from the record's. Used by one
// goroutine at a time (the switch-over's, then its retries').
type attachSync struct {
	seg    uint64 // the segment's id here
	node   string // the target
	homeID uint64 // the copy's id at the target
	// clients are those attached when the move began or at the
	// switch-over: a client attached later was told by its Attach,
	// straight at the target.
	clients []string
	// told is what the target answered last, per client: true for access
	// given, false for access withdrawn; a client missing is unknown (a
	// call that failed may or may not have been applied).
	told map[string]bool
}

// newAttachSync is the sync of a move of seg to node, whose copy there is
// homeID: began are the attachers when the move began (authorized there
// with the copy's allocation) and switched those at the switch-over.
func newAttachSync(seg uint64, node string, homeID uint64, began, switched []string) *attachSync {
	s := &attachSync{seg: seg, node: node, homeID: homeID, told: map[string]bool{}}
	for _, a := range began {
		s.told[a] = true
	}
	s.clients = slices.Concat(began, switched)
	slices.Sort(s.clients)
	s.clients = slices.Compact(s.clients)
	return s
}

// due is what the target is still to be told, as the record r says now
// (nil: freed): the clients to give access (attached) and those to
// withdraw it from (detached), each unless the target answered that last.
// done is when r names the copy no more: the segment was freed (the
// copy's node is asked to free it, core.release) or moved on from the
// target (whose copy is withdrawn from its data plane when that move
// commits, core.letGo), and nothing is left to tell.
func (s *attachSync) due(r *record) (allow, withdraw []string, done bool) {
	if r == nil || !slices.Contains(r.idsOn(s.node), s.homeID) {
		return nil, nil, true
	}
	for _, a := range s.clients {
		attached := slices.Contains(r.Attached, a)
		if told, known := s.told[a]; known && told == attached {
			continue
		}
		if attached {
			allow = append(allow, a)
		} else {
			withdraw = append(withdraw, a)
		}
	}
	return allow, withdraw, false
}

// syncAttachers tells the target of a switched move, copy id there, of
// the attachments made or withdrawn during the move (attached is the
// record's list at the switch-over); what fails is retried in the
// background (syncAttachLater).
func (m *mover) syncAttachers(attached []string, id uint64) {
	s := newAttachSync(m.rec.ID, m.to, id, m.rec.Attached, attached)
	ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
	defer cancel()
	if err := m.p.syncAttach(ctx, m.dst, s); err != nil {
		m.p.log.Warn("moved segment: its new home is not told yet of the attachments made or withdrawn during the move; retrying (a client detached meanwhile may use it there until then)", "segment", s.seg, "node", s.node, "err", err)
		m.p.syncAttachLater(s)
	}
}

// syncAttachLater retries syncAttach in the background over a session
// with the target (the move's may have ended), backing off from a second
// to 30 s, until the target is told, the record names the copy no more,
// or the daemon closes. A target that is down is asked again: a restarted
// one keeps its records, and with them the clients they name.
func (p *core) syncAttachLater(s *attachSync) {
	p.retryLater(func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(ctx, moveStepTimeout)
		defer cancel()
		pc, err := p.homeSession(ctx, s.node, "target")
		if err == nil {
			err = p.syncAttach(ctx, pc, s)
		}
		if err != nil {
			p.log.Debug("tell a moved segment's new home of its attachers: retrying", "segment", s.seg, "node", s.node, "err", err)
			return err
		}
		p.log.Info("moved segment: its new home was told of its attachers after a retry", "segment", s.seg, "node", s.node)
		return nil
	})
}

// syncAttach tells the target, over pc, what s.due says as the record is
// now, and reads the record again until nothing is due. An Attach or
// Detach committed meanwhile tells the target itself once committed
// (Daemon.authorizeAtHome: the record names the target), in any order
// with these calls: one committed before the next reading is told again
// from that reading, and one committed after it is told after these
// calls answered.
func (p *core) syncAttach(ctx context.Context, pc *session.Conn, s *attachSync) error {
	for {
		p.mu.Lock()
		var cur *record
		if r, ok := p.segs[s.seg]; ok {
			c := *r
			cur = &c
		}
		p.mu.Unlock()
		allow, withdraw, done := s.due(cur)
		if done || len(allow)+len(withdraw) == 0 {
			return nil
		}
		for _, a := range slices.Concat(allow, withdraw) {
			give := slices.Contains(allow, a)
			delete(s.told, a) // unknown until answered
			if err := authorizeOn(ctx, pc, s.homeID, a, !give); err != nil {
				return fmt.Errorf("moved segment %d: tell %s client %q attached %v: %w", s.seg, s.node, a, give, err)
			}
			s.told[a] = give
		}
	}
}
