// This file holds who maps each load/store segment: the clients this
// daemon handed the segment's descriptor to that have not said they let it
// go. A move of the segment to another tier (tiermove.go) waits for none
// but the mover to map it: a mapping keeps the old memory, and writes to
// it after the move would be lost.

package pool

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/farmem/farmem/internal/errs"
)

// noteMapped records that client got the descriptor of segment id; p.mu
// is held.
func (p *core) noteMapped(id uint64, client string) {
	if p.mappers == nil {
		p.mappers = map[uint64]map[string]bool{}
	}
	if p.mappers[id] == nil {
		p.mappers[id] = map[string]bool{}
	}
	p.mappers[id][client] = true
}

// presumeMapped records a restored load/store segment's owner and
// attachers as its mappers: a client that mapped it before this daemon
// restarted may still, and says so only by letting it go (Unmapped) or by
// staying away past its lease. p.mu is held.
func (p *core) presumeMapped(r *record) {
	if r.Home != "" || !r.Key.IsZero() || r.Lost {
		return
	}
	for _, c := range append([]string{r.Owner}, r.Attached...) {
		if c != "" {
			p.noteMapped(r.ID, c)
		}
	}
}

// Unmapped records that c no longer maps segment id (the fdpass RELEASE
// request): it closed the segment, or moves it to another tier. A segment
// c did not map, or that is gone, is fine as it is.
func (p *core) Unmapped(c caller, id uint64) {
	if c.client == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.dropMapper(id, c.client.id)
}

// dropMapper forgets that client maps segment id; p.mu is held.
func (p *core) dropMapper(id uint64, client string) {
	if m := p.mappers[id]; m != nil {
		delete(m, client)
		if len(m) == 0 {
			delete(p.mappers, id)
		}
	}
}

// mappersOf is who may map segment id now, but except: the clients it was
// handed to that did not let it go, as long as they hold a session or
// their lease runs (a client that stays away past it has its mapping
// reclaimed with its lease; the presumed mappers of a restored segment
// count until one lease after this daemon started). Sorted; p.mu is held.
func (p *core) mappersOf(id uint64, except string) []string {
	grace := p.started.Add(p.cfg.LeaseTTL + restartGrace)
	var out []string
	for _, c := range slices.Sorted(maps.Keys(p.mappers[id])) {
		if c != except && (p.clients[c] != nil || p.now().Before(grace)) {
			out = append(out, c)
		}
	}
	return out
}

// describeClients names clients for an error message: each id with its
// process name and pid when it holds a session here.
func (p *core) describeClients(ids []string) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = id
		if cl := p.clients[id]; cl != nil && cl.sessions > 0 && cl.pid > 0 {
			parts[i] = fmt.Sprintf("%s (%s, pid %d)", id, cl.name, cl.pid)
		} else if cl == nil || cl.sessions == 0 {
			parts[i] = id + " (no session now: held until its lease ends)"
		}
	}
	return strings.Join(parts, ", ")
}

// errMappedBy is the refusal to move segment id while clients map it.
func errMappedBy(id uint64, who string) error {
	return fmt.Errorf("move segment %d to another tier: %w: mapped by %s; each lets go of it with Segment.Close (or Client.Close, or by ending), then move it again", id, errs.ErrInUse, who)
}
