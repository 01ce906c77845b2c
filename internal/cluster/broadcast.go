package cluster

import (
	"cmp"
	"math"
	"slices"
	"sync"
	"time"
)

// broadcastQueue holds the leave announcements and capacity updates this
// node gossips and hands them to memberlist's gossip packets, in the room
// its own messages leave: the fewest transmissions first and, among those,
// the most recently queued first, each until it has gone out limit() times
// (transmits: memberlist's retransmit limit and RetransmitMult more).
// A message replaces the queued one with the same key, unless that one is
// a newer capacity update.
//
// It replaces memberlist.TransmitLimitedQueue, which (v0.7.0) loses
// messages without a trace: it orders them in a btree by transmissions,
// length and an id, and restarts its ids at 1 whenever it runs empty for
// a moment (after every packet that took all it held), so a new message
// can get the id of one still queued, and once the two have been sent
// equally often, the tree holds only one of them. Capacity updates all
// have about the same length: driven as a relaying node at 200 nodes
// drives it, it lost 5 to 6 in 20,000 (docs/scale.md). The message lost
// may be the node's own update, which then reaches no peer but the next
// push/pull partner.
//
// The queue also repairs a lost wave of the node's own newest capacity
// update, which is what every placement on this node depends on: gossip
// sends it only to limit() random peers, and if those all lose it (their
// receive queues overflowed while the process stalled) no node passes it
// on and push/pull, which memberlist spaces out to minutes at a few
// hundred nodes, is the only repair. So once an update has gone out
// limit() times, the queue sends it again to fanout peers (one gossip
// round's worth) repairRounds[i] gossip rounds later, for each i, unless a
// newer update replaced it. A peer that already has the update ignores it
// and does not pass it on, so a repair costs fanout small packets' worth
// of bytes; a peer that missed the wave applies it and starts the
// epidemic again.
//
// Safe for concurrent use.
type broadcastQueue struct {
	limit  func() int    // transmissions per message
	fanout int           // peers per gossip round (memberlist's GossipNodes)
	round  time.Duration // the gossip interval
	now    func() time.Time

	mu    sync.Mutex
	items map[string]*queued
	stamp uint64    // increases with every queued message
	sort  []*queued // get's scratch space

	// own is this node's newest capacity update; repairs counts the
	// repairs done for it and repairAt is when the next is due (zero
	// while the update is queued).
	own      *gossipBroadcast
	repairs  int
	repairAt time.Time
	repaired uint64 // repairs done, all updates

	// fit is set when a gossip packet took every queued message or found
	// none queued, and cleared by crowded; waiting is whether messages
	// were queued at crowded's last look (the overflow lane's signals).
	fit, waiting bool
}

// repairRounds are the gossip rounds, after an own capacity update's last
// transmission and after each repair's, until the next repair: about 1 s,
// 4 s and 16 s later at the lan profile's 200 ms.
var repairRounds = []int{5, 20, 80}

// queued is one message in a broadcastQueue.
type queued struct {
	b         *gossipBroadcast
	transmits int    // times sent so far
	stamp     uint64 // queue order: higher is newer
}

func newBroadcastQueue(limit func() int, fanout int, round time.Duration) *broadcastQueue {
	return &broadcastQueue{limit: limit, fanout: max(fanout, 1), round: round, now: time.Now, items: make(map[string]*queued)}
}

// transmits is how many times the queue sends each message in a cluster
// of n nodes: memberlist's retransmit limit, mult*ceil(log10(n+1)), and
// mult more. Every node that finds a message news sends it that often to
// random peers, so a node misses a whole wave with probability about
// e^-transmits: with memberlist's limit, 12 at 200 nodes, one wave in
// about 800 missed a node somewhere (199 nodes times e^-12), and that node
// placed on stale free bytes until its next push/pull, two minutes away
// at 200 nodes. With 16 it is one wave in about 45,000, for a third more
// bytes of capacity updates (some 30 bytes each, in room memberlist's own
// messages leave).
func transmits(mult, n int) int {
	return mult * (int(math.Ceil(math.Log10(float64(n+1)))) + 1)
}

// queue adds b, replacing a queued message with the same key unless that
// one is a capacity update with a higher sequence number (then b is
// dropped: concurrent callers may queue updates out of order). own marks
// this node's own capacity update, which the queue repairs.
func (q *broadcastQueue) queue(b *gossipBroadcast, own bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	old := q.items[b.key]
	if (old != nil && old.b.seq > b.seq) || (own && q.own != nil && q.own.seq > b.seq) {
		b.finished()
		return
	}
	if old != nil {
		old.b.finished()
	}
	if own {
		q.own, q.repairs, q.repairAt = b, 0, time.Time{}
	}
	q.push(b, 0)
}

// push queues b as already sent transmits times. Caller holds q.mu.
func (q *broadcastQueue) push(b *gossipBroadcast, transmits int) {
	q.stamp++
	q.items[b.key] = &queued{b: b, transmits: transmits, stamp: q.stamp}
}

// get returns the messages to add to a gossip packet: as many as fit in
// limit bytes with overhead bytes each. own counts those that are this
// node's own capacity updates.
func (q *broadcastQueue) get(overhead, limit int) (msgs [][]byte, own int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs, own, left := q.packLocked(overhead, limit)
	q.fit = q.fit || !left
	return msgs, own
}

// overflow is get for the overflow lane's packets (lane.go): it does not
// count as a gossip packet that took what was queued.
func (q *broadcastQueue) overflow(overhead, limit int) (msgs [][]byte, own int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	msgs, own, _ = q.packLocked(overhead, limit)
	return msgs, own
}

// crowded reports whether messages were queued at the last call and
// still are, and no gossip packet took all that were queued in between
// (memberlist's own messages left too little room, or none, which it does
// not offer), and starts a new period. A message queued since the last
// call does not count: the lane's timer and memberlist's gossip timer
// tick at the same interval but not in step, so it may not have met a
// gossip packet yet.
func (q *broadcastQueue) crowded() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.repairLocked()
	c := q.waiting && len(q.items) > 0 && !q.fit
	q.fit, q.waiting = false, len(q.items) > 0
	return c
}

// packLocked picks the messages for a packet of limit bytes, overhead
// bytes each, and counts their transmissions; left reports that some
// stayed behind for lack of room. Caller holds q.mu.
func (q *broadcastQueue) packLocked(overhead, limit int) (msgs [][]byte, own int, left bool) {
	q.repairLocked()
	if len(q.items) == 0 {
		return nil, 0, false
	}
	all := q.sort[:0]
	for _, it := range q.items {
		all = append(all, it)
	}
	slices.SortFunc(all, func(a, b *queued) int {
		if c := cmp.Compare(a.transmits, b.transmits); c != 0 {
			return c
		}
		return cmp.Compare(b.stamp, a.stamp)
	})
	sends := q.limit()
	used := 0
	for _, it := range all {
		n := overhead + len(it.b.msg)
		if used+n > limit {
			left = true
			continue // a smaller one may fit
		}
		used += n
		msgs = append(msgs, it.b.msg)
		if it.b == q.own {
			own++
		}
		if it.transmits++; it.transmits >= sends {
			delete(q.items, it.b.key)
			it.b.finished()
			if it.b == q.own && q.repairs < len(repairRounds) {
				q.repairAt = q.now().Add(time.Duration(repairRounds[q.repairs]) * q.round)
			}
		}
	}
	clear(all)
	q.sort = all[:0]
	return msgs, own, left
}

// repairLocked queues the own capacity update again when a repair is due:
// for fanout transmissions. Caller holds q.mu.
func (q *broadcastQueue) repairLocked() {
	if q.repairAt.IsZero() || q.now().Before(q.repairAt) {
		return
	}
	q.repairAt = time.Time{}
	if _, queued := q.items[q.own.key]; queued {
		return
	}
	q.repairs++
	q.repaired++
	q.push(q.own, max(q.limit()-q.fanout, 0))
}

// stats returns how many messages are queued and how many repairs of own
// capacity updates the queue made.
func (q *broadcastQueue) stats() (queued int, repaired uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items), q.repaired
}

// gossipBroadcast is a leave announcement or a capacity update in the
// broadcast queue. A newer message with the same key (kind and node)
// replaces an older one.
type gossipBroadcast struct {
	key  string
	msg  []byte
	seq  uint64        // a capacity update's sequence number; 0 for a leave announcement
	sent chan struct{} // closed when the queue is done with it; may be nil
	once sync.Once
}

// finished closes b.sent, once.
func (b *gossipBroadcast) finished() {
	if b.sent != nil {
		b.once.Do(func() { close(b.sent) })
	}
}
