package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/google/btree"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/extent"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/tier"
	"github.com/farmem/farmem/rdma"
)

// Limits on requests, each with a clear error when exceeded.
const (
	// MaxNameLen is the longest segment name, in bytes.
	MaxNameLen = 255
	// MaxSegmentSize is the largest segment one Alloc can ask for (64 TiB).
	MaxSegmentSize = 1 << 46
	// idBlock is how many segment ids are made durable as used at a time.
	idBlock = 1024
	// restartGrace is added to the lease of clients the daemon finds in its
	// table at start, so that a client backing off while the daemon was
	// down (at most 2s between tries) has a full lease to come back in.
	restartGrace = 2 * time.Second
)

// Pool is the daemon's core: the devices, their extent allocators, the
// segment table and the clients' leases. It is safe for concurrent use; one
// mutex serializes changes, and every change is committed to the metadata
// store before the call returns.
type Pool struct {
	cfg     Config
	log     *slog.Logger
	st      *store
	dp      *dataPlane       // serves rdma-tier segments; nil when disabled
	cl      *cluster.Cluster // gossip membership; nil without --gossip
	peers   *peers
	metrics *metrics // nil when the Pool runs without a Daemon
	auth    auth     // client ids' identities, data-plane credentials (auth.go)
	usage   usage    // segments and bytes per owner, for quotas and limits (quota.go)
	started time.Time
	now     func() time.Time

	mu       sync.Mutex
	devs     []*dev
	segs     map[uint64]*record
	order    *btree.BTreeG[uint64] // the ids in segs, for listing in pages (listing.go)
	names    map[string]uint64
	clients  map[string]*client
	sessions map[string]*sessionState
	draining bool // no new placements for peers (memctl drain)
	// pendingRemote counts allocations on each peer not yet recorded here.
	pendingRemote map[string]int
	nextID        uint64
	idLimit       uint64 // ids below idLimit are durable as used
	closed        bool
	// measured is what the tier probe found, per tier (see measure.go);
	// hmat is the firmware's read latency of the tier's NUMA node.
	measured map[poolv1.Tier]*measurement
	hmat     map[poolv1.Tier]*poolv1.Latency
	// probeMu serializes tier measurements: they share one segment id.
	probeMu sync.Mutex
}

// dev is a device with its tier and extent allocator.
type dev struct {
	device.Device
	tier poolv1.Tier
	ext  *extent.Allocator
	note string // why the device is labelled as it is, or why it is not used
	// usable is false for a device that local clients cannot map (a
	// devdax device without AllowDevdaxFD).
	usable bool
	// kind, when set, replaces the device's own kind in listings (the
	// export device shows how it is reached: loopback, tcp).
	kind     string
	emulated bool // shown as emulated although the device is not (loopback rdma)
}

func (d *dev) kindName() string {
	if d.kind != "" {
		return d.kind
	}
	return string(d.Kind())
}

func (d *dev) isEmulated() bool { return d.emulated || d.Emulated() }

// client is one application identity with its sessions and lease.
type client struct {
	id       string
	name     string
	pid      int64
	uid      uint32
	sessions int
	expires  time.Time // when sessions == 0: when its unpinned segments are reclaimed
}

// caller is who makes a control-plane call: a session's client, or an
// administrator (a call without a session from an identity in
// Config.Admins, e.g. memctl as root).
type caller struct {
	client *client // nil for an administrator
	// ident is the identity the transport proved (uid:N, cn:NAME,
	// insecure); "" for the daemon's own calls.
	ident string
	// gid is the primary gid of a unix-socket caller (local).
	gid   uint32
	local bool
}

func (c caller) id() string {
	if c.client == nil {
		return ""
	}
	return c.client.id
}

// newPool opens the store, takes the devices and rebuilds the segment table.
// It owns devs from then on, closing them on failure.
func newPool(cfg Config, log *slog.Logger, devs []*dev, dp *dataPlane) (_ *Pool, err error) {
	p := &Pool{
		cfg: cfg, log: log, started: time.Now(), now: time.Now, devs: devs, dp: dp,
		peers: &peers{self: cfg.Node, log: log, conns: map[string]*session.Conn{}, stop: make(chan struct{})},
		segs:  map[uint64]*record{}, order: btree.NewOrderedG[uint64](32), names: map[string]uint64{},
		clients: map[string]*client{}, sessions: map[string]*sessionState{}, pendingRemote: map[string]int{},
	}
	defer func() {
		if err != nil {
			p.closeDevices()
		}
	}()
	if p.st, err = openStore(cfg.DataDir, cfg.MetadataFsync); err != nil {
		return nil, err
	}
	p.auth.st = p.st
	recs, next, err := p.st.load()
	if err != nil {
		p.st.close()
		return nil, fmt.Errorf("metadata store: %w", err)
	}
	p.nextID, p.idLimit = next, next
	var migrated []*record
	for _, r := range recs {
		p.restore(r)
		if p.migrateGrants(r) {
			migrated = append(migrated, r)
		}
	}
	if len(migrated) > 0 { // one commit for all, not an fsync each
		if err := p.st.put(migrated...); err != nil {
			p.st.close()
			return nil, fmt.Errorf("metadata store: record the grants of %d named segments: %w", len(migrated), err)
		}
	}
	p.sweepOrphans()
	if err := p.startAuth(); err != nil {
		p.st.close()
		return nil, err
	}
	return p, nil
}

// sweepOrphans removes segment files that no record names: a crash between
// a device's Create and the table commit leaves one behind.
func (p *Pool) sweepOrphans() {
	for _, d := range p.devs {
		lister, ok := d.Device.(interface{ Segments() ([]uint64, error) })
		if !ok {
			continue
		}
		ids, err := lister.Segments()
		if err != nil {
			p.log.Warn("list segment files", "device", d.Name(), "err", err)
			continue
		}
		for _, id := range ids {
			if r, ok := p.segs[id]; ok && r.Device == d.Name() {
				continue
			}
			if err := d.Remove(id, 0, d.Align()); err != nil {
				p.log.Warn("remove an orphaned segment file", "device", d.Name(), "segment", id, "err", err)
				continue
			}
			p.log.Info("removed an orphaned segment file (a crash between create and commit)", "device", d.Name(), "segment", id)
		}
	}
}

// restore puts a stored record back: its extent reserved, its device
// checked, its owner given one lease TTL to come back.
func (p *Pool) restore(r *record) {
	p.link(r)
	p.usage.add(r)
	if r.Name != "" {
		p.names[r.Name] = r.ID
	}
	d := p.device(r.Device)
	switch {
	case r.Home != "":
		// On a peer: reachable as long as the peer is; the cluster says.
	case d == nil:
		r.Lost = true
		p.log.Warn("segment lost: its device is gone", "segment", r.ID, "device", r.Device)
	default:
		if err := d.ext.Reserve(r.Offset, r.Extent); err != nil {
			r.Lost = true
			p.log.Error("segment lost: its extent cannot be reserved", "segment", r.ID, "device", r.Device, "err", err)
			break
		}
		b, err := d.Open(r.ID, r.Offset, r.Extent)
		if err != nil {
			r.Lost = true
			p.log.Warn("segment lost: contents did not survive the restart", "segment", r.ID, "device", r.Device, "err", err)
			break
		}
		if r.Key != "" {
			err = p.reexport(r, b)
		}
		b.File.Close()
		if err != nil {
			r.Lost = true
			p.log.Error("segment lost: cannot export it again", "segment", r.ID, "err", err)
		}
	}
	if r.Owner != "" && p.clients[r.Owner] == nil {
		p.clients[r.Owner] = &client{id: r.Owner, expires: p.now().Add(p.cfg.LeaseTTL + restartGrace)}
	}
}

// reexport registers a restored rdma segment under the key its owner holds.
func (p *Pool) reexport(r *record, b device.Backing) error {
	if p.dp == nil {
		return errors.New("the data plane is disabled")
	}
	key, err := rdma.ParseKey(r.Key)
	if err != nil {
		return err
	}
	_, err = p.dp.export(r.ID, b, r.Epoch, &key)
	return err
}

func (p *Pool) device(name string) *dev {
	for _, d := range p.devs {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// AllocRequest is what a caller asks of Alloc. A plain value.
type AllocRequest struct {
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
	// Allow and AllowFree are identities besides the creator's that may
	// attach a named segment, and attach and free it (see grants.go).
	Allow, AllowFree []string
}

// tierOrder is the order in which a request tries tiers.
func tierOrder(req AllocRequest) []poolv1.Tier {
	first := []poolv1.Tier{req.Tier}
	if req.Tier == poolv1.Tier_TIER_UNSPECIFIED {
		first = []poolv1.Tier{poolv1.Tier_TIER_CXL, poolv1.Tier_TIER_LOCAL, poolv1.Tier_TIER_RDMA}
	}
	var out []poolv1.Tier
	for _, t := range append(first, req.Fallback...) {
		if !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	return out
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
// tier it tries peers first (chosen by free capacity), then this daemon's
// own exported memory.
func (p *Pool) Alloc(ctx context.Context, c caller, req AllocRequest) (*record, error) {
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
		draining := p.draining
		p.mu.Unlock()
		if draining {
			return nil, fmt.Errorf("alloc on %s: %w: the node is draining ('memctl drain --undo %s' accepts placements again)", p.cfg.Node, errs.ErrNoCapacity, p.cfg.Node)
		}
	}
	var tried []string
	for _, t := range tierOrder(req) {
		if t == poolv1.Tier_TIER_RDMA && !req.HomeOnly && p.cl != nil {
			r, err := p.allocRemote(ctx, c, req)
			if err == nil {
				return r, nil
			}
			if !errors.Is(err, cluster.ErrNoPeer) {
				p.log.Warn("placement on a peer failed; trying this host's own memory", "err", err)
			}
			tried = append(tried, "rdma on peers: "+err.Error())
		}
		r, why, err := p.allocLocal(c, t, req)
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
func (p *Pool) allocLocal(c caller, t poolv1.Tier, req AllocRequest) (*record, []string, error) {
	r, tried, err := p.place(c, t, req)
	if r == nil {
		return nil, tried, err
	}
	err = p.st.put(r)
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.unplace(r)
		return nil, nil, fmt.Errorf("alloc: commit to the metadata store: %w", err)
	}
	p.link(r)
	p.log.Debug("alloc", "segment", r.ID, "tier", r.Tier, "device", r.Device, "size", r.Size, "owner", r.Owner)
	cp := *r // the table's record changes under p.mu; callers get a copy
	return &cp, nil, nil
}

// place reserves an extent, an id and the name for a new segment on a
// device of tier t and creates its backing, not yet committed.
func (p *Pool) place(c caller, t poolv1.Tier, req AllocRequest) (*record, []string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, nil, fmt.Errorf("alloc: %w", errs.ErrUnavailable)
	}
	if req.Name != "" {
		if _, ok := p.names[req.Name]; ok {
			return nil, nil, fmt.Errorf("alloc %q: %w", req.Name, errs.ErrExists)
		}
	}
	if why, err := p.admit(c, t, req.Size); err != nil || why != "" {
		return nil, []string{why}, err
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
			p.usage.add(r)
			return r, nil, nil
		}
		// No room on this device, by its accounting (extent) or its backing
		// filesystem (device): the next device or tier may have it. A full
		// metadata store is the node's, not the device's.
		if !errors.Is(err, errs.ErrNoCapacity) || errors.Is(err, errMetadataFull) {
			return nil, nil, err
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
	return nil, tried, nil
}

// whyNoTier explains a tier that has no usable device.
func (p *Pool) whyNoTier(t poolv1.Tier) string {
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

func (p *Pool) allocOn(c caller, d *dev, req AllocRequest) (*record, error) {
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
	b, err := d.Create(id, off, length)
	if err != nil {
		d.ext.Free(off, length)
		return nil, fmt.Errorf("alloc on %s: %w", d.Name(), err)
	}
	r := &record{
		ID: id, Name: req.Name, Tier: tierName(d.tier), Device: d.Name(), Offset: off, Extent: length,
		Size: req.Size, Owner: c.id(), Persist: req.Persist, Epoch: 1, Created: p.now().UTC(),
	}
	r.grant(c, req)
	if d.tier == poolv1.Tier_TIER_RDMA {
		key, err := p.dp.export(id, b, r.Epoch, nil)
		if err != nil {
			b.File.Close()
			d.Remove(id, off, length)
			d.ext.Free(off, length)
			return nil, fmt.Errorf("alloc: export on the data plane: %w", err)
		}
		r.Key = key.String()
	}
	b.File.Close()
	if r.Name != "" {
		p.names[r.Name] = id
	}
	return r, nil
}

// unplace undoes a placement whose commit failed.
func (p *Pool) unplace(r *record) {
	p.usage.sub(r)
	if r.Key != "" {
		p.dp.revoke(r.ID)
	}
	if r.Name != "" && p.names[r.Name] == r.ID {
		delete(p.names, r.Name)
	}
	d := p.device(r.Device)
	d.Remove(r.ID, r.Offset, r.Extent)
	d.ext.Free(r.Offset, r.Extent)
}

func roundUp(n, align int64) int64 { return (n + align - 1) / align * align }

// newID hands out a segment id that is durable as used.
func (p *Pool) newID() (uint64, error) {
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

// lookup finds a segment by id or, when id is 0, by name.
func (p *Pool) lookup(id uint64, name string) (*record, error) {
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
func (p *Pool) Free(c caller, id uint64, name string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(id, name)
	if err != nil {
		return err
	}
	if !mayFree(c, r) {
		return freeDenied(c, r)
	}
	// Out of the table while the removal commits outside p.mu (grouped
	// with concurrent commits): nobody else frees, maps or reclaims it
	// meanwhile. A crash before the commit leaves it whole, as never freed.
	p.unlink(r)
	p.mu.Unlock()
	err = p.st.delete(r.ID)
	p.mu.Lock()
	if err != nil {
		p.link(r)
		if r.Name != "" {
			p.names[r.Name] = r.ID
		}
		return fmt.Errorf("free segment %d: commit to the metadata store: %w", r.ID, err)
	}
	p.release(r, "freed")
	return nil
}

// link puts a record in the table (not its name: callers do).
func (p *Pool) link(r *record) {
	p.segs[r.ID] = r
	p.order.ReplaceOrInsert(r.ID)
}

// unlink takes a record out of the table, not the store.
func (p *Pool) unlink(r *record) {
	delete(p.segs, r.ID)
	p.order.Delete(r.ID)
	if r.Name != "" && p.names[r.Name] == r.ID {
		delete(p.names, r.Name)
	}
}

func (p *Pool) freeLocked(r *record, reason string) error {
	if err := p.st.delete(r.ID); err != nil {
		return fmt.Errorf("free segment %d: commit to the metadata store: %w", r.ID, err)
	}
	p.unlink(r)
	p.release(r, reason)
	return nil
}

// release returns a record's memory once its removal is committed: the
// data plane fences it, its backing goes and its extent is free again.
func (p *Pool) release(r *record, reason string) {
	p.usage.sub(r)
	if r.Home != "" {
		p.peers.freeLater(r.Home, r.HomeID)
	} else if r.Key != "" && p.dp != nil {
		p.dp.fence(r.ID)
	}
	if d := p.device(r.Device); d != nil && r.Home == "" {
		if err := d.Remove(r.ID, r.Offset, r.Extent); err != nil {
			p.log.Error("remove segment backing", "segment", r.ID, "device", r.Device, "err", err)
		}
		if err := d.ext.Free(r.Offset, r.Extent); err != nil && !r.Lost {
			p.log.Error("return extent", "segment", r.ID, "device", r.Device, "err", err)
		}
	}
	p.metrics.released(r, reason)
	p.log.Debug("segment released", "segment", r.ID, "reason", reason, "size", r.Size, "owner", r.Owner)
}

// Attach gives the caller access to a named segment.
func (p *Pool) Attach(c caller, name string) (*record, error) {
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
		next := *r
		next.Attached = append(slices.Clone(r.Attached), c.client.id)
		if err := p.st.put(&next); err != nil {
			return nil, fmt.Errorf("attach %q: commit to the metadata store: %w", name, err)
		}
		*r = next
	}
	cp := *r
	return &cp, nil
}

// Detach withdraws the caller's attachment to a segment (its client id
// from Attached), so that the caller may no longer map or free it; the
// segment stays for its owner and other attachers. Nothing to withdraw
// (the caller owns the segment, or never attached it) is not an error.
func (p *Pool) Detach(c caller, id uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(id, "")
	if err != nil {
		return err
	}
	if c.client == nil {
		return nil
	}
	i := slices.Index(r.Attached, c.client.id)
	if i < 0 {
		return nil
	}
	next := *r
	next.Attached = slices.Delete(slices.Clone(r.Attached), i, i+1)
	if err := p.st.put(&next); err != nil {
		return fmt.Errorf("detach segment %d: commit to the metadata store: %w", id, err)
	}
	*r = next
	return nil
}

// Stat returns a copy of one segment.
func (p *Pool) Stat(id uint64) (record, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(id, "")
	if err != nil {
		return record{}, err
	}
	return *r, nil
}

// List returns copies of every segment, by id.
func (p *Pool) List() []record {
	recs, _ := p.listPage(0, 0)
	return recs
}

// listPage returns copies of up to limit segments (0: no limit) with ids
// above after, by id, and whether more follow.
func (p *Pool) listPage(after uint64, limit int) (recs []record, more bool) {
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
func (p *Pool) segmentCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.segs)
}

// leaseExpiry is when an unpinned segment will be reclaimed if its owner
// stays away; zero while the owner holds a session, or for pinned segments.
func (p *Pool) leaseExpiry(r *record) time.Time {
	if r.pinned() {
		return time.Time{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.clients[r.Owner]; c != nil && c.sessions == 0 {
		return c.expires
	}
	return time.Time{}
}

// Backing opens a segment's memory for a caller that may use it.
func (p *Pool) Backing(c caller, id uint64) (device.Backing, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, err := p.lookup(id, "")
	if err != nil {
		return device.Backing{}, err
	}
	if !mayUse(c, r) {
		return device.Backing{}, fmt.Errorf("segment %d: %w", id, errs.ErrAccessDenied)
	}
	if r.Lost {
		return device.Backing{}, fmt.Errorf("segment %d on %s: %w", id, r.Device, errs.ErrSegmentLost)
	}
	d := p.device(r.Device)
	if d.tier == poolv1.Tier_TIER_RDMA {
		return device.Backing{}, fmt.Errorf("segment %d is on the rdma tier, reached through the data plane at its key, not mapped: %w", id, errs.ErrAccessDenied)
	}
	if d.SharesFD() && !p.cfg.AllowDevdaxFD {
		return device.Backing{}, fmt.Errorf("segment %d is on devdax device %s, whose descriptor reaches every segment: %w; start poold with --allow-devdax-fd to hand it out", id, d.Name(), errs.ErrAccessDenied)
	}
	b, err := d.Open(r.ID, r.Offset, r.Extent)
	if err != nil {
		if errors.Is(err, device.ErrLost) {
			r.Lost = true
			p.log.Warn("segment lost: its memory is gone", "segment", r.ID, "device", r.Device, "err", err)
			return device.Backing{}, fmt.Errorf("segment %d: %w", id, err) // matches errs.ErrSegmentLost
		}
		return device.Backing{}, err
	}
	b.Length = r.Size
	return b, nil
}

// sessionState is one live session: its client and the notices queued for it.
type sessionState struct {
	client *client
	events chan *poolv1.SegmentEvents
}

// openSession starts (or resumes) a client's session and returns the
// channel on which the client's segment notices arrive.
func (p *Pool) openSession(sessionID, clientID, name string, pid int64, uid uint32) <-chan *poolv1.SegmentEvents {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.clients[clientID]
	if c == nil {
		c = &client{id: clientID}
		p.clients[clientID] = c
	}
	c.name, c.pid, c.uid = name, pid, uid
	c.sessions++
	st := &sessionState{client: c, events: make(chan *poolv1.SegmentEvents, 64)}
	p.sessions[sessionID] = st
	return st.events
}

// notifyLocked queues segment notices for every session of each owner; a
// session whose queue is full misses them (its next operation finds out).
func (p *Pool) notifyLocked(byOwner map[string]*poolv1.SegmentEvents) {
	for _, st := range p.sessions {
		ev := byOwner[st.client.id]
		if ev == nil {
			continue
		}
		select {
		case st.events <- ev:
		default:
			p.log.Warn("segment notice dropped: client not reading its session", "client", st.client.id)
		}
	}
}

// closeSession ends a session; the client's lease runs out one TTL after
// its last session ends.
func (p *Pool) closeSession(sessionID string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.sessions[sessionID]
	if st == nil {
		return
	}
	c := st.client
	delete(p.sessions, sessionID)
	c.sessions--
	if c.sessions == 0 {
		c.expires = p.now().Add(p.cfg.LeaseTTL)
	}
}

// callerFor resolves a session id ("" for an administrator).
func (p *Pool) callerFor(sessionID string) (caller, error) {
	if sessionID == "" {
		return caller{}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.sessions[sessionID]
	if st == nil {
		return caller{}, fmt.Errorf("session %q: %w (the session ended; the client reconnects by itself)", sessionID, errs.ErrLeaseExpired)
	}
	return caller{client: st.client}, nil
}

// reap reclaims the unpinned segments of clients whose lease ran out.
func (p *Pool) reap() {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for id, c := range p.clients {
		if c.sessions > 0 || now.Before(c.expires) {
			continue
		}
		var n int
		var bytes int64
		for _, r := range p.segs {
			if r.Owner == id && !r.pinned() {
				if err := p.freeLocked(r, "lease expired"); err != nil {
					p.log.Error("reclaim", "segment", r.ID, "err", err)
					continue
				}
				n++
				bytes += r.Size
			}
		}
		delete(p.clients, id)
		if segs, _ := p.usage.of([]string{id}, ""); segs == 0 {
			p.auth.forget(id)
		}
		p.metrics.leaseExpired()
		if n > 0 {
			p.log.Info("reclaimed segments of a client whose lease expired", "client", id, "segments", n, "bytes", bytes)
		}
	}
}

// tiers summarizes devices per tier.
func (p *Pool) tiers() []*poolv1.TierInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	byTier := map[poolv1.Tier]*poolv1.TierInfo{}
	var order []poolv1.Tier
	var largest = map[poolv1.Tier]int64{}
	for _, d := range p.devs {
		ti := byTier[d.tier]
		if ti == nil {
			ti = &poolv1.TierInfo{Tier: d.tier, Kind: d.kindName(), NumaNode: int32(d.Node())}
			if d.tier == poolv1.Tier_TIER_RDMA {
				ti.Transport = "tcp"
			}
			byTier[d.tier] = ti
			order = append(order, d.tier)
		} else if ti.Kind != d.kindName() {
			ti.Kind += "+" + d.kindName()
		}
		st := d.ext.Stats()
		ti.Emulated = ti.Emulated || d.isEmulated()
		ti.Capacity += st.Capacity
		if d.usable {
			ti.Free += st.Free
		}
		ti.Devices = append(ti.Devices, d.Name())
		ti.Segments += int64(st.Allocated) // one extent per segment on the device
		largest[d.tier] = max(largest[d.tier], st.LargestFree)
		if d.note != "" {
			if ti.Note != "" {
				ti.Note += "; "
			}
			ti.Note += d.note
		}
	}
	out := make([]*poolv1.TierInfo, 0, len(order)+1)
	for _, t := range order {
		ti := byTier[t]
		if ti.Free > 0 {
			ti.Fragmentation = 1 - float64(largest[t])/float64(ti.Free)
		}
		p.addMeasured(ti)
		out = append(out, ti)
	}
	return out
}

// sessionCount is the number of live sessions.
func (p *Pool) sessionCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.sessions)
}

// close closes the store and the devices; it is idempotent.
func (p *Pool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.peers.close()
	p.mu.Lock()
	var err error
	if p.dp != nil {
		err = p.dp.close()
	}
	return errors.Join(err, p.closeDevices(), p.st.close())
}

func (p *Pool) closeDevices() error {
	var err error
	for i := len(p.devs) - 1; i >= 0; i-- {
		err = errors.Join(err, p.devs[i].Close())
	}
	return err
}

// tierName is the tier's canonical name, used in records, flags, metrics
// and listings.
func tierName(t poolv1.Tier) string { return tier.Name(t) }
