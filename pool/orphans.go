// This file tracks the peers that may hold segments placed by this daemon
// that no record here names (orphans: a placement whose answer never came
// back, a free that failed, whatever was in flight when this daemon last
// stopped) and has them freed as soon as such a peer answers. A peer
// reclaims a daemon's segments on its own only once that daemon's session
// there has been gone for the peer lease, minutes, so that a partition
// loses nothing; orphans must not wait that long.

package pool

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
)

// orphanSettle is how long after a peer's latest mark a reconcile must
// start for its answer to clear the mark: an allocation whose answer was
// lost may still be under way at the peer when the mark is made, and a
// listing taken before it completes does not show it.
const orphanSettle = 10 * time.Second

// orphans is the set of peers that may hold orphans of this daemon's. It
// is safe for concurrent use.
type orphans struct {
	mu sync.Mutex
	// marks holds, for each suspect peer, when its latest mark came: a
	// reconcile clears it only when it began orphanSettle after that, so
	// also when no mark came while it asked.
	marks map[string]time.Time
	// checking holds the peers a check loop runs for.
	checking map[string]bool
	// restarted: this daemon's store held segments or issued ids before
	// it started, so each peer is suspect at its first return since.
	restarted bool
	returned  map[string]bool
}

// mark makes node suspect.
func (o *orphans) mark(node string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.marks == nil {
		o.marks = map[string]time.Time{}
	}
	o.marks[node] = time.Now()
}

// claim adds key to the set *m, made on first use, and reports whether it
// was not there.
func claim(m *map[string]bool, key string) bool {
	if (*m)[key] {
		return false
	}
	if *m == nil {
		*m = map[string]bool{}
	}
	(*m)[key] = true
	return true
}

// forget ends node's suspicion: it left the cluster, or the peer lease has
// run out there, so it holds nothing of this daemon's any more.
func (o *orphans) forget(node string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.marks, node)
}

// startCheck reports whether a check loop must start for node (none
// runs), recording that one does.
func (o *orphans) startCheck(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return claim(&o.checking, node)
}

// marked reports whether node is suspect.
func (o *orphans) marked(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.marks[node]
	return ok
}

// clear ends node's suspicion if its latest mark came at least
// orphanSettle before started: a reconcile that began at started answered
// for all of its marks.
func (o *orphans) clear(node string, started time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if at, ok := o.marks[node]; ok && started.Sub(at) >= orphanSettle {
		delete(o.marks, node)
	}
}

// nodes lists the suspect peers.
func (o *orphans) nodes() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.marks))
	for node := range o.marks {
		out = append(out, node)
	}
	slices.Sort(out)
	return out
}

// firstReturn reports whether node has just come up for the first time
// since a restart of this daemon (not of a fresh one), recording it.
func (o *orphans) firstReturn(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.restarted && claim(&o.returned, node)
}

// stillSuspect reports whether node is suspect; when it is not, its check
// loop ends (a mark that comes after starts another).
func (o *orphans) stillSuspect(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.marks[node]; ok {
		return true
	}
	delete(o.checking, node)
	return false
}

// expire ends node's check loop, begun at start, whose time ran out: the
// marks made before it are forgotten (the peer lease has run out at node
// since them); it reports whether a later mark wants a loop of its own.
func (o *orphans) expire(node string, start time.Time) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.checking, node)
	if at, ok := o.marks[node]; ok && at.After(start) {
		return true
	}
	delete(o.marks, node)
	return false
}

// settled is when an answer of node's may clear its marks: orphanSettle
// after the latest.
func (o *orphans) settled(node string) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.marks[node].Add(orphanSettle)
}

// outcomeUnknown reports whether a call to a peer that failed with err may
// have been done there all the same, its answer lost: a deadline, a
// cancellation, the peer unreachable, a failure farmem does not name. A
// refusal the peer answered (no capacity, a limit, access denied, bad
// input) did nothing there.
func outcomeUnknown(err error) bool {
	err = errs.FromStatus(err)
	for _, refused := range []error{errs.ErrNoCapacity, errs.ErrLimit, errs.ErrAccessDenied, errs.ErrInvalid,
		errs.ErrNotFound, errs.ErrLeaseExpired, errs.ErrInUse, errs.ErrExists, errs.ErrNotSupported} {
		if errors.Is(err, refused) {
			return false
		}
	}
	return true
}

// mayHoldOrphans notes that node may hold orphans of this daemon's (a call
// that may have allocated there failed with err, when err is not nil: one
// the peer refused allocated nothing), and asks it (reconcile, which frees
// them) while it is alive, until an answer cleared the suspicion: after a
// backoff from reconcileRetry that doubles to 5 s, each wait drawn at
// random between half and all of it, so that the daemons that marked a
// node during a partition do not all ask it at once when it heals, and no
// sooner than the marks can clear. The asking ends then, at close, or
// after the peer lease, by which node has reclaimed them itself;
// sweepPeers asks the suspect peers too.
func (p *core) mayHoldOrphans(node string, err error) {
	if err != nil && !outcomeUnknown(err) {
		return
	}
	p.orphans.mark(node)
	p.checkOrphans(node)
}

// checkOrphans runs mayHoldOrphans's loop for node, unless one runs.
func (p *core) checkOrphans(node string) {
	if p.cl == nil || !p.orphans.startCheck(node) {
		return
	}
	start := time.Now()
	p.peers.later(max(p.cfg.PeerLeaseTTL, p.cfg.LeaseTTL), func(ctx context.Context) {
		for backoff := reconcileRetry; ; backoff = min(2*backoff, 5*time.Second) {
			wait := max(backoff/2+rand.N(backoff/2+1), time.Until(p.orphans.settled(node)))
			if backoff == reconcileRetry {
				wait = backoff/2 + rand.N(backoff/2+1) // the first ask frees what it finds at once
			}
			select {
			case <-ctx.Done():
				// At close nothing asks again; at the deadline a later
				// mark does.
				if ctx.Err() == context.DeadlineExceeded && p.orphans.expire(node, start) {
					p.checkOrphans(node)
				}
				return
			case <-time.After(wait):
			}
			if m, ok := p.cl.Member(node); ok && m.State == cluster.StateAlive {
				p.reconcile(ctx, node)
			}
			if !p.orphans.stillSuspect(node) {
				return
			}
		}
	})
}
