// This file holds who maps each load/store segment: the clients this
// daemon handed the segment's descriptor to that have not said they let it
// go. A move of the segment to another tier (tiermove.go) waits for none
// but the mover to map it: a mapping keeps the old memory, and writes to
// it after the move would be lost.

package pool

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/procstat"
)

// mapper is a client that got a segment's descriptor, in one process,
// which keeps the mapping as long as it runs: the process's pid (0 when
// unknown: a mapper presumed after a restart, a process this daemon's
// /proc does not show) and start time (procStart), which tells it from a
// later process that got the same pid. A client id used by two processes
// (a restarted one beside one stopped) is two mappers.
type mapper struct {
	client string
	pid    int32
	start  uint64
}

// procState is what /proc says of a mapper's process.
type procState int

const (
	procUnknown procState = iota // no pid, or /proc cannot say
	procRunning                  // running or stopped: it maps what it mapped
	procGone                     // it ended, or another process has its pid
)

// state is what /proc says of m's process now.
func (m mapper) state() procState {
	if m.pid <= 0 {
		return procUnknown
	}
	start, st := procStart(m.pid)
	if st == procRunning && start != m.start {
		return procGone
	}
	return st
}

// procStart returns the start time of process pid (/proc/PID/stat, clock
// ticks since boot) and whether it runs: a zombie leader whose other
// threads run still does (its mappings live on with them).
func procStart(pid int32) (uint64, procState) {
	f, err := procstat.Fields(int(pid))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, procGone
	}
	// state is field 3, starttime field 22.
	if err != nil || len(f) < 20 {
		return 0, procUnknown
	}
	start, err := strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, procUnknown
	}
	switch f[0] {
	case "X":
		return start, procGone
	case "Z":
		if tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err != nil || len(tasks) < 2 {
			return start, procGone
		}
	}
	return start, procRunning
}

// noteMapped records that client got the descriptor of segment id in
// process pid (0: unknown); p.mu is held. A process new to a devdax
// segment is to be written to the store (markMapped).
func (p *core) noteMapped(id uint64, client string, pid int32) {
	m := mapper{client: client}
	if pid > 0 {
		if start, st := procStart(pid); st == procRunning {
			m.pid, m.start = pid, start
		}
	}
	if p.addMapper(id, m) && m.pid > 0 {
		p.markMapped(id)
	}
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
// c did not map is fine as it is; one freed since whose extent is held
// for c (holdExtent) is given back by the next reap once no other mapper
// holds it.
func (p *core) Unmapped(c caller, id uint64) {
	if c.client == nil {
		return
	}
	p.mu.Lock()
	for m := range p.mappers[id] {
		if c.owns(m) {
			p.dropMapper(id, m)
		}
	}
	for i := range p.held {
		if h := &p.held[i]; h.seg == id {
			h.by = slices.DeleteFunc(h.by, c.owns)
			p.mappedChanged(id)
		}
	}
	wait := p.flushMapped(id)
	p.mu.Unlock()
	if err := wait(); err != nil {
		p.log.Warn("record that a process let a devdax segment go; tried again at the next sweep", "segment", id, "err", err)
	}
}

// owns reports whether mapper m is c's: the same client in the same
// process (c's pid known or not, as m's: a caller whose process is unknown
// owns none of the client's known processes' mappings), or a mapper
// presumed after a restart (no pid), of the same client.
func (c caller) owns(m mapper) bool {
	return m.client == c.id() && (m.pid == 0 || m.pid == c.pid)
}

// dropMapper forgets mapper m of segment id; p.mu is held.
func (p *core) dropMapper(id uint64, m mapper) {
	if ms := p.mappers[id]; ms != nil {
		delete(ms, m)
		if len(ms) == 0 {
			delete(p.mappers, id)
		}
		p.markMapped(id)
	}
}

// mapping reports whether m may still map its segment: its process runs
// (also one stopped past its client's lease, which would write memory
// the segment left when it goes on); or, when /proc cannot say, its
// client holds a session or a lease, or this daemon restarted less than a
// lease ago (the presumed mappers of a restored segment). p.mu is held.
func (p *core) mapping(m mapper) bool {
	switch m.state() {
	case procRunning:
		return true
	case procGone:
		return false
	}
	return p.clients[m.client] != nil || p.now().Before(p.started.Add(p.cfg.LeaseTTL+restartGrace))
}

// mappersOf is who may map segment id now (mapping) but c's own process,
// sorted by client and pid; p.mu is held.
func (p *core) mappersOf(id uint64, c caller) []mapper {
	var out []mapper
	for m := range p.mappers[id] {
		if !c.owns(m) && p.mapping(m) {
			out = append(out, m)
		}
	}
	return sortMappers(out)
}

// dropGoneMappers forgets the mappers of clients without a session that
// map nothing any more: those whose process ended, and those past their
// lease whose process /proc cannot show; and gives back the held extents whose
// processes all ended (holdExtent). p.mu is held. The reap calls it, so
// that processes that came and went leave no entry behind for as long as
// their segments live.
func (p *core) dropGoneMappers() {
	for id, ms := range p.mappers {
		for m := range ms {
			// One whose client holds a session is left to that session's
			// end: the sweep reads /proc only for those past their lease.
			if p.clients[m.client] == nil && !p.mapping(m) {
				p.dropMapper(id, m)
			}
		}
	}
	p.held = slices.DeleteFunc(p.held, func(h heldExtent) bool {
		if slices.ContainsFunc(h.by, p.mapping) {
			return false
		}
		p.mappedChanged(h.seg) // its entry goes
		if d := p.device(h.device); d != nil {
			if err := d.ext.Free(h.offset, h.extent); err != nil {
				p.log.Error("return a held extent", "segment", h.seg, "device", h.device, "err", err)
			}
		}
		p.log.Info("a freed segment's memory is free again: the processes that mapped it ended", "segment", h.seg, "device", h.device)
		return true
	})
}

// heldExtent is the extent of a freed segment on a device whose
// descriptor reaches every segment (devdax) that processes still map (by):
// one stopped past its client's lease, or another client's mapping of a
// named segment its owner freed. Given to the next segment, it would take
// their writes when they go on; it stays out of the allocator until none
// of them maps it (dropGoneMappers), also in the allocator of the device
// coming back under its name (addLocked). Its mappers are in the
// store (mappedEntry), so a restarted daemon holds it again
// (restoreMapped).
type heldExtent struct {
	seg            uint64
	device         string
	offset, extent int64
	by             []mapper
}

// holdExtent keeps r's extent from the allocator while by run; p.mu is
// held.
func (p *core) holdExtent(r *record, by []mapper) {
	p.held = append(p.held, heldExtent{seg: r.ID, device: r.Device, offset: r.Offset, extent: r.Extent, by: by})
	p.markMapped(r.ID)
	pids := make([]int32, len(by))
	for i, m := range by {
		pids[i] = m.pid
	}
	p.log.Warn("a freed segment's memory is held back: processes that mapped it still run, and would write it when given to another segment", "segment", r.ID, "device", r.Device, "bytes", r.Extent, "pids", pids)
}

// describeMappers names mappers for an error message: each client id with
// its process name and pid when it holds a session here, or with the pid
// of the process that mapped the segment when that outlived the client's
// lease.
func (p *core) describeMappers(ms []mapper) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		cl := p.clients[m.client]
		switch {
		case cl != nil && cl.sessions > 0 && cl.pid > 0 && (m.pid == 0 || int64(m.pid) == cl.pid):
			parts[i] = fmt.Sprintf("%s (%s, pid %d)", m.client, cl.name, cl.pid)
		case m.pid > 0 && cl != nil:
			parts[i] = fmt.Sprintf("%s (pid %d, which still runs beside the process holding the client's session; it lets go when it ends)", m.client, m.pid)
		case m.pid > 0:
			parts[i] = fmt.Sprintf("%s (pid %d: the client's lease ran out, but the process that mapped the segment still runs, stopped perhaps; it lets go when it ends)", m.client, m.pid)
		case cl == nil || cl.sessions == 0:
			parts[i] = m.client + " (no session now: held until its lease ends)"
		default:
			parts[i] = m.client
		}
	}
	return strings.Join(parts, ", ")
}

// describeClients is describeMappers for clients of unknown processes.
func (p *core) describeClients(ids []string) string {
	ms := make([]mapper, len(ids))
	for i, id := range ids {
		ms[i] = mapper{client: id}
	}
	return p.describeMappers(ms)
}

// errMappedBy is the refusal to move segment id while clients map it.
func errMappedBy(id uint64, who string) error {
	return fmt.Errorf("move segment %d to another tier: %w: mapped by %s; each lets go of it with Segment.Close (or Client.Close, or by ending), then move it again", id, errs.ErrInUse, who)
}

// mappedState is what the daemon knows of its store's entries of who maps
// its devdax segments (mappedEntry); under core.mu.
type mappedState struct {
	// dirty are the segments whose entry is to be written again or
	// removed (flushMapped), each with the generation of its last change:
	// a segment stays here until a commit of its entry as it was then
	// succeeds, so that a caller that finds it here waits for one.
	dirty map[uint64]uint64
	gen   uint64
	// stored are the segments that may have an entry in the store.
	stored map[uint64]bool
}

// markMapped notes that the store's entry of who maps segment id is to be
// written again by the next flushMapped, when id has one or is a devdax
// segment's or a held extent's; p.mu is held.
func (p *core) markMapped(id uint64) {
	r := p.segs[id]
	if p.mapped.stored[id] || r != nil && r.Home == "" && p.sharesFD(r.Device) ||
		r == nil && slices.ContainsFunc(p.held, func(h heldExtent) bool { return h.seg == id }) {
		p.mappedChanged(id)
	}
}

// mappedChanged notes that the store's entry of who maps segment id is to
// be written again, or removed, by the next flushMapped; p.mu is held.
func (p *core) mappedChanged(id uint64) {
	if p.mapped.dirty == nil {
		p.mapped.dirty, p.mapped.stored = map[uint64]uint64{}, map[uint64]bool{}
	}
	p.mapped.gen++
	p.mapped.dirty[id] = p.mapped.gen
}

// sharesFD reports whether the device named name hands out a descriptor
// that reaches every segment on it (devdax), also when it went away.
func (p *core) sharesFD(name string) bool {
	if d := p.device(name); d != nil {
		return d.SharesFD()
	}
	g := p.gone[name]
	return g != nil && g.SharesFD()
}

// mappedEntryOf is what the store is to hold of who maps segment id: the
// extent of its live record and its mappers, or its held extent's; false
// when there is nothing to hold. p.mu is held.
func (p *core) mappedEntryOf(id uint64) (mappedEntry, bool) {
	if r := p.segs[id]; r != nil {
		if r.Home != "" || len(p.mappers[id]) == 0 || !p.sharesFD(r.Device) {
			return mappedEntry{}, false
		}
		return mappedEntry{device: r.Device, offset: r.Offset, extent: r.Extent, by: sortMappers(slices.Collect(maps.Keys(p.mappers[id])))}, true
	}
	i := slices.IndexFunc(p.held, func(h heldExtent) bool { return h.seg == id })
	if i < 0 || len(p.held[i].by) == 0 {
		return mappedEntry{}, false
	}
	h := p.held[i]
	return mappedEntry{device: h.device, offset: h.offset, extent: h.extent, by: sortMappers(slices.Clone(h.by))}, true
}

// flushMapped queues one commit of the entries of the segments in only
// (all those noted, without only) that markMapped noted, as they are now,
// and returns the wait for it, which the caller must call once it let go
// of p.mu. A segment stays noted until a commit of its entry succeeds,
// so a later flush writes it again (and waits for it) while one is on its
// way or after one failed. p.mu is held.
func (p *core) flushMapped(only ...uint64) (wait func() error) {
	var ids []uint64
	if len(only) == 0 {
		ids = slices.Sorted(maps.Keys(p.mapped.dirty))
	} else {
		ids = slices.DeleteFunc(slices.Clone(only), func(id uint64) bool { return p.mapped.dirty[id] == 0 })
	}
	if len(ids) == 0 {
		return func() error { return nil }
	}
	gens := make([]uint64, len(ids))
	put := map[uint64]mappedEntry{}
	var del []uint64
	for i, id := range ids {
		gens[i] = p.mapped.dirty[id]
		if e, ok := p.mappedEntryOf(id); ok {
			put[id] = e
			p.mapped.stored[id] = true
		} else {
			del = append(del, id)
		}
	}
	committed := p.st.submitMapped(put, del)
	return func() error {
		err := committed()
		if err != nil {
			return err
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		for i, id := range ids {
			if p.mapped.dirty[id] != gens[i] {
				continue // changed since: written again by a later flush
			}
			delete(p.mapped.dirty, id)
			if _, kept := put[id]; !kept {
				delete(p.mapped.stored, id)
			}
		}
		return nil
	}
}

// addMapper records m as a mapper of segment id and reports whether it is
// new; p.mu is held.
func (p *core) addMapper(id uint64, m mapper) bool {
	if p.mappers == nil {
		p.mappers = map[uint64]map[mapper]bool{}
	}
	if p.mappers[id] == nil {
		p.mappers[id] = map[mapper]bool{}
	}
	if p.mappers[id][m] {
		return false
	}
	p.mappers[id][m] = true
	return true
}

// restoreMapped reads back who mapped the devdax segments before a
// restart (mappedEntry): the processes still running of a restored
// segment's mappers map it beside those presumed (presumeMapped), and the
// extent of a segment freed while processes mapped it stays out of the
// allocator until they end (holdExtent), also when its device comes back
// later (addLocked). Entries of nothing running go at the next flush.
// newCore calls it once the records are restored, before anything is
// served.
func (p *core) restoreMapped() error {
	entries, corrupt, err := p.st.mapped()
	if err != nil {
		return err
	}
	for _, id := range corrupt {
		p.log.Warn("an entry of which processes map a devdax segment does not decode: removed", "segment", id)
		p.mappedChanged(id)
		p.mapped.stored[id] = true
	}
	for _, id := range slices.Sorted(maps.Keys(entries)) {
		e := entries[id]
		p.mappedChanged(id) // written again as it is now, or removed
		p.mapped.stored[id] = true
		by := slices.DeleteFunc(slices.Clone(e.by), func(m mapper) bool { return m.state() == procGone })
		r := p.segs[id]
		switch {
		case len(by) == 0:
		case r != nil && r.Home == "" && r.Device == e.device && r.Offset == e.offset && r.Extent == e.extent:
			for _, m := range by {
				p.addMapper(id, m)
			}
		case r != nil: // it moved since, which no other mapper may see
		default:
			if d := p.device(e.device); d != nil {
				if err := d.ext.Reserve(e.offset, e.extent); err != nil {
					// Another segment has it: the hold had ended, and
					// the entry's removal had not committed yet.
					p.log.Info("a stale entry of a freed devdax segment's mappers: its memory is another segment's now", "segment", id, "device", e.device, "err", err)
					continue
				}
			}
			p.holdExtent(&record{ID: id, Device: e.device, Offset: e.offset, Extent: e.extent}, by)
		}
	}
	return nil
}
