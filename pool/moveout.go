// This file holds the source side of a live move (docs/MOVE.md): the
// MoveOut steps a peer daemon asks of the home of a segment it placed here
// while it copies the segment to another home.

package pool

import (
	"context"
	"errors"
	"fmt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
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
		resp, err = s.d.pool.moveOut(c, req)
	}
	if err != nil {
		s.d.refused("move-out", c, req.HomeId, "", err)
		return nil, errs.ToStatus(err)
	}
	return resp, nil
}

// moveOut runs one MoveOut step on segment req.HomeId, which c must own.
func (p *core) moveOut(c caller, req *poolv1.MoveOutRequest) (*poolv1.MoveOutResponse, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(req.HomeId, "")
	if err != nil {
		return nil, err
	}
	what := fmt.Sprintf("move segment %d away (%s)", r.ID, req.Phase)
	switch {
	case r.Owner != c.id():
		return nil, fmt.Errorf("%s: %w: it belongs to %s, not to the caller %s", what, errs.ErrAccessDenied, r.Owner, c.id())
	case p.dp == nil || r.Key.IsZero() || r.Home != "":
		return nil, fmt.Errorf("%s: %w: it is not an rdma segment this node's data plane serves", what, errs.ErrInvalid)
	case r.Lost:
		return nil, fmt.Errorf("%s: %w", what, errs.ErrSegmentLost)
	}
	resp := &poolv1.MoveOutResponse{}
	switch req.Phase {
	case poolv1.MoveOutPhase_MOVE_OUT_TRACK:
		if req.Chunk < moveChunkMin || req.Chunk&(req.Chunk-1) != 0 {
			return nil, fmt.Errorf("%s: %w: chunk of %d bytes; use a power of two from %d", what, errs.ErrInvalid, req.Chunk, moveChunkMin)
		}
		if p.dp.coh.isShared(r.ID) {
			return nil, fmt.Errorf("%s: %w: it is a shared segment, whose pages sharers cache under leases from this home's coherence directory; it is not moved (detach its sharers and allocate a new segment where it should live)", what, errs.ErrInvalid)
		}
		err = p.dp.track(r.ID, req.Chunk)
	case poolv1.MoveOutPhase_MOVE_OUT_DIRTY:
		resp.Dirty, err = p.dirtyOf(r, resp)
	case poolv1.MoveOutPhase_MOVE_OUT_SEAL:
		if err = p.dp.seal(r.ID, r.Owner); err != nil {
			break
		}
		if err = p.setSealed(r, true); err != nil {
			p.unsealData(r)
			break
		}
		if resp.Dirty, err = p.dirtyOf(r, resp); err != nil {
			// Not tracked (this daemon restarted since TRACK): the
			// changes are unknown, and the move cannot go on.
			p.unsealData(r)
			err = errors.Join(err, p.setSealed(r, false))
		}
	case poolv1.MoveOutPhase_MOVE_OUT_COMMIT:
		// The record goes first: a crash after it leaves nothing here, a
		// failed commit leaves the segment sealed for the mover to retry.
		if err = p.st.delete(r); err != nil {
			err = fmt.Errorf("%s: commit to the metadata store: %w", what, err)
			break
		}
		p.dp.moveAway(r.ID)
		p.unlink(r)
		p.release(r, "freed")
		p.log.Debug("segment moved away", "segment", r.ID, "owner", r.Owner, "size", r.Size)
	case poolv1.MoveOutPhase_MOVE_OUT_ABORT:
		p.unsealData(r)
		err = p.setSealed(r, false)
	default:
		return nil, fmt.Errorf("move segment %d away: %w: unknown phase %d; use TRACK, DIRTY, SEAL, COMMIT or ABORT", r.ID, errs.ErrInvalid, req.Phase)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	return resp, nil
}

// dirtyOf takes the chunks of r changed since the last call and sets their
// count in resp.
func (p *core) dirtyOf(r *record, resp *poolv1.MoveOutResponse) ([]byte, error) {
	bm, n, err := p.dp.dirty(r.ID)
	resp.DirtyChunks = uint32(n)
	return bm, err
}

// unsealData lets writes at r again and stops tracking; a segment that was
// not sealed or tracked is fine as it is.
func (p *core) unsealData(r *record) {
	if err := p.dp.unseal(r.ID); err != nil {
		p.log.Debug("unseal a segment", "segment", r.ID, "err", err)
	}
}

// setSealed commits r's sealed flag (a restarted home seals it again when
// it re-exports it). Called with p.mu held.
func (p *core) setSealed(r *record, sealed bool) error {
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
