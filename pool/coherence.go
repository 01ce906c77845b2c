package pool

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/coherence"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// coherenceHost keeps the coherence directories of the shared segments
// this daemon is home to, one coherence.Home per segment, created when the
// first sharer's message arrives (the page size is the sharer's), and
// serves the MSG opcode of the data plane with them. Safe for concurrent
// use.
type coherenceHost struct {
	log   *slog.Logger
	lease time.Duration

	mu       sync.Mutex
	homes    map[uint64]*sharedHome
	restored map[uint64]time.Time // segments re-exported after a restart, and when
	closed   bool
	stop     chan struct{}
	wg       sync.WaitGroup
}

// sharedHome is one segment's directory and the mapping it was made for.
type sharedHome struct {
	home *coherence.Home
	mem  unsafe.Pointer
	size int
	// owners binds each sharer id to the data-plane principal that first
	// spoke as it, so that a client that learns another's sharer id
	// cannot release its pages, take its invalidations or acknowledge
	// them for it; perPrincipal counts each principal's. Guarded by
	// coherenceHost.mu.
	owners       map[coherence.SharerID]*sharerOwner
	perPrincipal map[string]int
}

// sharerOwner is the principal a sharer id is bound to, and when the id
// was last heard from.
type sharerOwner struct {
	principal string
	seen      time.Time
}

// ownerIdle is how long a sharer id not heard from stays bound to its
// principal: well past its leases (a second each), so that a sharer cut
// off for a while comes back to its own id; then the binding is dropped,
// so that the table holds only sharers that speak.
const ownerIdle = time.Minute

// maxSharersPerPrincipal bounds the sharer ids one principal has bound
// per segment (heard from within ownerIdle): a client cannot grow a
// directory's table without bound by speaking as ever new ids, nor crowd
// out other clients' attachments. Each attachment draws an id of its own
// and a detached one's stays bound until ownerIdle, so this is what one
// client id may attach a segment within a minute; the ids of a segment
// are bounded by its attachers (1024 client ids) times this.
const maxSharersPerPrincipal = 256

func newCoherenceHost(log *slog.Logger) *coherenceHost {
	h := &coherenceHost{log: log, lease: coherence.DefaultConfig().Lease,
		homes: map[uint64]*sharedHome{}, restored: map[uint64]time.Time{}, stop: make(chan struct{})}
	h.wg.Add(1)
	go h.tickLoop()
	return h
}

// tickLoop advances every directory's clock (lease expiries, resent
// invalidations) every twentieth of a lease.
func (h *coherenceHost) tickLoop() {
	defer h.wg.Done()
	t := time.NewTicker(h.lease / 20)
	defer t.Stop()
	for tick := 1; ; tick++ {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		for _, sh := range h.all() {
			sh.home.Tick()
		}
		if tick%20 == 0 {
			h.dropIdleOwners(time.Now())
		}
	}
}

// dropIdleOwners forgets the sharer ids not heard from within ownerIdle.
func (h *coherenceHost) dropIdleOwners(now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, sh := range h.homes {
		for id, o := range sh.owners {
			if now.Sub(o.seen) > ownerIdle {
				delete(sh.owners, id)
				if sh.perPrincipal[o.principal]--; sh.perPrincipal[o.principal] <= 0 {
					delete(sh.perPrincipal, o.principal)
				}
			}
		}
	}
}

// claimLocked binds sharer id, which message m speaks as, to principal,
// or refuses it if it is bound to another principal, or if principal has
// maxSharersPerPrincipal bound already; h.mu is held.
func (sh *sharedHome) claimLocked(seg uint64, m coherence.Message, principal string, now time.Time) error {
	id := m.From
	switch o := sh.owners[id]; {
	case o == nil && sh.perPrincipal[principal] >= maxSharersPerPrincipal:
		return fmt.Errorf("pool: coherence for segment %d: this client speaks as %d sharers already (heard from within %v), the most a home keeps per client; detach attachments no longer used: %w",
			seg, sh.perPrincipal[principal], ownerIdle, rdma.ErrAccessDenied)
	case o == nil:
		sh.owners[id] = &sharerOwner{principal: principal, seen: now}
		sh.perPrincipal[principal]++
	case o.principal != principal:
		return fmt.Errorf("pool: coherence %s for segment %d speaks as sharer %#x, which another client uses: %w", m.Kind, seg, uint64(id), rdma.ErrAccessDenied)
	default:
		o.seen = now
	}
	return nil
}

func (h *coherenceHost) all() []*sharedHome {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*sharedHome, 0, len(h.homes))
	for _, sh := range h.homes {
		out = append(out, sh)
	}
	return out
}

// exported notes that segment seg was put on the data plane; again (with
// its old key) after a restart of this daemon.
func (h *coherenceHost) exported(seg uint64, again bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if again {
		h.restored[seg] = time.Now()
	} else {
		delete(h.restored, seg)
	}
}

// home returns segment seg's directory for message m, creating it for
// mem with the page size the sharer uses, once m's sharer id is bound to
// principal (claimLocked), under one hold of h.mu. The directory of a
// segment that survived a restart of this daemon grants nothing until a
// lease after its re-export, so that leases the previous incarnation
// granted have run out.
func (h *coherenceHost) home(seg uint64, mem []byte, m coherence.Message, principal string) (*coherence.Home, error) {
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return nil, fmt.Errorf("pool: coherence for segment %d: the daemon is closing: %w", seg, rdma.ErrSegmentLost)
	}
	sh := h.homes[seg]
	if sh == nil || sh.mem != unsafe.Pointer(unsafe.SliceData(mem)) || sh.size != len(mem) {
		var err error
		if sh, err = h.startLocked(seg, mem, m.PageSize); err != nil {
			return nil, err
		}
	}
	if err := sh.claimLocked(seg, m, principal, now); err != nil {
		return nil, err
	}
	return sh.home, nil
}

// startLocked starts segment seg's directory for mem; h.mu is held.
func (h *coherenceHost) startLocked(seg uint64, mem []byte, pageSize uint32) (*sharedHome, error) {
	cfg := coherence.DefaultConfig()
	cfg.PageSize = int(pageSize)
	cfg.Lease = h.lease
	if at, ok := h.restored[seg]; ok {
		if since := time.Since(at); since < h.lease {
			cfg.Grace = h.lease - since
		}
	}
	hm, err := coherence.NewHome(cfg, mem, nil)
	if err != nil {
		return nil, err
	}
	if old := h.homes[seg]; old != nil {
		old.home.Close()
	}
	sh := &sharedHome{home: hm, mem: unsafe.Pointer(unsafe.SliceData(mem)), size: len(mem), owners: map[coherence.SharerID]*sharerOwner{}, perPrincipal: map[string]int{}}
	h.homes[seg] = sh
	h.log.Debug("coherence directory started", "segment", seg, "page_size", pageSize, "incarnation", hm.Incarnation())
	return sh, nil
}

// message serves one MSG: a batch of one coherence message, or a Poll
// followed by the InvAcks riding on it; a Poll waits for pushed messages,
// anything else is handled by the directory. A connection that may only
// read the segment (writable false) sends no message that writes its
// memory or asks to: no WriteReq, WriteBack or InvAck carrying data. Every
// message speaks as a sharer id bound to the connection's principal
// (claimLocked).
func (h *coherenceHost) message(ctx context.Context, call tcp.MessageCall) ([]byte, error) {
	seg, mem, maxResp := call.Seg, call.Mem, call.MaxResp
	msgs, err := coherence.DecodeBatch(call.Req)
	if err != nil {
		return nil, fmt.Errorf("pool: coherence message for segment %d: %w: %w", seg, err, rdma.ErrProtocol)
	}
	if len(msgs) == 0 || (len(msgs) > 1 && msgs[0].Kind != coherence.Poll) {
		return nil, fmt.Errorf("pool: coherence request for segment %d carries %d messages, want 1 (or a Poll and its acks): %w", seg, len(msgs), rdma.ErrProtocol)
	}
	for _, a := range msgs[1:] {
		if a.Kind != coherence.InvAck {
			return nil, fmt.Errorf("pool: coherence Poll for segment %d carries a %s; only InvAcks ride a poll: %w", seg, a.Kind, rdma.ErrProtocol)
		}
		if a.From != msgs[0].From {
			return nil, fmt.Errorf("pool: coherence Poll for segment %d from sharer %#x carries an InvAck of sharer %#x; a sharer acknowledges only its own invalidations: %w",
				seg, uint64(msgs[0].From), uint64(a.From), rdma.ErrAccessDenied)
		}
	}
	if !call.Writable {
		for _, m := range msgs {
			if m.Kind == coherence.WriteReq || m.Kind == coherence.WriteBack || m.Kind == coherence.InvAck && m.HasData {
				return nil, fmt.Errorf("pool: coherence %s for segment %d from a client that may only read it: %w", m.Kind, seg, rdma.ErrAccessDenied)
			}
		}
	}
	m := msgs[0]
	hm, err := h.home(seg, mem, m, call.Principal)
	if err != nil {
		return nil, fmt.Errorf("pool: coherence for segment %d: %w", seg, err)
	}
	var out []coherence.Message
	if m.Kind == coherence.Poll {
		out = hm.Poll(ctx, m.From, m.Lease, msgs[1:])
	} else {
		// A request that waits for invalidations is answered with its
		// grant when that comes within a twentieth of a lease.
		out = []coherence.Message{hm.HandleHeld(ctx, m, h.lease/20)}
	}
	b := coherence.AppendBatch(nil, out)
	for len(b) > maxResp && len(out) > 1 {
		out = out[:len(out)/2] // the rest is resent or asked for again
		b = coherence.AppendBatch(nil, out)
	}
	return b, nil
}

// drop forgets segment seg's directory (the segment was revoked).
func (h *coherenceHost) drop(seg uint64) {
	h.mu.Lock()
	sh := h.homes[seg]
	delete(h.homes, seg)
	delete(h.restored, seg)
	h.mu.Unlock()
	if sh != nil {
		sh.home.Close()
	}
}

// sharersOf returns how many sharers of segment seg were heard from
// recently (0 for a segment no sharer ever attached).
func (h *coherenceHost) sharersOf(seg uint64) int {
	h.mu.Lock()
	sh := h.homes[seg]
	h.mu.Unlock()
	if sh == nil {
		return 0
	}
	return sh.home.Attached()
}

// fillSharers sets the sharer count of the listed segments whose home is
// another node (their Device is "peer:NODE") from the home's own record,
// found among segs when they list every node, else by listing the nodes
// that are homes of segs. Best effort: a home that does not answer leaves 0.
func (s *service) fillSharers(ctx context.Context, segs []*poolv1.Segment, everyNode bool) {
	nodes := map[string]bool{}
	for _, sg := range segs {
		if node, ok := strings.CutPrefix(sg.Device, "peer:"); ok {
			nodes[node] = true
		}
	}
	if len(nodes) == 0 {
		return
	}
	homes := segs
	if !everyNode && s.d.pool.gossip() != nil {
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		others, err := s.listNodes(lctx, nodes)
		cancel()
		if err != nil {
			s.d.log.Debug("sharer counts: list the homes", "err", err)
		}
		homes = others
	}
	type at struct {
		node string
		id   uint64
	}
	count := map[at]uint32{}
	for _, sg := range homes {
		if !strings.HasPrefix(sg.Device, "peer:") {
			count[at{sg.Node, sg.Id}] = sg.Sharers
		}
	}
	for _, sg := range segs {
		if strings.HasPrefix(sg.Device, "peer:") {
			sg.Sharers = count[at{sg.Node, sg.HomeId}]
		}
	}
}

// sharers returns how many sharers were heard from recently for each
// shared segment.
func (h *coherenceHost) sharers() map[uint64]int {
	out := map[uint64]int{}
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, sh := range h.homes {
		out[id] = sh.home.Attached()
	}
	return out
}

// stats sums the counters of every directory.
func (h *coherenceHost) stats() coherence.Stats {
	var s coherence.Stats
	for _, sh := range h.all() {
		st := sh.home.Stats()
		s.Grants += st.Grants
		s.Invalidations += st.Invalidations
		s.WriteBacks += st.WriteBacks
		s.LeaseWaits += st.LeaseWaits
		s.LostOwners += st.LostOwners
		s.StaleWriteBacks += st.StaleWriteBacks
	}
	return s
}

func (h *coherenceHost) close() {
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return
	}
	h.closed = true
	for _, sh := range h.homes {
		sh.home.Close()
	}
	h.mu.Unlock()
	close(h.stop)
	h.wg.Wait()
}

// coherenceCollector exports the directories' counters and each shared
// segment's sharer count at scrape time.
type coherenceCollector struct {
	h                                          *coherenceHost
	grants, invs, wbs, waits, lost, stale, shr *prometheus.Desc
}

func newCoherenceCollector(h *coherenceHost) *coherenceCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(metricsNamespace+"_coherence_"+name, help, labels, nil)
	}
	return &coherenceCollector{h: h,
		grants: d("grants_total", "Shared and exclusive page grants sent by this home's coherence directories."),
		invs:   d("invalidations_total", "Invalidate messages sent to sharers (resends included)."),
		wbs:    d("writebacks_total", "Modified pages written back to this home."),
		waits:  d("lease_waits_total", "Requests that waited for a sharer's lease to run out because it did not acknowledge an invalidation."),
		lost:   d("lost_owners_total", "Owners whose lease ran out before they wrote back: their unwritten data was lost."),
		stale:  d("stale_writebacks_total", "Write-backs refused because the writer no longer owned the page."),
		shr:    d("sharers", "Attachments of a shared segment heard from within the last two leases.", "segment"),
	}
}

// Describe implements prometheus.Collector.
func (c *coherenceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.grants, c.invs, c.wbs, c.waits, c.lost, c.stale, c.shr} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *coherenceCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.h.stats()
	for _, v := range []struct {
		d *prometheus.Desc
		n uint64
	}{{c.grants, s.Grants}, {c.invs, s.Invalidations}, {c.wbs, s.WriteBacks}, {c.waits, s.LeaseWaits}, {c.lost, s.LostOwners}, {c.stale, s.StaleWriteBacks}} {
		ch <- prometheus.MustNewConstMetric(v.d, prometheus.CounterValue, float64(v.n))
	}
	for seg, n := range c.h.sharers() {
		ch <- prometheus.MustNewConstMetric(c.shr, prometheus.GaugeValue, float64(n), strconv.FormatUint(seg, 10))
	}
}
