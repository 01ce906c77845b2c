package cluster

import (
	"math/rand/v2"
	"time"
)

// Reconnecting to failed members. memberlist never contacts a member it
// declared dead again: it stops probing it at once, gossips to it for
// GossipToTheDeadTime and then forgets it. Two nodes that declared each
// other dead and forgot each other (a partition, a long stall) meet again
// only when a third node's gossip or push/pull brings news of one to the
// other, and a node that missed a member's refutation lists it dead until
// its next push/pull, every few minutes at a few hundred nodes. So each
// node keeps the members it saw die (not those that left) for
// reconnectFor and exchanges state with each of them itself, as Join
// does: reconnectFirst after the death, then at doubling intervals up to
// reconnectMax, each spread by half either way so that the nodes that saw
// one death do not contact it together.
//
// What a contact with a node that is back does: the node merges this
// node's view, in which it is dead, as a suspicion, and refutes it (a
// newer incarnation, gossiped); this node learns of it by that gossip, or
// at once from the push/pull when the node had refuted before (the
// refutation this node missed); and two nodes that had forgotten each
// other each list the other alive from the push/pull itself. A contact
// with a node still gone fails at once (refused) or after the transport's
// timeout (twice it, when a peer accepts and never answers). One contact
// runs at a time per node; Shutdown does not wait for it (it ends on its
// own). For one crashed host of 200 the whole cluster sends it about 1.7
// contacts a second once every interval reached reconnectMax. Serf does
// the same with a per-cluster budget (one contact per failed member per
// 30 s, by coin toss), which leaves a node whose own view lags waiting for
// minutes.
//
// A contact merges whatever cluster now answers at the address. A
// cluster with gossip keys merges only with one that holds its key; one
// without keys (plaintext gossip) merges with any, and an address handed
// to another cluster's node within reconnectFor (a Kubernetes pod's IP)
// would join the two: reconnectFor is kept short for that reason.
const (
	reconnectFirst = 5 * time.Second
	reconnectMax   = 2 * time.Minute
	// reconnectFor is how long a failed member is contacted: a partition
	// that outlasts it heals only through the seeds (the daemon contacts
	// every seed it does not list alive).
	reconnectFor = 15 * time.Minute
	// reconnectTick is how often the loop looks for a failed member due.
	reconnectTick = time.Second
	// maxFailed bounds the failed members kept; past it a new death is
	// not kept (the oldest are the likeliest to be gone for good, but
	// they are not dropped for it: a partition declares half the cluster
	// dead at once).
	maxFailed = 4096
)

// failedMember is a member this node saw die, and when to contact it.
type failedMember struct {
	addr  string
	since time.Time     // when it was declared dead
	next  time.Time     // the next contact
	wait  time.Duration // the interval after the next contact
}

// noteFailedLocked records that r was declared dead (left members are not
// contacted, nor one at this node's own address). Caller holds c.mu.
func (c *Cluster) noteFailedLocked(r *record) {
	if r.m.Name == c.name || r.m.Addr == "" || len(c.failed) >= maxFailed {
		return
	}
	if self := c.members[c.name]; self != nil && self.m.Addr == r.m.Addr {
		return
	}
	if c.failed == nil {
		c.failed = make(map[string]*failedMember)
	}
	now := c.now()
	c.failed[r.m.Name] = &failedMember{addr: r.m.Addr, since: now, next: now.Add(jitter(reconnectFirst)), wait: 2 * reconnectFirst}
}

// jitter spreads d by up to half either way.
func jitter(d time.Duration) time.Duration {
	return d/2 + rand.N(d+1)
}

// reconnectOnce contacts the failed member most overdue, if one is due
// (each reconnectTick, until Shutdown). The contact runs in a goroutine of
// its own, waited for unless the Cluster shuts down first: memberlist's
// Join is not interrupted by its Shutdown, and a peer that accepts a
// connection and never answers holds it for twice the transport's timeout.
func (c *Cluster) reconnectOnce() {
	if c.usable() != nil {
		return
	}
	name, addr, ok := c.dueFailed(c.now())
	if !ok {
		return
	}
	c.ctr.reconnects.Add(1)
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := c.ml.Join([]string{addr})
		if n > 0 {
			c.ctr.reconnected.Add(1)
			c.log.Debug("contacted a member declared dead", "peer", name, "addr", addr)
		} else {
			c.log.Debug("a member declared dead does not answer", "peer", name, "addr", addr, "err", err)
		}
	}()
	select {
	case <-c.done:
	case <-done:
	}
}

// dueFailed picks the failed member whose contact is the most overdue and
// schedules its next one; it forgets those kept past reconnectFor.
func (c *Cluster) dueFailed(now time.Time) (name, addr string, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var due *failedMember
	for n, f := range c.failed {
		switch {
		case now.Sub(f.since) > reconnectFor:
			delete(c.failed, n)
		case !f.next.After(now) && (due == nil || f.next.Before(due.next)):
			due, name = f, n
		}
	}
	if due == nil {
		return "", "", false
	}
	due.next = now.Add(jitter(due.wait))
	due.wait = min(2*due.wait, reconnectMax)
	return name, due.addr, true
}
