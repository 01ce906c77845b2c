package alloc

import (
	"context"
	"fmt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// MoveOption configures Client.Move. Options are immutable values, safe to
// share.
type MoveOption func(*moveOptions)

type moveOptions struct {
	node string
	tier Tier
}

// ToNode names the node a segment moves to. Default: the daemon picks an
// alive node with room that does not drain, as for a new segment.
func ToNode(name string) MoveOption { return func(o *moveOptions) { o.node = name } }

// ToTier names the tier a segment moves to. Default (TierAny): its own.
// Only TierRDMA is accepted: see Client.Move.
func ToTier(t Tier) MoveOption { return func(o *moveOptions) { o.tier = t } }

// Move moves an rdma segment to another home while it is in use, by this
// client and by others: the daemon copies it, seals the old home for the
// switch-over (operations wait a moment, none is lost or applied twice),
// and commits the new home. The segment keeps its id, name, size and bytes;
// after Move returns, its next operation goes to the new home (Node names
// it). Other clients of the segment follow on their next operation.
//
// Only segments on the rdma tier move. A load/store segment (TierLocal,
// TierCXL) is mapped into the application, which would go on using the
// old memory, and a shared attachment (Attach with Shared) has its pages
// cached under leases from its home; Move refuses both with an error
// matching ErrInvalid. To move such memory, allocate a new segment where it
// should live, copy the bytes, and free the old one.
//
// Errors: ErrNotFound when the node named is no alive member (the message
// lists them), ErrInvalid when it drains or is the segment's home already,
// ErrLimit while another move of the segment is under way, ErrNoCapacity
// when no node has room, ErrAccessDenied when the caller may not move it,
// ErrUnavailable when the daemon or the segment's home cannot be reached.
// A failed move leaves the segment where it was, whole and usable.
func (c *Client) Move(ctx context.Context, s *Segment, opts ...MoveOption) error {
	var o moveOptions
	for _, opt := range opts {
		opt(&o)
	}
	if s == nil {
		return fmt.Errorf("move: %w: no segment", ErrInvalid)
	}
	if s.closed.Load() {
		return fmt.Errorf("move segment %d: %w", s.ID(), ErrClosed)
	}
	r, ok := s.base().(*remote)
	switch {
	case o.tier != TierAny && o.tier != TierRDMA:
		return fmt.Errorf("move segment %d to the %s tier: %w: only rdma segments move, within the rdma tier; a load/store segment is mapped into the application: allocate one on the %s tier, copy, and free this one", s.ID(), o.tier, ErrInvalid, o.tier)
	case !ok && s.Tier() == TierRDMA:
		return fmt.Errorf("move segment %d: %w: this is a shared attachment, whose pages its sharers cache under leases from its home; shared segments are not moved", s.ID(), ErrInvalid)
	case !ok:
		return fmt.Errorf("move segment %d: %w: it is on the %s tier, mapped into this process (load/store), and only rdma segments move: allocate a new segment where it should live, copy, and free this one", s.ID(), ErrInvalid, s.Tier())
	}
	cctx, _, err := c.callCtx(ctx)
	if err != nil {
		return err
	}
	resp, err := c.api.Move(cctx, &poolv1.MoveRequest{Id: s.ID(), ToNode: o.node, ToTier: o.tier.proto()})
	if err != nil {
		return errs.FromStatus(err)
	}
	r.adopt(resp.Segment) // the answer describes it at its new home, as Stat would
	return nil
}
