// This file holds placement: an Alloc request checked, its tiers tried in
// order, an extent and an id reserved on a device and committed.

package pool

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"unicode"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/extent"
	redspec "github.com/farmem/farmem/internal/redundancy"
	"github.com/farmem/farmem/internal/size"
)

// allocRequest is what a caller asks of Alloc. A plain value.
type allocRequest struct {
	// Size is the segment's size in bytes, 1 to MaxSegmentSize.
	Size int64
	// Tier is the tier asked for; TIER_UNSPECIFIED lets placement choose.
	Tier poolv1.Tier
	// Name, when set, makes the segment attachable by other clients and
	// pins it: it outlives its owner's lease until freed.
	Name string
	// Persist pins an unnamed segment the same way.
	Persist bool
	// Fallback lists tiers to try, in order, when Tier is full.
	Fallback []poolv1.Tier
	// HomeOnly places on this daemon's own memory (a peer asking).
	HomeOnly bool
	// FilledByCopy (with HomeOnly): the peer fills the segment by copying
	// another home's memory; it is exported so (dataPlane.export) until a
	// Replicate request says it joined.
	FilledByCopy bool
	// Allow and AllowFree are identities besides the creator's that may
	// attach a named segment, and attach and free it (see grants.go).
	Allow, AllowFree []string
	// ForClient is the client of the peer daemon that asks (HomeOnly) the
	// segment is for: its delegated credential may use it (delegate.go).
	ForClient string
	// MaxReadLatencyNs and MinReadBandwidthBps are a budget: only tiers
	// that meet it are tried (budget.go). 0: no bound.
	MaxReadLatencyNs, MinReadBandwidthBps int64
	// Redundancy is the copies or shards asked for; nil: the daemon's
	// default for the rdma tier (redundancy.go).
	Redundancy *redspec.Spec
}

func validName(name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: name of %d bytes is longer than %d", errs.ErrInvalid, len(name), MaxNameLen)
	}
	for _, r := range name {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("%w: name %q has a space or unprintable character; use letters, digits and punctuation", errs.ErrInvalid, name)
		}
	}
	return nil
}

func validTier(t poolv1.Tier) error {
	if _, ok := poolv1.Tier_name[int32(t)]; !ok {
		return fmt.Errorf("%w: unknown tier %d; use local, cxl, rdma or any", errs.ErrInvalid, t)
	}
	return nil
}

// Alloc places a new segment and commits it before returning. For the rdma
// tier it tries peers first (chosen by free capacity, then nearness: see
// pickPeer), then this daemon's own exported memory. A request with a read
// budget that arrives while the tiers' first measurement runs waits for
// it, as long as ctx allows.
func (p *core) Alloc(ctx context.Context, c caller, req allocRequest) (*record, error) {
	if req.Size <= 0 || req.Size > MaxSegmentSize {
		return nil, fmt.Errorf("%w: size %d; ask for 1 byte to %d bytes", errs.ErrInvalid, req.Size, int64(MaxSegmentSize))
	}
	if err := validName(req.Name); err != nil {
		return nil, err
	}
	if err := validGrants(req); err != nil {
		return nil, err
	}
	for _, t := range append([]poolv1.Tier{req.Tier}, req.Fallback...) {
		if err := validTier(t); err != nil {
			return nil, err
		}
	}
	if c.client == nil && !req.Persist && req.Name == "" {
		return nil, fmt.Errorf("%w: a call without a session must ask for a named or persistent segment, or nothing would keep it alive", errs.ErrInvalid)
	}
	if req.HomeOnly {
		p.mu.Lock()
		draining := !p.drained.since.IsZero()
		p.mu.Unlock()
		if draining {
			return nil, fmt.Errorf("alloc on %s: %w: the node is draining ('memctl drain --undo %s' accepts placements again)", p.cfg.Node, errs.ErrNoCapacity, p.cfg.Node)
		}
	}
	if req.MaxReadLatencyNs > 0 || req.MinReadBandwidthBps > 0 {
		if err := p.awaitFirstMeasure(ctx); err != nil {
			return nil, err
		}
	}
	spec, err := p.redundancyFor(req)
	if err != nil {
		return nil, err
	}
	if !spec.None() {
		r, err := p.allocRedundant(ctx, c, req, spec)
		if r != nil || err != nil {
			return r, err
		}
		// Fewer hosts than asked, and or-fewer: one plain rdma copy.
		req.Tier, req.Fallback = poolv1.Tier_TIER_RDMA, nil
	}
	pl, err := p.planFor(req)
	if err != nil {
		return nil, err
	}
	var tried []string
	for _, t := range pl.order {
		f := pl.figs[t]
		if t == poolv1.Tier_TIER_RDMA {
			f = pl.loopback
		}
		if t == poolv1.Tier_TIER_RDMA && !req.HomeOnly && p.cl != nil {
			r, err := p.allocRemote(ctx, c, req, pl)
			if err == nil {
				f := pl.peers[r.Home]
				r.placement = pl.placement(f, tried)
				r.placement.Reason += fmt.Sprintf("; on peer %s: %s", r.Home, f.latency())
				return r, nil
			}
			if !errors.Is(err, cluster.ErrNoPeer) {
				p.log.Warn("placement on a peer failed; trying this host's own memory", "err", err)
			}
			tried = append(tried, "rdma on peers: "+err.Error())
		}
		if t == poolv1.Tier_TIER_RDMA && pl.budget.set() {
			if miss := pl.budget.miss(f); miss != "" {
				tried = append(tried, "rdma on this host's own data plane: "+miss)
				continue
			}
		}
		r, why, err := p.allocLocal(c, t, req)
		if r != nil {
			r.placement = pl.placement(f, tried)
		}
		if r != nil || err != nil {
			return r, err
		}
		tried = append(tried, why...)
	}
	return nil, fmt.Errorf("alloc %d bytes: %w; tried %s", req.Size, errs.ErrNoCapacity, strings.Join(tried, "; "))
}

// allocLocal places a segment on one of this daemon's devices of tier t,
// or says why none could take it. The placement is made under p.mu and
// committed outside it, so that concurrent allocations share a metadata
// commit (see store); until the commit is done the segment is in no
// listing, and its name and extent are taken.
func (p *core) allocLocal(c caller, t poolv1.Tier, req allocRequest) (*record, []string, error) {
	r, d, tried, err := p.place(c, t, req)
	if r == nil {
		return nil, tried, err
	}
	err = p.st.put(r)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		// A commit that failed may still have reached the disk (bbolt
		// reports a failed sync after it wrote the pages). One refused for
		// want of space is left alone: its removal would spend the reserve
		// the store keeps for frees (see storeFile).
		if !errors.Is(err, errs.ErrNoCapacity) {
			p.forget(r)
		}
		p.unplace(r, d, true)
		return nil, nil, fmt.Errorf("alloc: commit to the metadata store: %w", err)
	}
	if p.device(d.Name()) != d {
		// It went away during the commit (hotplug.go), or is back under its
		// name with an allocator where r's extent is not taken: the
		// allocation is undone rather than kept lost, whose free could
		// give the new allocator an extent another segment holds.
		p.forget(r)
		p.unplace(r, d, true)
		return nil, nil, fmt.Errorf("alloc on %s: %w", d.Name(), errDeviceChanged)
	}
	p.link(r)
	p.log.Debug("alloc", "segment", r.ID, "tier", r.Tier, "device", r.Device, "size", r.Size, "owner", r.Owner)
	cp := *r // the table's record changes under p.mu; callers get a copy
	return &cp, nil, nil
}

// place reserves an extent, an id and the name for a new segment on a
// device of tier t and creates its backing, not yet committed; it
// returns the record and the device it is on.
func (p *core) place(c caller, t poolv1.Tier, req allocRequest) (*record, *dev, []string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, nil, fmt.Errorf("alloc: %w", errs.ErrUnavailable)
	}
	if req.Name != "" {
		if _, ok := p.names[req.Name]; ok {
			return nil, nil, nil, fmt.Errorf("alloc %q: %w", req.Name, errs.ErrExists)
		}
	}
	if why, err := p.admit(c, t, req.Size); err != nil || why != "" {
		return nil, nil, []string{why}, err
	}
	var tried []string
	seen := false
	for _, d := range p.devs {
		if d.tier != t || !d.usable {
			continue
		}
		seen = true
		r, err := p.allocOn(c, d, req)
		if err == nil {
			return r, d, nil, nil
		}
		// No room on this device, by its accounting (extent) or its backing
		// filesystem (device): the next device or tier may have it. A full
		// metadata store is the node's, not the device's.
		if !errors.Is(err, errs.ErrNoCapacity) || errors.Is(err, errMetadataFull) {
			return nil, nil, nil, err
		}
		if errors.Is(err, extent.ErrNoSpace) {
			st := d.ext.Stats()
			tried = append(tried, fmt.Sprintf("%s (%s): largest free extent %s of %s free", tierName(t), d.Name(), size.Size(st.LargestFree).Human(), size.Size(st.Free).Human()))
		} else {
			tried = append(tried, fmt.Sprintf("%s (%s): %v", tierName(t), d.Name(), err))
		}
	}
	if !seen {
		tried = append(tried, fmt.Sprintf("%s: %s", tierName(t), p.whyNoTier(t)))
	}
	return nil, nil, tried, nil
}

// whyNoTier explains a tier that has no usable device.
func (p *core) whyNoTier(t poolv1.Tier) string {
	for _, d := range p.devs {
		if d.tier == t && !d.usable {
			return d.note
		}
	}
	switch t {
	case poolv1.Tier_TIER_RDMA:
		return "this daemon offers no rdma tier (no peers and no loopback data plane)"
	case poolv1.Tier_TIER_LOCAL:
		return "the local tier is disabled (--local-size 0)"
	case poolv1.Tier_TIER_CXL:
		return "no CXL memory found and emulation is disabled (--emulate-cxl 0)"
	}
	return "no device"
}

// allocOn places a segment on d: with p.mu held it takes the extent, an
// id, the name and the owner's usage; then it lets p.mu go while the
// device reserves the backing's memory (fallocate, which zeroes a tmpfs
// file's pages: milliseconds for a large segment, while every session's
// calls and a move's switch-over wait for p.mu), and takes it again to
// export the segment. It returns with p.mu held, and undoes what it took
// when it fails.
func (p *core) allocOn(c caller, d *dev, req allocRequest) (*record, error) {
	off, err := d.ext.Alloc(req.Size)
	if err != nil {
		return nil, err
	}
	length := roundUp(req.Size, d.Align())
	id, err := p.newID()
	if err != nil {
		d.ext.Free(off, length)
		return nil, err
	}
	r := &record{
		ID: id, Name: req.Name, Tier: d.tier, Device: d.Name(), Offset: off, Extent: length,
		Size: req.Size, Owner: c.id(), Persist: req.Persist, Epoch: 1, Created: p.now().UTC(), Volatile: !d.powerSafe,
	}
	r.grant(c, req)
	r.Delegates = delegatesOf(c, req)
	if r.Name != "" {
		p.names[r.Name] = id
	}
	p.usage.add(r)
	p.mu.Unlock()
	b, err := d.Create(id, off, length)
	p.mu.Lock()
	if err != nil {
		p.unplace(r, d, false)
		return nil, fmt.Errorf("alloc on %s: %w", d.Name(), err)
	}
	defer b.File.Close()
	switch {
	case p.closed:
		err = fmt.Errorf("alloc: %w", errs.ErrUnavailable)
	case p.device(d.Name()) != d:
		// Gone, or back under its name with an allocator of its own where
		// r's extent is not taken: a record naming it could share its
		// memory with another segment's.
		err = fmt.Errorf("alloc on %s: %w", d.Name(), errDeviceChanged)
	case d.tier == poolv1.Tier_TIER_RDMA:
		if r.Key, err = p.dp.export(id, b, r.Epoch, nil, req.HomeOnly && req.FilledByCopy); err != nil {
			err = fmt.Errorf("alloc: export on the data plane: %w", err)
		} else {
			p.allowData(r)
		}
	}
	if err != nil {
		p.unplace(r, d, true)
		return nil, err
	}
	return r, nil
}

// errDeviceChanged is an allocation whose device went away, or was
// replaced under its name, while its backing was made: the next device
// may have room.
var errDeviceChanged = errs.Sub(errs.ErrNoCapacity, "the device went away or was replaced during the allocation")

// forget removes from the store the record of r, an allocation undone
// before it was acknowledged: a restart that found it would restore a
// segment nobody was told of, counted against its owner, whose extent
// the device may have given to another segment since. When the store
// refuses the removal, it is retried in the background until it lands,
// and once more when the core closes (forgetUnacked). p.mu is held.
func (p *core) forget(r *record) {
	err := p.st.delete(r)
	if err == nil {
		return
	}
	p.log.Warn("the record of an undone allocation could not be removed; retrying in the background", "segment", r.ID, "device", r.Device, "err", err)
	if p.unacked == nil {
		p.unacked = map[uint64]record{}
	}
	p.unacked[r.ID] = *r
	id := r.ID
	p.retryLater(func(context.Context) error {
		p.mu.Lock()
		r, ok := p.unacked[id]
		p.mu.Unlock()
		if !ok {
			return nil
		}
		if err := p.st.delete(&r); err != nil {
			return err
		}
		p.mu.Lock()
		delete(p.unacked, id)
		p.mu.Unlock()
		p.log.Info("removed the record of an undone allocation", "segment", id)
		return nil
	})
}

// forgetUnacked makes a last try at removing the records forget could not,
// before the store closes; the background retries have ended. p.mu is
// held.
func (p *core) forgetUnacked() {
	for id, r := range p.unacked {
		if err := p.st.delete(&r); err != nil {
			p.log.Error("the record of an undone allocation could not be removed: after a restart it shows as a lost segment, whose extent the device may have given to another segment since; free it (memctl free) once the store commits again", "segment", id, "device", r.Device, "err", err)
			continue
		}
		delete(p.unacked, id)
	}
}

// unplace undoes the placement of r on d that no commit holds: the
// name, the export, the owner's usage, the backing if made, and the
// extent. The extent is given back only while d is the device of its
// name: one that went away meanwhile (hotplug.go) took its allocator
// with it, and one that came back under the name since has a new one,
// where r's extent is not taken (another segment may hold it). p.mu is
// held, and let go while the data plane revokes the export: the revoke
// waits until no operation touches the segment's memory, and unmaps it,
// which must not stall every other call. Nobody else reaches r meanwhile
// (it is in no table), and its backing and extent stay its own until the
// revoke is done, so no other segment is given memory the data plane
// still serves.
func (p *core) unplace(r *record, d *dev, backing bool) {
	if r.Name != "" && p.names[r.Name] == r.ID {
		delete(p.names, r.Name)
	}
	if !r.Key.IsZero() {
		p.mu.Unlock()
		if hook := p.cfg.sim.revoking; hook != nil {
			hook(r.ID)
		}
		p.dp.revoke(r.ID)
		p.mu.Lock()
	}
	p.usage.sub(r)
	if backing {
		// d's own: a device that went away keeps removing its segments'
		// files while it is in p.gone.
		d.Remove(r.ID, r.Offset, r.Extent)
	}
	if p.device(d.Name()) == d {
		d.ext.Free(r.Offset, r.Extent)
	}
}

func roundUp(n, align int64) int64 { return (n + align - 1) / align * align }

// newID hands out a segment id that is durable as used.
func (p *core) newID() (uint64, error) {
	if p.nextID >= p.idLimit {
		if err := p.st.reserveIDs(p.nextID + idBlock); err != nil {
			return 0, fmt.Errorf("reserve segment ids: %w", err)
		}
		p.idLimit = p.nextID + idBlock
	}
	id := p.nextID
	p.nextID++
	return id, nil
}
