package alloc

import (
	"context"
	"fmt"
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
// A load/store segment (TierLocal, TierCXL) moves to TierRDMA, and an rdma
// segment to TierLocal or TierCXL of its daemon's host: see Client.Move.
func ToTier(t Tier) MoveOption { return func(o *moveOptions) { o.tier = t } }

// Move moves a segment while it is in use, keeping its id, name, size and
// bytes (docs/MOVE.md).
//
// An rdma segment moves to another home (ToNode, or one the daemon picks):
// the daemon copies it, seals the old home for the switch-over (operations
// wait a moment, none is lost or applied twice), and commits the new home.
// After Move returns, its next operation goes to the new home (Node names
// it). Other clients of the segment follow on their next operation.
//
// A segment changes tier with ToTier:
//
//   - Demotion, TierLocal or TierCXL to TierRDMA: this client gives up its
//     mapping first, so a slice from Bytes must not be used once Move is
//     called (as after Close), and Bytes returns false afterwards; calls
//     on the segment wait during the move (the pause is the whole copy),
//     then go to the new rdma home with ReadAt, WriteAt and the atomics.
//     While another client maps the segment (or this client maps it
//     through another Segment value), Move fails with ErrInUse naming
//     them, and nothing changes: each lets go with Segment.Close (or
//     Client.Close, or by ending), then Move succeeds.
//   - Promotion, TierRDMA to TierLocal or TierCXL (the host of this
//     client's daemon): calls go on at the old home during the copy, wait
//     at the switch-over, and then use the mapping (Bytes returns it).
//     Only a client of the local poold's unix socket promotes (ErrNotSupported
//     over TCP), and only while no other client may reach the segment
//     (its owner and attachers with a session or a lease: ErrInUse naming
//     them). A client that reaches the segment over the data plane after
//     it was promoted gets ErrNotSupported and opens it again.
//
// A shared attachment (Attach with Shared) has its pages cached under
// leases from its home, and moving between two load/store tiers is not
// live: Move refuses them (ErrInvalid, ErrNotSupported); allocate a new
// segment where it should live, copy the bytes, and free the old one. A
// redundant segment (WithRedundancy) is refused with ErrNotSupported: the
// pool places its copies or shards and rebuilds a lost one elsewhere
// itself.
//
// Errors: ErrNotFound when the node named is no alive member (the message
// lists them) or the segment was freed during the move, ErrInvalid when
// the node drains or is the segment's home already, ErrInUse as above,
// ErrLimit while another move of the segment is under way, ErrNoCapacity
// when no node or tier has room (or this host has no such tier),
// ErrAccessDenied when the caller may not move it, ErrUnavailable when the
// daemon or the segment's home cannot be reached. A failed move leaves the
// segment where it was, whole and usable.
func (c *Client) Move(ctx context.Context, s *Segment, opts ...MoveOption) error {
	var o moveOptions
	for _, opt := range opts {
		opt(&o)
	}
	if s == nil {
		return fmt.Errorf("move: %w: no segment", ErrInvalid)
	}
	if s.closedNow() {
		return fmt.Errorf("move segment %d: %w", s.ID(), ErrClosed)
	}
	from := s.Tier()
	r, ok := s.base().(*remote)
	_, redundant := s.base().(*redundant)
	switch {
	case redundant:
		return fmt.Errorf("move segment %d: %w: it is redundant (%s); its copies or shards are placed and rebuilt by the pool, one per host, and are not moved one by one", s.ID(), ErrNotSupported, redundancyFromProto(s.info.Redundancy))
	case from == TierRDMA && !ok:
		return fmt.Errorf("move segment %d: %w: this is a shared attachment, whose pages its sharers cache under leases from its home; shared segments are not moved", s.ID(), ErrInvalid)
	case o.tier != TierAny && o.tier != TierRDMA && o.tier != TierLocal && o.tier != TierCXL:
		return fmt.Errorf("move segment %d to tier %d: %w: use TierRDMA, TierLocal or TierCXL", s.ID(), o.tier, ErrInvalid)
	case o.tier == TierAny || o.tier == from:
		if from != TierRDMA {
			return fmt.Errorf("move segment %d: %w: it is on the %s tier, this host's memory, and moves only to the rdma tier (ToTier(TierRDMA))", s.ID(), ErrInvalid, from)
		}
	case from != TierRDMA && o.tier != TierRDMA:
		return fmt.Errorf("move segment %d from the %s tier to the %s tier: %w: between two load/store tiers a segment does not move live; allocate one on the %s tier, copy, and free this one", s.ID(), from, o.tier, ErrNotSupported, o.tier)
	case from != TierRDMA:
		return c.demote(ctx, s, o)
	default:
		return c.promote(ctx, s, o)
	}
	resp, err := c.moveCall(ctx, s, o)
	if err != nil {
		return err
	}
	r.adopt(resp.Segment) // the answer describes it at its new home, as Stat would
	return nil
}
