package pool

import (
	"context"
)

// The attachments of a moved segment at its new home. A move authorizes
// the segment's attachers at the target when it allocates the copy there
// (mover.run, moveTier); clients attach and detach meanwhile at the
// source, which the record names until the switch-over. Once switched,
// the target is told who may use the copy as the record says then
// (tellHome): a client attached meanwhile gets access there, and one
// detached meanwhile loses it. The withdrawal matters most: the target
// serves the copy to every principal its record names, so a client left
// there would keep reading and writing a segment no longer its own with
// any credential the target delegates to it (one for another segment of
// its there will do). What cannot be told now is retried in the
// background (tellLater) until told, and every try reads the record as it
// is then: the client may have attached again, or the segment gone
// elsewhere, meanwhile.

// syncAttachers tells the target of a switched move, over the move's
// session, who may use the segment's copy there; what fails is retried in
// the background.
func (m *mover) syncAttachers() {
	ctx, cancel := context.WithTimeout(context.Background(), moveStepTimeout)
	defer cancel()
	if err := m.p.tellHome(ctx, m.dst, m.to, m.rec.ID); err != nil {
		m.p.log.Warn("moved segment: its new home is not told yet of the attachments made or withdrawn during the move; retrying (a client detached meanwhile may use it there until then)", "segment", m.rec.ID, "node", m.to, "err", err)
		m.p.tellLater(m.rec.ID)
	}
}
