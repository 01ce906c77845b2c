// This file holds who maps each load/store segment: the clients this
// daemon handed the segment's descriptor to that have not said they let it
// go. A move of the segment to another tier (tiermove.go) waits for none
// but the mover to map it: a mapping keeps the old memory, and writes to
// it after the move would be lost.

package pool

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/farmem/farmem/internal/errs"
)

// mapper is the process a client that got a segment's descriptor runs
// in, which keeps the mapping as long as it runs: its pid (0 when unknown:
// a mapper presumed after a restart, or a caller not on the unix socket)
// and its start time (procStart), which tells it from a later process that
// got the same pid. A client id in two processes at once names the later.
type mapper struct {
	pid   int32
	start uint64
}

// running reports whether the mapper's process still runs (a stopped one
// too; one that exited, a zombie included, has no mapping left).
func (m mapper) running() bool {
	if m.pid <= 0 {
		return false
	}
	start, ok := procStart(m.pid)
	return ok && start == m.start
}

// procStart returns the start time of process pid (/proc/PID/stat, clock
// ticks since boot); ok is false when it is gone, a zombie, or unknown.
func procStart(pid int32) (start uint64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count from
	// the last ')'. state is field 3, starttime field 22.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	return start, err == nil
}

// noteMapped records that client got the descriptor of segment id in
// process pid (0: unknown); p.mu is held.
func (p *core) noteMapped(id uint64, client string, pid int32) {
	if p.mappers == nil {
		p.mappers = map[uint64]map[string]mapper{}
	}
	if p.mappers[id] == nil {
		p.mappers[id] = map[string]mapper{}
	}
	m := mapper{}
	if start, ok := procStart(pid); pid > 0 && ok {
		m = mapper{pid: pid, start: start}
	}
	p.mappers[id][client] = m
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
			p.noteMapped(r.ID, c, 0)
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

// mapping reports whether client, which got segment id's descriptor and
// did not let it go, may still map it: it holds a session, its lease
// runs, its process still runs (a process stopped past its lease keeps
// its mapping, and would write memory the segment left), or this daemon
// restarted less than a lease ago (the presumed mappers of a restored
// segment). p.mu is held.
func (p *core) mapping(client string, m mapper) bool {
	return p.clients[client] != nil || p.now().Before(p.started.Add(p.cfg.LeaseTTL+restartGrace)) || m.running()
}

// mappersOf is who may map segment id now (mapping), but except. Sorted;
// p.mu is held.
func (p *core) mappersOf(id uint64, except string) []string {
	var out []string
	for _, c := range slices.Sorted(maps.Keys(p.mappers[id])) {
		if c != except && p.mapping(c, p.mappers[id][c]) {
			out = append(out, c)
		}
	}
	return out
}

// dropGoneMappers forgets the mappers that map nothing any more: clients
// without a session or lease whose process ended (or is unknown); p.mu is
// held. The reap calls it, so that the processes that came and went leave
// no entry behind for as long as their segments live.
func (p *core) dropGoneMappers() {
	for id, ms := range p.mappers {
		for c, m := range ms {
			if p.clients[c] == nil && !p.mapping(c, m) {
				p.dropMapper(id, c)
			}
		}
	}
}

// describeClients names clients of segment seg for an error message:
// each id with its process name and pid when it holds a session here, or
// with the pid of the process that mapped the segment when that process
// outlived the client's lease.
func (p *core) describeClients(seg uint64, ids []string) string {
	parts := make([]string, len(ids))
	for i, id := range ids {
		cl, m := p.clients[id], p.mappers[seg][id]
		switch {
		case cl != nil && cl.sessions > 0 && cl.pid > 0:
			parts[i] = fmt.Sprintf("%s (%s, pid %d)", id, cl.name, cl.pid)
		case cl == nil && m.running():
			parts[i] = fmt.Sprintf("%s (pid %d: its lease ran out, but the process that mapped the segment still runs, stopped perhaps; it lets go when it ends)", id, m.pid)
		case cl == nil || cl.sessions == 0:
			parts[i] = id + " (no session now: held until its lease ends)"
		default:
			parts[i] = id
		}
	}
	return strings.Join(parts, ", ")
}

// errMappedBy is the refusal to move segment id while clients map it.
func errMappedBy(id uint64, who string) error {
	return fmt.Errorf("move segment %d to another tier: %w: mapped by %s; each lets go of it with Segment.Close (or Client.Close, or by ending), then move it again", id, errs.ErrInUse, who)
}
