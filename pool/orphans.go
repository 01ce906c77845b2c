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
	"slices"
	"sync"
	"time"

	"github.com/farmem/farmem/internal/cluster"
)

// orphans is the set of peers that may hold orphans of this daemon's. It
// is safe for concurrent use.
type orphans struct {
	mu sync.Mutex
	// marks holds, for each suspect peer, the count of marks it has had:
	// a reconcile clears the mark only when no mark came while it asked.
	marks map[string]uint64
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
		o.marks = map[string]uint64{}
	}
	o.marks[node]++
}

// startCheck reports whether a check loop must start for node (none
// runs), recording that one does.
func (o *orphans) startCheck(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.checking[node] {
		return false
	}
	if o.checking == nil {
		o.checking = map[string]bool{}
	}
	o.checking[node] = true
	return true
}

// stopCheck ends node's check loop.
func (o *orphans) stopCheck(node string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.checking, node)
}

// marked returns node's mark count, 0 when it is not suspect.
func (o *orphans) marked(node string) uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.marks[node]
}

// clear ends node's suspicion if it was marked n times: a reconcile that
// read n before it asked node answered for all of those marks.
func (o *orphans) clear(node string, n uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.marks[node] == n {
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
	if !o.restarted || o.returned[node] {
		return false
	}
	if o.returned == nil {
		o.returned = map[string]bool{}
	}
	o.returned[node] = true
	return true
}

// stillSuspect reports whether node is suspect; when it is not, its check
// loop ends (a mark that comes after starts another).
func (o *orphans) stillSuspect(node string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.marks[node] > 0 {
		return true
	}
	delete(o.checking, node)
	return false
}

// mayHoldOrphans notes that node may hold orphans of this daemon's, and
// asks it (reconcile, which frees them) until it answered: at once, then
// after a backoff that doubles to 5 s, also while node is not alive. The
// asking ends when node answered, at close, or after the peer lease, by
// which node has reclaimed them itself; sweepPeers asks the suspect peers
// too.
func (p *core) mayHoldOrphans(node string) {
	p.orphans.mark(node)
	if p.cl == nil || !p.orphans.startCheck(node) {
		return
	}
	p.peers.later(max(p.cfg.PeerLeaseTTL, p.cfg.LeaseTTL), func(ctx context.Context) {
		for wait := reconcileRetry; ; wait = min(2*wait, 5*time.Second) {
			if m, ok := p.cl.Member(node); ok && m.State == cluster.StateAlive {
				p.reconcile(ctx, node)
			}
			if !p.orphans.stillSuspect(node) {
				return
			}
			select {
			case <-ctx.Done():
				p.orphans.stopCheck(node)
				return
			case <-time.After(wait):
			}
		}
	})
}
