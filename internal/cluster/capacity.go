package cluster

import (
	"encoding/binary"
	"math"
	"reflect"
	"slices"
)

// Capacity updates. A node's free bytes change with every allocation, and
// sending each change as a new Meta makes it a memberlist alive message:
// about 150 bytes that every node must receive and retransmit, of which a
// gossip round carries only a few thousand per node, however many nodes
// there are. At 200 simulated hosts and 300 allocations a second those
// messages queued for tens of rounds (docs/scale.md). So when SetMeta
// changes nothing but free bytes, the node gossips a capacity update
// instead: its name, boot, a sequence number and the free bytes of each
// tier, about 30 bytes, riding in the space memberlist leaves in its gossip
// packets (delegate.GetBroadcasts), replaced in every queue by the node's
// next one, and passed on by every node that finds it news, like
// memberlist's own broadcasts. The Meta carries the sequence number of the
// newest update it includes (stamp.capSeq), so that a receiver applies an
// update only over an older Meta, whichever arrives first; push/pull
// carries every node's newest update for those that missed it.

// msgCapacity is the first byte of a capacity update:
//
//	+---------+-----------+-------------+------+---------+---------+-----------------+
//	| 0x03    | boot (8B) | name length | name | seq     | ntiers  | ntiers x free   |
//	| 1 byte  | big endian| uvarint     |      | uvarint | uvarint | uvarint         |
//	+---------+-----------+-------------+------+---------+---------+-----------------+
//
// The free bytes are in the order of the tiers in the node's Meta.
const msgCapacity = 0x03

// maxNodeName bounds a node name in leave announcements and capacity
// updates.
const maxNodeName = 128

// capUpdate is one node's free bytes per tier, as of its capacity sequence
// number seq. A value that is never modified once made.
type capUpdate struct {
	name string
	boot uint64
	seq  uint64
	free []int64
}

func (u capUpdate) encode() []byte {
	b := make([]byte, 0, 1+8+2+len(u.name)+2*binary.MaxVarintLen64+len(u.free)*5)
	b = append(b, msgCapacity)
	return u.appendBody(b)
}

// appendBody appends u without its type byte, as push/pull lists it.
func (u capUpdate) appendBody(b []byte) []byte {
	b = binary.BigEndian.AppendUint64(b, u.boot)
	b = appendString(b, u.name)
	b = binary.AppendUvarint(b, u.seq)
	b = binary.AppendUvarint(b, uint64(len(u.free)))
	for _, f := range u.free {
		b = binary.AppendUvarint(b, uint64(f))
	}
	return b
}

// decodeCapacity parses a capacity update; ok is false for anything else.
func decodeCapacity(b []byte) (capUpdate, bool) {
	if len(b) < 1 || b[0] != msgCapacity {
		return capUpdate{}, false
	}
	r := metaReader{b: b[1:]}
	u := r.capBody()
	return u, r.err == nil
}

// capBody reads one capacity update without its type byte.
func (r *metaReader) capBody() capUpdate {
	var u capUpdate
	if r.err == nil && len(r.b) < 8 {
		r.fail("capacity update: %d bytes, the boot alone is 8", len(r.b))
	}
	if r.err != nil {
		return u
	}
	u.boot = binary.BigEndian.Uint64(r.b)
	r.b = r.b[8:]
	u.name = r.str("node name", maxNodeName)
	u.seq = r.uvarint("capacity sequence", math.MaxUint64)
	n := int(r.uvarint("tier count", MaxTiers))
	if r.err == nil && u.name == "" {
		r.fail("capacity update without a node name")
	}
	if r.err == nil && n > 0 {
		u.free = make([]int64, n)
		for i := range u.free {
			u.free[i] = int64(r.uvarint("tier free", math.MaxInt64))
		}
	}
	if r.err != nil {
		return capUpdate{}
	}
	return u
}

// freeOnly reports whether b differs from a in nothing but free bytes, so
// that a capacity update can carry the change. Every other field is
// compared, whatever fields Meta gains: a change a capacity update cannot
// carry must go out as a new Meta.
func freeOnly(a, b Meta) bool {
	if len(a.Tiers) != len(b.Tiers) {
		return false
	}
	for i, t := range b.Tiers {
		if t.Name != a.Tiers[i].Name || t.Capacity != a.Tiers[i].Capacity {
			return false
		}
	}
	a.Tiers, b.Tiers = nil, nil
	return reflect.DeepEqual(a, b)
}

// withFree returns m with u's free bytes, each capped at its tier's
// capacity (the Meta may predate a capacity change that u follows). m's
// Tiers are not modified. ok is false when u does not fit m's tiers.
func withFree(m Meta, u *capUpdate) (Meta, bool) {
	if len(u.free) != len(m.Tiers) {
		return m, false
	}
	m.Tiers = slices.Clone(m.Tiers)
	for i := range m.Tiers {
		m.Tiers[i].Free = min(u.free[i], m.Tiers[i].Capacity)
	}
	return m, true
}

// onCapacity records a capacity update from a peer, from push/pull or from
// this node's own SetMeta, and reports whether it was news (so that the
// caller passes it on). An update applies to the boot it names, over a Meta
// (and any update) with a lower sequence number; one that arrives before
// the Meta it follows is kept until that Meta comes.
func (c *Cluster) onCapacity(u capUpdate) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.members[u.name]
	if r == nil || r.m.MetaErr != nil || r.m.Boot != u.boot || deadOrLeft(r.m.State) ||
		u.seq <= r.metaSeq || (r.cap != nil && u.seq <= r.cap.seq) {
		return false
	}
	r.cap = &u
	if m, ok := withFree(r.base, r.cap); ok {
		r.m.Meta, r.m.MetaAt = m, c.now()
		c.publishLocked(EventUpdate, r.m.clone())
	}
	return true
}

// capacitySet encodes every member's newest capacity update for push/pull.
// Caller holds c.mu.
//
//	+---------+----------------------------------------------+
//	| count   | count x capacity update without its 0x03 byte |
//	| uvarint |                                              |
//	+---------+----------------------------------------------+
func (c *Cluster) appendCapacitySetLocked(b []byte) []byte {
	var us []*capUpdate
	for _, r := range c.members {
		if r.cap != nil && !deadOrLeft(r.m.State) && len(us) < maxLeaveSet {
			us = append(us, r.cap)
		}
	}
	b = binary.AppendUvarint(b, uint64(len(us)))
	for _, u := range us {
		b = u.appendBody(b)
	}
	return b
}

// decodeCapacitySet calls fn for each update of a capacity set; it stops
// at the first malformed byte.
func decodeCapacitySet(r *metaReader, fn func(capUpdate)) {
	n := r.uvarint("capacity set count", maxLeaveSet)
	for i := uint64(0); i < n && r.err == nil; i++ {
		if u := r.capBody(); r.err == nil {
			fn(u)
		}
	}
}
