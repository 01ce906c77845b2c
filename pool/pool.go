// This file holds the core: its state, its start from the segment table
// (restore, orphan sweep), its devices, the accessors through which the
// Daemon reaches its parts, and its close.

package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/google/btree"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/device"
	"github.com/farmem/farmem/internal/extent"
	"github.com/farmem/farmem/internal/session"
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

// core is what the Daemon serves: the devices, their extent allocators,
// the segment table, the clients' sessions and leases, and the peers it
// places on. The Daemon reaches it only through its methods. It is safe
// for concurrent use; one mutex serializes changes, and every change is
// committed to the metadata store before the call returns.
type core struct {
	cfg     Config
	log     *slog.Logger
	st      *store
	dp      *dataPlane       // serves rdma-tier segments; nil when disabled
	cl      *cluster.Cluster // gossip membership; nil without --gossip
	peers   *peers
	orphans orphans  // peers that may hold segments no record here names
	metrics *metrics // nil when the core runs without a Daemon
	auth    auth     // client ids' identities, data-plane credentials (auth.go)
	usage   usage    // segments and bytes per owner, for quotas and limits (quota.go)
	started time.Time
	now     func() time.Time

	// deleg holds the credentials peers delegated to this daemon's
	// clients (delegate.go).
	deleg delegations
	// told is, per home node, the peer session on which that home was
	// told who may use each segment placed there (homeclients.go).
	told homesTold
	// moving is the live moves under way or left to finish (move.go);
	// leftMoves those the last run left, until Serve resumes them.
	moving    moves
	leftMoves []intent
	// mappers are the clients that map each load/store segment, by its
	// id (mappers.go); under mu.
	mappers map[uint64]map[mapper]bool
	// held is the extents of freed segments that running processes still
	// map (holdExtent); under mu.
	held []heldExtent
	// mapped is what the daemon knows of the store's entries of who maps
	// its devdax segments (mappers.go); under mu.
	mapped mappedState
	// fwd is the data-plane connections of the copies and shards here
	// that forward their writes (replicate.go).
	fwd forwards
	// pushing is the connections of this node, the source of moves, to
	// their targets (movepush.go).
	pushing pushers
	// handing orders, on this node as a move's source, a SEAL's push
	// note and handover, and a step's taking of changed chunks or
	// sealing (whileCurrent), against an ABORT or TRACK of the segment
	// (moveOut): one runs wholly before the other.
	handing sync.Mutex
	// sealing is, under handing, the segments a SEAL is sealing in the
	// data plane, each with a channel closed once it is sealed
	// (moveout.go's sealData).
	sealing map[uint64]chan struct{}
	// aborted is the moves from this node whose ABORT ran (moveout.go):
	// a late PUSH or SEAL of one is refused.
	aborted abortedMoves
	// trackFills is the fill each segment here is tracked for, on this
	// node as a fill's source (moveout.go): an ABORT of another fill
	// leaves the tracking and seal be.
	trackFills trackFills

	mu sync.Mutex
	// devs are the devices placements go to, in the order tried. The
	// slice is replaced, never changed in place, when devices come and go
	// (hotplug.go), so a copy of it taken under mu stays valid.
	devs []*dev
	// gone are devices that went away while the daemon ran, by name,
	// until one of that name comes back: freeing a lost segment still
	// removes its backing on a NUMA device's directory.
	gone     map[string]*dev
	segs     map[uint64]*record
	order    *btree.BTreeG[uint64] // the ids in segs, for listing in pages (listing.go)
	names    map[string]uint64
	clients  map[string]*client
	sessions map[string]*sessionState
	// reclaimed holds, per client whose lease ran out, the ids of the
	// segments the reap freed, for its next session to be told.
	reclaimed reclaimNotices
	// drained is when memctl drain stopped placements for peers on this
	// node (zero while it takes them) and when it began to evacuate
	// (drain.go).
	drained drainState
	// evac moves the segments peers placed here to other nodes while the
	// node evacuates (evacuate.go).
	evac *evacuator
	// rb rebuilds the lost homes of redundant segments whose records are
	// here (rebuild.go).
	rb *rebuilder
	// moveRate paces the copies of the moves this daemon directs
	// (Config.MoveRate); nil: unlimited.
	moveRate *rateLimit
	// drainMu orders drains and undos, so that the gossip ends as the
	// store does (held without mu, around both).
	drainMu sync.Mutex
	// replicating holds the redundant segments whose homes replicateLater
	// is telling how to forward, true when asked again meanwhile;
	// replicateLocks orders replicate calls per segment (redundancy.go).
	replicating    map[uint64]bool
	replicateLocks sync.Map // segment id -> *sync.Mutex
	// stripes order writes to a segment's lost data shards, fence them
	// from a rebuild's or move's switch, and keep their connections
	// (lostwrite.go).
	stripes sync.Map // segment id -> *stripe
	// pendingRemote counts allocations on each peer not yet recorded here.
	pendingRemote map[string]int
	nextID        uint64
	idLimit       uint64 // ids below idLimit are durable as used
	closed        bool
	// unacked are the records of undone allocations whose removal from
	// the store failed, by id: retried until it lands, and once more
	// before the store closes (forget).
	unacked map[uint64]record
	// measured is what the tier probe found, per tier (see measure.go);
	// hmat is the firmware's read latency of the tier's NUMA node.
	measured map[poolv1.Tier]*measurement
	hmat     map[poolv1.Tier]*poolv1.Latency
	// probeMu serializes tier measurements: they share one segment id.
	probeMu sync.Mutex
	// firstMeasure is closed when the measurement of the tiers at start
	// is done; nil when none runs (see awaitFirstMeasure).
	firstMeasure chan struct{}
	// pm is what this daemon measured of its peers' data planes
	// (peerprobe.go); its own lock, never taken before mu.
	pm peerMeasures
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
	// powerSafe: the device's contents outlive the host's memory
	// (persistent memory, or an emulated device's files on a disk
	// filesystem), so its segments' records are fsynced (see store).
	powerSafe bool
}

func (d *dev) kindName() string {
	if d.kind != "" {
		return d.kind
	}
	return string(d.Kind())
}

func (d *dev) isEmulated() bool { return d.emulated || d.Emulated() }

// newCore opens the store, takes the devices and rebuilds the segment
// table. It owns devs from then on, closing them on failure. dp and m may
// be nil (no data plane; no metrics, as in tests without a Daemon).
func newCore(cfg Config, log *slog.Logger, devs []*dev, dp *dataPlane, m *metrics) (_ *core, err error) {
	p := &core{
		cfg: cfg, log: log, started: time.Now(), now: time.Now, devs: devs, dp: dp, metrics: m,
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
	if p.st.dropped {
		p.log.Info("the host restarted since poold last ran: the records of segments in volatile memory are gone, as their contents are", "file", p.st.volatile.path)
	}
	recs, next, rewritten, err := p.st.load()
	if err != nil {
		p.st.close()
		return nil, fmt.Errorf("metadata store: %w", err)
	}
	if rewritten > 0 {
		p.log.Info("rewrote segment records in the current schema", "records", rewritten, "version", recordVersion)
	}
	p.nextID, p.idLimit = next, next
	p.orphans.restarted = next > 1 || len(recs) > 0
	p.peers.onOrphan = func(node string) { p.mayHoldOrphans(node, nil) }
	if p.drained, err = p.st.drainState(); err != nil {
		p.st.close()
		return nil, fmt.Errorf("metadata store: %w", err)
	}
	p.evac = newEvacuator(p)
	p.rb = newRebuilder(p, int64(cfg.RebuildRate))
	if cfg.MoveRate > 0 {
		p.moveRate = &rateLimit{perSec: float64(cfg.MoveRate)}
	}
	if since := p.drained.since; !since.IsZero() {
		p.log.Info("draining, as memctl drain left it: no new placements for peers until 'memctl drain --undo'", "node", cfg.Node,
			"since", since.UTC().Format(time.RFC3339), "evacuating", !p.drained.evacSince.IsZero())
	}
	var migrated []*record
	for _, r := range recs {
		p.restore(r)
		if r.redundant() {
			p.moving.mightSeal(r.ID) // unsealIdle unseals them once
		}
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
	if err := p.restoreMapped(); err != nil {
		p.st.close()
		return nil, fmt.Errorf("metadata store: %w", err)
	}
	p.sweepOrphans()
	if err := p.loadMoves(); err != nil {
		p.st.close()
		return nil, fmt.Errorf("metadata store: %w", err)
	}
	if err := p.startAuth(); err != nil {
		p.st.close()
		return nil, err
	}
	return p, nil
}

// sweepOrphans removes segment files that no record names: a crash between
// a device's Create and the table commit leaves one behind.
func (p *core) sweepOrphans() {
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
func (p *core) restore(r *record) {
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
		if !r.Key.IsZero() {
			err = p.reexport(r, b)
		}
		b.File.Close()
		if err != nil {
			r.Lost = true
			p.log.Error("segment lost: cannot export it again", "segment", r.ID, "err", err)
		}
	}
	// Owners and attachers get a lease from now: those that do not come
	// back lose their segments and their attachments as if their lease
	// had run out before the restart (reap).
	for _, id := range append([]string{r.Owner}, r.Attached...) {
		if id != "" && p.clients[id] == nil {
			p.clients[id] = &client{id: id, expires: p.now().Add(p.leaseTTL(id) + restartGrace)}
		}
	}
	p.presumeMapped(r)
}

// reexport registers a restored rdma segment under the key its owner holds.
func (p *core) reexport(r *record, b device.Backing) error {
	if p.dp == nil {
		return errors.New("the data plane is disabled")
	}
	key := r.Key
	if _, err := p.dp.export(r.ID, b, r.Epoch, &key, false); err != nil {
		return err
	}
	p.allowData(r)
	switch {
	case r.Sealed:
		return p.resealData(r)
	case r.Forwards:
		return p.holdForwarding(r)
	}
	return nil
}

func (p *core) device(name string) *dev {
	for _, d := range p.devs {
		if d.Name() == name {
			return d
		}
	}
	return nil
}

// The Daemon reaches the core's parts through the methods below. Each part
// is safe for concurrent use on its own; the cluster is set once, before
// the daemon serves (useGossip).

// gossip is the cluster the core places segments on; nil without --gossip.
func (p *core) gossip() *cluster.Cluster { return p.cl }

// useGossip makes cl the cluster the core places on: peers that come back
// get their segments' state back (homeChanged).
func (p *core) useGossip(cl *cluster.Cluster) {
	p.cl = cl
	p.peers.onUp = func(node string) {
		p.tellHomeUp(node)
		p.homeChanged(node, true)
	}
}

// data is the data plane serving rdma-tier segments; nil when disabled.
func (p *core) data() *dataPlane { return p.dp }

// credentials binds client ids to identities and issues the data-plane
// credentials of sessions.
func (p *core) credentials() *auth { return &p.auth }

// peerConns is the control-plane sessions with peer daemons.
func (p *core) peerConns() *peers { return p.peers }

// startTime is when the core was made.
func (p *core) startTime() time.Time { return p.started }

// isClosed reports whether close has run.
func (p *core) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// storeHealth is nil while the metadata store commits and holds its
// reserve, else why not (store.health).
func (p *core) storeHealth() error { return p.st.health() }

// close closes the store and the devices; it is idempotent.
func (p *core) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	wait := p.flushMapped()
	p.mu.Unlock()
	if err := wait(); err != nil {
		p.log.Warn("record which processes map devdax segments before closing the store", "err", err)
	}
	p.evac.close()
	p.peers.close()
	p.pushing.close()
	p.mu.Lock()
	var err error
	if p.dp != nil {
		err = p.dp.close()
	}
	p.fwd.closeAll()
	p.stripes.Range(func(id, st any) bool {
		p.stripes.Delete(id)
		st.(*stripe).close()
		return true
	})
	p.forgetUnacked()
	return errors.Join(err, p.closeDevices(), p.st.close())
}

func (p *core) closeDevices() error {
	var err error
	for i := len(p.devs) - 1; i >= 0; i-- {
		err = errors.Join(err, p.devs[i].Close())
	}
	for _, d := range p.gone {
		err = errors.Join(err, d.Close())
	}
	return err
}

// deviceNamed is device for a caller that does not hold mu.
func (p *core) deviceNamed(name string) *dev {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.device(name)
}

// devices is the device list as it is now, for a caller that walks it
// without holding mu.
func (p *core) devices() []*dev {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.devs
}
