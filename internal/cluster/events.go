package cluster

import "fmt"

// EventKind says what happened to a member.
type EventKind uint8

// The event kinds. Within one subscription, events about one node arrive in
// the order this node learned of the changes.
const (
	// EventJoin: a node this Cluster did not know (or had forgotten) is alive.
	EventJoin EventKind = iota + 1
	// EventAlive: a node known as dead or left is alive again (a restart, a
	// healed partition, a false failure detection).
	EventAlive
	// EventUpdate: an alive node's metadata changed, or it announced Leave
	// (Member.Leaving).
	EventUpdate
	// EventLeave: the node left gracefully (State Left). It may follow
	// EventDead for the same node when the leave announcement arrives after
	// the failure notice; treat EventLeave as the final word.
	EventLeave
	// EventDead: the failure detector declared the node dead (State Dead).
	EventDead
)

// String names the kind: "join", "alive", "update", "leave", "dead".
func (k EventKind) String() string {
	switch k {
	case EventJoin:
		return "join"
	case EventAlive:
		return "alive"
	case EventUpdate:
		return "update"
	case EventLeave:
		return "leave"
	case EventDead:
		return "dead"
	default:
		return fmt.Sprintf("event(%d)", uint8(k))
	}
}

// Event is one membership change. A value; Member is a copy the receiver owns.
type Event struct {
	// Kind is what happened.
	Kind EventKind
	// Member is the node right after the change.
	Member Member
	// Seq numbers this Cluster's events from 1 without gaps; a subscriber
	// that sees a gap lost events to its full buffer and should resync with
	// Members.
	Seq uint64
}

// subscription is one Subscribe call's buffer. Guarded by Cluster.mu.
type subscription struct {
	ch chan Event
}

// Subscribe returns a channel of membership events from now on and a
// function that ends the subscription and closes the channel (idempotent).
// Shutdown closes every subscription's channel.
//
// The channel holds Config.EventBuffer events. When it is full the oldest
// queued event is dropped (Stats.EventsDropped counts it, and Seq shows the
// gap), so a slow subscriber never holds up gossip. To start from a complete
// picture, subscribe first, then read Members, then apply events: an event
// may repeat a change Members already showed.
func (c *Cluster) Subscribe() (<-chan Event, func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.subs == nil { // shut down
		ch := make(chan Event)
		close(ch)
		return ch, func() {}
	}
	s := &subscription{ch: make(chan Event, c.cfg.EventBuffer)}
	c.subs[s] = struct{}{}
	return s.ch, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if _, ok := c.subs[s]; ok {
			delete(c.subs, s)
			close(s.ch)
		}
	}
}

// publishLocked hands e to every subscriber without blocking, dropping each
// full subscriber's oldest event. Caller holds c.mu, which makes this the
// only sender on every subscription channel.
func (c *Cluster) publishLocked(kind EventKind, m Member) {
	c.seq++
	e := Event{Kind: kind, Member: m, Seq: c.seq}
	for s := range c.subs {
		if len(c.subs) > 1 {
			e.Member = m.clone() // each subscriber owns its copy
		}
		for {
			select {
			case s.ch <- e:
			default:
				select {
				case <-s.ch:
					c.dropped.Add(1)
				default:
				}
				continue
			}
			break
		}
	}
}
