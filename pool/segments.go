// This file holds the segment table's operations after placement: lookup,
// Free and reclaim, Attach and Detach, Stat and listing, and Backing.

package pool

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/errs"
)

// lookup finds a segment by id or, when id is 0, by name.
func (p *core) lookup(id uint64, name string) (*record, error) {
	if id == 0 {
		var ok bool
		if id, ok = p.names[name]; !ok {
			return nil, fmt.Errorf("segment %q: %w (see 'memctl segments')", name, errs.ErrNotFound)
		}
	}
	r, ok := p.segs[id]
	if !ok {
		return nil, fmt.Errorf("segment %d: %w (see 'memctl segments')", id, errs.ErrNotFound)
	}
	return r, nil
}

// mayUse reports whether the caller may map, free or stat-with-memory the segment.
func mayUse(c caller, r *record) bool {
	if c.client == nil {
		return true
	}
	return r.Owner == c.client.id || slices.Contains(r.Attached, c.client.id)
}

// Free releases a segment: committed, then its backing removed and its
// extent returned.
func (p *core) Free(c caller, id uint64, name string) error {
	id, wait, err := p.free(c, id, name)
	if err != nil {
		return err
	}
	if err := wait(); err != nil {
		p.log.Warn("record that a freed devdax segment is held or let go; tried again at the next sweep", "segment", id, "name", name, "err", err)
	}
	return nil
}

// free is Free under p.mu; it returns the id of the segment freed (named
// by id or by name) and the wait for the commit of what the free changed
// in who maps it, if it was a devdax one (held, or let go).
func (p *core) free(c caller, id uint64, name string) (freed uint64, wait func() error, _ error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(id, name)
	if err != nil {
		return 0, nil, err
	}
	if !mayFree(c, r) {
		return 0, nil, freeDenied(c, r)
	}
	if moved := p.moving.switchDone(r.ID); moved != nil {
		// Its switch-over commits outside p.mu (commitSwitch): the free
		// waits for it, and then frees the segment where it is.
		p.mu.Unlock()
		<-moved
		p.mu.Lock()
		if r, err = p.lookup(r.ID, ""); err != nil {
			return 0, nil, err
		}
	}
	// Out of the table while the removal commits (grouped with concurrent
	// commits) and the data plane fences it, both outside p.mu: nobody
	// else frees, maps, moves or reclaims it meanwhile, and its extent and
	// backing stay its own until release, after the fence. A crash before
	// the commit leaves it whole, as never freed; one after it leaves no
	// record, so the restart sweeps its file and its extent is free.
	// Its name stays taken until the removal committed: a failed one
	// puts the record back under it, which nobody else took meanwhile.
	p.hide(r)
	p.mu.Unlock()
	if err = p.st.delete(r); err == nil {
		p.fence(r)
	}
	p.mu.Lock()
	if err != nil {
		p.link(r)
		return 0, nil, fmt.Errorf("free segment %d: commit to the metadata store: %w", r.ID, err)
	}
	p.dropName(r)
	for m := range p.mappers[r.ID] {
		if c.owns(m) {
			p.dropMapper(r.ID, m) // the caller lets go of what it frees
		}
	}
	p.release(r, "freed")
	return r.ID, p.flushMapped(r.ID), nil
}

// link puts a record in the table (not its name: callers do).
func (p *core) link(r *record) {
	p.segs[r.ID] = r
	p.order.ReplaceOrInsert(r.ID)
}

// unlink takes a record and its name out of the table, not the store.
func (p *core) unlink(r *record) {
	p.hide(r)
	p.dropName(r)
}

// hide takes a record out of the table but leaves its name taken, for a
// removal that commits outside p.mu and, failing, links the record back.
func (p *core) hide(r *record) {
	delete(p.segs, r.ID)
	p.order.Delete(r.ID)
}

// dropName frees r's name, if it is still r's.
func (p *core) dropName(r *record) {
	if r.Name != "" && p.names[r.Name] == r.ID {
		delete(p.names, r.Name)
	}
}

// reclaimBatch is the most records one commit of a reclaim removes or
// rewrites: few enough that a removal's new pages fit the store's reserve
// on a full filesystem (reserveSize), many enough that a client's
// thousands of segments take a thirty-second as many commits.
const reclaimBatch = 32

// unlinkFreed commits the removal of rs, in commits of at most
// reclaimBatch records of one store file, and takes those committed out of
// the table, for dispose to fence and release; p.mu is held. It returns
// those; after a failed commit the others stay in the table and in the
// store, and the error says why.
func (p *core) unlinkFreed(rs ...*record) ([]*record, error) {
	var done []*record
	err := p.inBatches("free", rs, p.st.delete, func(r *record) {
		p.unlink(r)
		done = append(done, r)
	})
	return done, err
}

// inBatches commits rs with commit in batches of at most reclaimBatch
// records of one store file (each whole or not at all) and applies each
// record of a committed batch; it stops at the first failed commit, whose
// error names what of the verb's work it left. p.mu is held.
func (p *core) inBatches(verb string, rs []*record, commit func(...*record) error, apply func(*record)) error {
	done := 0
	for batch := range p.st.batches(rs, reclaimBatch) {
		if err := commit(batch...); err != nil {
			if len(rs) == 1 {
				return fmt.Errorf("%s segment %d: commit to the metadata store: %w", verb, rs[0].ID, err)
			}
			return fmt.Errorf("%s %d of %d segments: commit to the metadata store: %w", verb, len(rs)-done, len(rs), err)
		}
		for _, r := range batch {
			apply(r)
		}
		done += len(batch)
	}
	return nil
}

// dispose fences and releases records whose removal committed and that
// left the table (unlinkFreed); p.mu is not held.
func (p *core) dispose(reason string, rs ...*record) {
	p.fence(rs...)
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range rs {
		p.release(r, reason)
	}
}

// fencedHere reports whether r's memory is served by this node's data
// plane, to be fenced before it is released. Such a segment is on the rdma
// tier, whose device (the export device) never goes away (hotplug.go): no
// device that came back under its name, with a new allocator that did not
// reserve the extent of a segment out of the table, is ever given its
// extent back by release.
func (p *core) fencedHere(r *record) bool {
	return p.dp != nil && !r.redundant() && r.Home == "" && !r.Key.IsZero()
}

// fence takes freed segments off the data plane once their removal is
// committed, before release gives their memory back; p.mu is not held.
// Each fence waits until no operation touches the segment's memory, which
// a client that stops reading a READ's answer holds up to the data plane's
// WriteTimeout: under p.mu that stalled every call of every client, and
// the segments fence concurrently so that n such readers cost one
// WriteTimeout, not n. Segments served elsewhere are skipped: release
// tells their homes.
func (p *core) fence(rs ...*record) {
	var wg sync.WaitGroup
	for _, r := range rs {
		if !p.fencedHere(r) {
			continue
		}
		wg.Go(func() {
			p.stopForwarding(r.ID)
			p.dp.fence(r.ID)
		})
	}
	wg.Wait()
}

// release returns a record's memory once its removal is committed and
// the data plane fenced it (fence): its backing goes and its extent is
// free again. p.mu is held.
func (p *core) release(r *record, reason string) {
	p.usage.sub(r)
	defer delete(p.mappers, r.ID)
	if p.mapped.stored[r.ID] {
		p.mappedChanged(r.ID) // its entry goes, unless held below
	}
	p.trackFills.drop(r.ID)
	switch {
	case r.redundant():
		for _, h := range r.Homes {
			p.peers.freeLater(h.Node, h.HomeID)
		}
		p.replicateLocks.Delete(r.ID)
		p.moving.unsealed(r.ID)
		if st, ok := p.stripes.LoadAndDelete(r.ID); ok {
			go st.(*stripe).close() // it may wait for a write in flight, which p.mu would block
		}
	case r.Home != "":
		p.peers.freeLater(r.Home, r.HomeID)
	}
	if g := p.gone[r.Device]; g != nil && r.Home == "" && g.Kind() != device.KindDevdax {
		// Its device went away: the backing file goes (a closed devdax
		// device has nothing to remove), the extent with the device.
		if err := g.Remove(r.ID, r.Offset, r.Extent); err != nil {
			p.log.Warn("remove the backing of a segment whose device went away", "segment", r.ID, "device", r.Device, "err", err)
		}
	}
	if d := p.device(r.Device); d != nil && r.Home == "" {
		if err := d.Remove(r.ID, r.Offset, r.Extent); err != nil {
			p.log.Error("remove segment backing", "segment", r.ID, "device", r.Device, "err", err)
		}
		var by []mapper
		if d.SharesFD() { // other devices' segments have pages of their own
			by = p.mappersOf(r.ID, caller{}) // the daemon's own: it owns none
		}
		if len(by) > 0 {
			p.holdExtent(r, by)
		} else if err := d.ext.Free(r.Offset, r.Extent); err != nil && !r.Lost {
			p.log.Error("return extent", "segment", r.ID, "device", r.Device, "err", err)
		}
	}
	p.metrics.released(r, reason)
	p.log.Debug("segment released", "segment", r.ID, "reason", reason, "size", r.Size, "owner", r.Owner)
}

// Attach gives the caller access to a named segment.
func (p *core) Attach(c caller, name string) (*record, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: attach needs a segment name", errs.ErrInvalid)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(0, name)
	if err != nil {
		return nil, err
	}
	if !mayAttach(c, r) {
		return nil, attachDenied(c, r)
	}
	if !mayUse(c, r) {
		if n := p.auth.boundTo(r.Attached, c.ident); n >= maxAttachersPerIdentity && len(r.Attached) >= maxAttachers/2 {
			return nil, fmt.Errorf("attach %q: %w: %d client ids of %s have attached it, at most %d of one identity per segment, so that other identities can still attach; have those of yours that no longer use it detach (Segment.Close or Client.Close), or share one client (alloc.Dial) among more of your goroutines instead of dialing a client each", name, errs.ErrLimit, n, c.ident, maxAttachersPerIdentity)
		}
		if len(r.Attached) >= maxAttachers {
			return nil, fmt.Errorf("attach %q: %w: %d clients have attached it, at most %d per segment; have those that no longer use it detach (Segment.Close or Client.Close; a client's attachments also end with its lease)", name, errs.ErrLimit, len(r.Attached), maxAttachers)
		}
		next := *r
		next.Attached = append(slices.Clone(r.Attached), c.client.id)
		if err := p.st.put(&next); err != nil {
			return nil, fmt.Errorf("attach %q: commit to the metadata store: %w", name, err)
		}
		*r = next
		p.allowData(r)
	}
	cp := *r
	return &cp, nil
}

// maxAttachers is the most client ids one segment lists as attached:
// each Attach rewrites the whole record, and the data plane's principals
// of the segment are the list.
const maxAttachers = 1024

// maxAttachersPerIdentity is the most of a segment's attachers whose
// client ids are bound to one identity: an identity may open sessions
// under as many client ids as it likes, and without this one granted
// identity could take every place of maxAttachers and lock every other
// out. It applies once the list is half full, so one service may attach
// a segment from more processes of one user while there is room; then an
// eighth of the list (128) is an identity's, and room for seven such
// identities is left. Not for --insecure, whose clients prove no identity.
const maxAttachersPerIdentity = maxAttachers / 8

// Detach withdraws the caller's attachment to a segment (its client id
// from Attached), so that the caller may no longer map or free it; the
// segment stays for its owner and other attachers. Nothing to withdraw
// (the caller owns the segment, or never attached it) is not an error.
func (p *core) Detach(c caller, id uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(id, "")
	if err != nil {
		return err
	}
	if c.client == nil {
		return nil
	}
	_, err = p.detachLocked(r, c.client.id)
	return err
}

// detachLocked removes client from r's attachers, committed, and reports
// whether it was one. p.mu is held.
func (p *core) detachLocked(r *record, client string) (bool, error) {
	detached, err := p.detachAllLocked([]*record{r}, client)
	return len(detached) > 0, err
}

// detachAllLocked removes client from the attachers of each of rs, records
// in the table, in commits of at most reclaimBatch records of one store
// file, and returns the records it was detached from; after a failed
// commit the others keep it, and the error says why. p.mu is held.
func (p *core) detachAllLocked(rs []*record, client string) ([]*record, error) {
	var nexts []*record
	for _, r := range rs {
		if i := slices.Index(r.Attached, client); i >= 0 {
			next := *r
			next.Attached = slices.Delete(slices.Clone(r.Attached), i, i+1)
			nexts = append(nexts, &next)
		}
	}
	var done []*record
	err := p.inBatches("detach", nexts, p.st.put, func(next *record) {
		r := p.segs[next.ID]
		*r = *next
		p.allowData(r)
		done = append(done, r)
	})
	return done, err
}

// Stat returns a copy of one segment.
func (p *core) Stat(id uint64) (record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(id, "")
	if err != nil {
		return record{}, err
	}
	return *r, nil
}

// List returns copies of every segment, by id.
func (p *core) List() []record {
	recs, _ := p.listPage(0, 0)
	return recs
}

// listPage returns copies of up to limit segments (0: no limit) with ids
// above after, by id, and whether more follow.
func (p *core) listPage(after uint64, limit int) (recs []record, more bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.order.AscendGreaterOrEqual(after+1, func(id uint64) bool {
		if limit > 0 && len(recs) == limit {
			more = true
			return false
		}
		recs = append(recs, *p.segs[id])
		return true
	})
	return recs, more
}

// segmentCount is the number of segments in the table.
func (p *core) segmentCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.segs)
}

// Backing opens a segment's memory for a caller that may use it. A
// process new to a devdax segment is in the store before it gets the
// descriptor (mappedEntry): a restarted daemon must know it may still
// write that memory.
func (p *core) Backing(c caller, id uint64) (device.Backing, error) {
	b, wait, err := p.backing(c, id)
	if err != nil {
		return device.Backing{}, err
	}
	if err := wait(); err != nil {
		b.File.Close()
		return device.Backing{}, fmt.Errorf("segment %d: record which process maps it: %w", id, err)
	}
	return b, nil
}

// backing is Backing under p.mu, with the wait for the commit of its
// mapper.
func (p *core) backing(c caller, id uint64) (_ device.Backing, wait func() error, _ error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(id, "")
	if err != nil {
		return device.Backing{}, nil, err
	}
	if !mayUse(c, r) {
		return device.Backing{}, nil, fmt.Errorf("segment %d: %w", id, errs.ErrAccessDenied)
	}
	if r.Lost {
		return device.Backing{}, nil, fmt.Errorf("segment %d on %s: %w", id, r.Device, errs.ErrSegmentLost)
	}
	if p.moving.has(id) {
		return device.Backing{}, nil, fmt.Errorf("segment %d: %w; map it once the move ends", id, errMoveBusy)
	}
	d := p.device(r.Device)
	if d == nil { // it went away between placement and commit (hotplug.go)
		r.Lost = true
		return device.Backing{}, nil, fmt.Errorf("segment %d: its device %s went away: %w", id, r.Device, errs.ErrSegmentLost)
	}
	if d.tier == poolv1.Tier_TIER_RDMA {
		return device.Backing{}, nil, fmt.Errorf("segment %d is on the rdma tier, reached through the data plane at its key, not mapped: %w", id, errs.ErrAccessDenied)
	}
	if d.SharesFD() && !p.cfg.AllowDevdaxFD {
		return device.Backing{}, nil, fmt.Errorf("segment %d is on devdax device %s, whose descriptor reaches every segment: %w; start poold with --allow-devdax-fd to hand it out", id, d.Name(), errs.ErrAccessDenied)
	}
	b, err := d.Open(r.ID, r.Offset, r.Extent)
	if err != nil {
		if errors.Is(err, device.ErrLost) {
			r.Lost = true
			p.log.Warn("segment lost: its memory is gone", "segment", r.ID, "device", r.Device, "err", err)
			return device.Backing{}, nil, fmt.Errorf("segment %d: %w", id, err) // matches errs.ErrSegmentLost
		}
		return device.Backing{}, nil, err
	}
	b.Length = r.Size
	if c.client != nil {
		p.noteMapped(id, c.client.id, c.pid)
	}
	return b, p.flushMapped(id), nil
}
