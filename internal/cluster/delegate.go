package cluster

import (
	"encoding/binary"

	"github.com/hashicorp/memberlist"
)

// delegate receives memberlist's callbacks for one Cluster. Every method
// copies what it needs and returns without waiting on anything but the
// Cluster's table mutex, which is never held across a call into memberlist
// (memberlist calls the event methods with its own node lock held).
type delegate struct{ c *Cluster }

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.EventDelegate    = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
)

// NodeMeta returns the encoded own Meta. The encoder never produces more
// than memberlist.MetaMaxSize bytes, the only limit memberlist passes.
func (d *delegate) NodeMeta(limit int) []byte {
	b := *d.c.enc.Load()
	if len(b) > limit {
		return nil // unreachable with memberlist v0.7.0; peers would see ErrBadMeta
	}
	return b
}

// NotifyMsg receives user messages gossiped by peers: leave announcements
// and capacity updates, alone or batched by a peer's overflow lane
// (lane.go). News is passed on, so that it spreads like memberlist's own
// broadcasts (even if a leaving node shuts down soon). Unknown messages
// are ignored so that newer nodes can add kinds.
func (d *delegate) NotifyMsg(b []byte) {
	if d.closed() {
		return
	}
	if msgs, ok := decodeBatch(b); ok {
		for _, m := range msgs {
			d.notifyOne(m)
		}
		return
	}
	d.notifyOne(b)
}

// notifyOne applies one leave announcement or capacity update and queues
// it for gossip if it was news.
func (d *delegate) notifyOne(b []byte) {
	if name, boot, ok := decodeLeave(b); ok {
		if d.c.onLeave(name, boot) {
			d.c.bcast.queue(&gossipBroadcast{key: "leave/" + name, msg: append([]byte(nil), b...)}, false)
		}
		return
	}
	if u, ok := decodeCapacity(b); ok && d.c.onCapacity(u) {
		d.c.bcast.queue(&gossipBroadcast{key: "cap/" + u.name, msg: append([]byte(nil), b...), seq: u.seq}, false)
	}
}

// GetBroadcasts hands queued leave announcements and capacity updates to
// memberlist's gossip, in the room its own messages leave in a packet.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	d.c.ctr.broadcastCalls.Add(1)
	d.c.ctr.broadcastRoom.Add(uint64(limit))
	msgs, own := d.c.bcast.get(overhead, limit)
	d.c.ctr.capacitySends.Add(uint64(own))
	return msgs
}

// LocalState adds the leave announcements and capacity updates this node
// knows to memberlist's periodic push/pull, so that a node which missed one
// (broadcasts are retransmitted only a few times) still learns that a dead
// peer had left, and every node's newest free bytes.
func (d *delegate) LocalState(bool) []byte {
	return d.c.pushState()
}

// MergeRemoteState applies a peer's leave announcements and capacity
// updates from push/pull.
func (d *delegate) MergeRemoteState(b []byte, _ bool) {
	if d.closed() {
		return
	}
	decodePushState(b,
		func(name string, boot uint64) { d.c.onLeave(name, boot) },
		func(u capUpdate) { d.c.onCapacity(u) })
}

// NotifyJoin: a node became alive (new, or back from dead or left).
func (d *delegate) NotifyJoin(n *memberlist.Node) {
	if !d.closed() {
		d.c.onAlive(n.Name, n.Address(), append([]byte(nil), n.Meta...))
	}
}

// NotifyUpdate: an alive node's metadata changed.
func (d *delegate) NotifyUpdate(n *memberlist.Node) {
	if !d.closed() {
		d.c.onAlive(n.Name, n.Address(), append([]byte(nil), n.Meta...))
	}
}

// NotifyLeave: a node was declared dead or left. memberlist v0.7.0 does not
// say which (the Node's State field is never set), hence leave announcements.
func (d *delegate) NotifyLeave(n *memberlist.Node) {
	if !d.closed() {
		d.c.onGone(n.Name)
	}
}

// closed reports that the Cluster shut down: what memberlist still hands
// it then (a contact or a join still under way, which Shutdown does not
// wait for) changes nothing, so that Members keeps the last table.
func (d *delegate) closed() bool { return d.c.state.Load() == closed }

// NotifyConflict: another node claims a known name at another address.
// memberlist logs it and keeps the member it knows; record it for Stats,
// Conflicts and Join.
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	d.c.onConflict(existing, other)
}

// msgLeave is the first byte of a leave announcement:
//
//	+---------+-----------+-------------+------+
//	| 0x01    | boot (8B) | name length | name |
//	| 1 byte  | big endian| uvarint     |      |
//	+---------+-----------+-------------+------+
const msgLeave = 0x01

func encodeLeave(name string, boot uint64) []byte {
	b := make([]byte, 0, 1+8+binary.MaxVarintLen64+len(name))
	b = append(b, msgLeave)
	b = binary.BigEndian.AppendUint64(b, boot)
	return appendString(b, name)
}

// decodeLeave parses a leave announcement; ok is false for anything else.
func decodeLeave(b []byte) (name string, boot uint64, ok bool) {
	if len(b) < 10 || b[0] != msgLeave {
		return "", 0, false
	}
	boot = binary.BigEndian.Uint64(b[1:9])
	n, k := binary.Uvarint(b[9:])
	if k <= 0 || n > maxNodeName || uint64(len(b)-9-k) != n || n == 0 {
		return "", 0, false
	}
	return string(b[9+k:]), boot, true
}

// msgLeaveSet starts the push/pull extra: the leave announcements a node
// knows, then (since capacity updates) a capacity set (capacity.go), which
// readers that predate it ignore.
//
//	+---------+---------+--------------------------------------------+--------------+
//	| 0x02    | count   | count x (boot (8B), name length, name)      | capacity set |
//	| 1 byte  | uvarint | big endian, uvarint, bytes                  |              |
//	+---------+---------+--------------------------------------------+--------------+
const msgLeaveSet = 0x02

// maxLeaveSet bounds a leave set or a capacity set, on both sides.
const maxLeaveSet = 4096

func encodeLeaveSet(names []string, boots []uint64) []byte {
	b := []byte{msgLeaveSet}
	b = binary.AppendUvarint(b, uint64(len(names)))
	for i, name := range names {
		b = binary.BigEndian.AppendUint64(b, boots[i])
		b = appendString(b, name)
	}
	return b
}

// decodePushState calls leave for each entry of a leave set and capacity
// for each entry of the capacity set after it; it stops at the first
// malformed byte and ignores anything that is not a leave set.
func decodePushState(b []byte, leave func(name string, boot uint64), capacity func(capUpdate)) {
	if len(b) < 2 || b[0] != msgLeaveSet {
		return
	}
	r := metaReader{b: b[1:]}
	n := r.uvarint("count", maxLeaveSet)
	for i := uint64(0); i < n && r.err == nil; i++ {
		if len(r.b) < 8 {
			return
		}
		boot := binary.BigEndian.Uint64(r.b)
		r.b = r.b[8:]
		name := r.str("name", maxNodeName)
		if r.err == nil && name != "" {
			leave(name, boot)
		}
	}
	if r.err == nil && len(r.b) > 0 {
		decodeCapacitySet(&r, capacity)
	}
}
