// This file holds the rebuild of redundant segments (docs/REDUNDANCY.md):
// when a home of a redundant segment this daemon holds the record of is
// lost, the daemon places a new copy or shard on another host and fills it
// from the survivors with the live move's copy-and-switch (move.go), in
// the background, at most Config.RebuildRate bytes a second.

package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
)

// Rebuild tunables.
const (
	// rebuildScan is how often the rebuilder looks for lost homes when
	// nothing told it of one (a failed rebuild's retry, a host that came
	// to have room).
	rebuildScan = time.Second
	// rebuildAtOnce is how many homes an origin rebuilds at once: enough
	// to overlap one rebuild's round trips with another's copy.
	rebuildAtOnce = 4
	// rebuildRetry is the pause before a failed rebuild of a segment is
	// tried again; it doubles with each failure, up to rebuildRetryMax.
	rebuildRetry    = time.Second
	rebuildRetryMax = 30 * time.Second
	// rebuildProgress is how often a running rebuild publishes the bytes
	// it copied (SegmentHome.rebuilt_bytes).
	rebuildProgress = 200 * time.Millisecond
)

// rebuilder rebuilds the lost homes of this daemon's redundant segments.
// Safe for concurrent use.
type rebuilder struct {
	p    *core
	rate *rateLimit // nil: unlimited
	tls  moveTLS
	kick chan struct{}

	mu    sync.Mutex
	busy  map[uint64]bool           // segments rebuilding now, by id
	retry map[uint64]rebuildBackoff // segments whose last rebuild failed
}

// rebuildBackoff is when a segment whose rebuild failed is tried again.
type rebuildBackoff struct {
	tries int
	next  time.Time
}

func newRebuilder(p *core, bytesPerSec int64) *rebuilder {
	rb := &rebuilder{p: p, kick: make(chan struct{}, 1), busy: map[uint64]bool{}, retry: map[uint64]rebuildBackoff{}}
	if bytesPerSec > 0 {
		rb.rate = &rateLimit{perSec: float64(bytesPerSec)}
	}
	return rb
}

// rebuildSoon tells the rebuilder that a home of segment id was lost (or
// anything else changed that a rebuild waits for): it looks at once rather
// than at its next scan, and a failed rebuild of id is retried now.
func (p *core) rebuildSoon(id uint64) {
	rb := p.rb
	if rb == nil {
		return
	}
	rb.mu.Lock()
	delete(rb.retry, id)
	rb.mu.Unlock()
	select {
	case rb.kick <- struct{}{}:
	default:
	}
}

// startRebuilds runs the rebuilder until the daemon stops (Close waits
// for it before it closes the peer sessions); a rebuild under way then
// ends and resumes at the next start, from its home's REBUILDING state in
// the record.
func (d *Daemon) startRebuilds() {
	p := d.pool
	if p.rb == nil || p.cl == nil || !p.cfg.Rebuild {
		return
	}
	p.rb.tls = moveTLS{ca: d.data.ca, byDefault: d.data.server != nil}
	d.wg.Go(func() {
		ctx, cancel := untilClosed(context.Background(), d.stop)
		defer cancel()
		p.rb.loop(ctx)
	})
}

// loop starts the rebuilds due, rebuildAtOnce at a time, until ctx ends.
func (rb *rebuilder) loop(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(rebuildScan)
	defer tick.Stop()
	done := make(chan struct{}, rebuildAtOnce)
	for {
		for _, w := range rb.due() {
			wg.Go(func() {
				rb.run(ctx, w)
				select {
				case done <- struct{}{}:
				default:
				}
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-rb.kick:
		case <-done:
		case <-tick.C:
		}
	}
}

// rebuildWork is one home to rebuild: segment id's home at index home.
type rebuildWork struct {
	id   uint64
	home int
}

// due marks busy and returns the homes to rebuild now, at most one per
// segment and rebuildAtOnce in all.
func (rb *rebuilder) due() []rebuildWork {
	p := rb.p
	p.mu.Lock()
	var found []rebuildWork
	for id, r := range p.segs {
		if i := rebuildNeed(r); i >= 0 {
			found = append(found, rebuildWork{id: id, home: i})
		}
	}
	p.mu.Unlock()
	slices.SortFunc(found, func(a, b rebuildWork) int { return cmpUint(a.id, b.id) })
	now := time.Now()
	rb.mu.Lock()
	defer rb.mu.Unlock()
	var out []rebuildWork
	for _, w := range found {
		if len(rb.busy) >= rebuildAtOnce {
			break
		}
		if b, ok := rb.retry[w.id]; rb.busy[w.id] || ok && now.Before(b.next) {
			continue
		}
		rb.busy[w.id] = true
		out = append(out, w)
	}
	return out
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// rebuildNeed is the index of the home of r to rebuild, or -1: a lost home,
// or one a rebuild left half filled, of a redundant segment that is not
// lost and whose writer homes can serve as sources (the primary of
// replicas is OK; an erasure-coded segment has k OK shards).
func rebuildNeed(r *record) int {
	red := r.Redundancy
	if red.Replicas == 0 && red.Data == 0 || r.Lost || len(r.Homes) == 0 {
		return -1
	}
	ok, want := 0, -1
	for i, h := range r.Homes {
		switch h.State {
		case poolv1.HomeState_HOME_STATE_OK:
			ok++
		case poolv1.HomeState_HOME_STATE_LOST, poolv1.HomeState_HOME_STATE_REBUILDING:
			if want < 0 {
				want = i
			}
		}
	}
	switch {
	case want < 0:
		return -1
	case red.Replicas > 0 && r.Homes[0].State != poolv1.HomeState_HOME_STATE_OK:
		return -1 // the primary's successor is being promoted
	case red.Data > 0 && ok < red.Data:
		return -1 // too few shards to decode from: the segment is lost
	}
	return want
}

// rebuildResult is what one rebuild did, for its log line and metrics.
type rebuildResult struct {
	node   string // the new home
	bytes  int64
	rounds int
	pause  time.Duration // the writers sealed
	took   time.Duration
	// repaired are the bytes of parity shards brought in line with the
	// data shards (rebuildfill.go, repair).
	repaired int64
}

// run rebuilds one home and records the outcome: a failure is retried
// after a pause that grows with each failure of the segment.
func (rb *rebuilder) run(ctx context.Context, w rebuildWork) {
	p := rb.p
	start := time.Now()
	res, err := rb.rebuild(ctx, w)
	res.took = time.Since(start)
	p.metrics.rebuildDone(res, err)
	rb.mu.Lock()
	defer rb.mu.Unlock()
	delete(rb.busy, w.id)
	switch {
	case err == nil:
		delete(rb.retry, w.id)
		p.log.Info("rebuilt a home of a redundant segment", "segment", w.id, "home", w.home, "node", res.node,
			"bytes", res.bytes, "rounds", res.rounds, "pause", res.pause, "took", res.took.Round(time.Millisecond))
	case errors.Is(err, errRebuildAgain):
		// Nothing to do now (freed or rebuilt meanwhile), a dead target
		// dropped, or a source gone: the next look decides.
		delete(rb.retry, w.id)
	case errors.Is(err, errRebuildBusy):
		rb.retry[w.id] = rebuildBackoff{next: time.Now().Add(rebuildRetry)}
	default:
		b := rb.retry[w.id]
		b.tries++
		b.next = time.Now().Add(min(rebuildRetry<<min(b.tries-1, 16), rebuildRetryMax))
		rb.retry[w.id] = b
		log := p.log.Warn
		if ctx.Err() != nil {
			log = p.log.Info // the daemon stops: it resumes at the next start
		}
		log("rebuild of a redundant segment's home failed; retrying", "segment", w.id, "home", w.home, "node", res.node,
			"bytes", res.bytes, "tries", b.tries, "retry-in", time.Until(b.next).Round(time.Millisecond), "err", err)
	}
}

// failedBefore reports whether the last rebuild of segment id failed.
func (rb *rebuilder) failedBefore(id uint64) bool {
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return rb.retry[id].tries > 0
}

// errRebuildBusy is a rebuild that waits for a live move of the segment.
var errRebuildBusy = errs.Sub(errs.ErrLimit, "the segment is moving; its rebuild waits")

// errRebuildAgain is a rebuild that did nothing and is to be looked at
// again at once: the segment changed meanwhile, its target was dropped,
// or a source was found gone and marked lost (homeMissing).
var errRebuildAgain = errors.New("rebuild: look again")

// rebuild rebuilds home w.home of segment w.id: a new home placed for a
// lost one (or the half-filled one a rebuild left, if its host is alive),
// filled from the survivors, then switched to OK.
func (rb *rebuilder) rebuild(ctx context.Context, w rebuildWork) (rebuildResult, error) {
	p := rb.p
	if !p.moving.begin(w.id) { // one move or rebuild of a segment at a time
		return rebuildResult{}, errRebuildBusy
	}
	defer p.moving.end(w.id)
	r, ok := p.redundantRecord(w.id)
	if !ok || rebuildNeed(&r) != w.home {
		return rebuildResult{}, errRebuildAgain // freed, lost or rebuilt meanwhile
	}
	h := r.Homes[w.home]
	res := rebuildResult{node: h.Node}
	if h.State == poolv1.HomeState_HOME_STATE_REBUILDING && p.nodeGone(h.Node) {
		// A rebuild target that died, or the last run's that is gone:
		// drop it, a new one is placed next.
		err := p.dropRebuildTarget(w.id, w.home, h)
		p.rebuildSoon(w.id)
		return res, errors.Join(errRebuildAgain, err)
	}
	if h.State == poolv1.HomeState_HOME_STATE_LOST {
		var err error
		if h, err = p.placeRebuild(ctx, w, r); err != nil {
			return res, err
		}
		res.node = h.Node
		p.log.Info("rebuilding a home of a redundant segment", "segment", w.id, "home", w.home, "node", h.Node,
			"size", r.shardSize(), "redundancy", r.Redundancy.spec().String())
	} else {
		p.log.Info("rebuilding a home of a redundant segment again, from the start", "segment", w.id, "home", w.home, "node", h.Node,
			"size", r.shardSize(), "redundancy", r.Redundancy.spec().String())
	}
	f, err := rb.newFill(ctx, r, w.home, h)
	if err != nil {
		return res, err
	}
	defer f.close()
	err = f.run(ctx, f.switchRebuilt)
	res.bytes, res.rounds, res.pause, res.repaired = f.m.copied.Load(), f.m.res.rounds, f.m.res.pause, f.repaired.Load()
	if err != nil && ctx.Err() == nil && !errors.Is(err, errRebuildAgain) && (p.nodeGone(h.Node) || rb.failedBefore(w.id)) { // not when the daemon stops
		// A target that died, or that failed a second fill in a row
		// (its node restarted without the copy, say): another one.
		err = errors.Join(err, p.dropRebuildTarget(w.id, w.home, h))
		p.rebuildSoon(w.id)
	}
	return res, err
}

// redundantRecord is a copy of segment id's record (its homes too), if it
// is here.
func (p *core) redundantRecord(id uint64) (record, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.segs[id]
	if !ok {
		return record{}, false
	}
	cp := *r
	cp.Homes = slices.Clone(r.Homes)
	return cp, true
}

// alive reports whether node is an alive member.
func (p *core) alive(node string) bool {
	if p.cl == nil {
		return false
	}
	m, ok := p.cl.Member(node)
	return ok && m.State == cluster.StateAlive
}

// rebuildSettle is how long after its start a daemon takes a node that is
// no member yet for gone: a restarted daemon learns the members from its
// first gossip.
const rebuildSettle = 30 * time.Second

// nodeGone reports whether node is a member that is not alive, or, once the
// daemon has run for rebuildSettle, no member at all.
func (p *core) nodeGone(node string) bool {
	if p.cl == nil {
		return true
	}
	m, ok := p.cl.Member(node)
	if !ok {
		return time.Since(p.started) > rebuildSettle
	}
	return m.State != cluster.StateAlive
}

// placeRebuild places a new home for the lost home w.home of r on a host
// that holds none of r's homes, and commits it in the record as
// REBUILDING before anything is copied: from then on the record names it
// (a restart refills it or drops it), and no client reads it.
func (p *core) placeRebuild(ctx context.Context, w rebuildWork, r record) (homeRef, error) {
	lost := r.Homes[w.home]
	exclude := make([]string, 0, len(r.Homes))
	for _, h := range r.Homes {
		exclude = append(exclude, h.Node)
	}
	h, placed, err := p.placeHome(ctx, &r, exclude)
	if err != nil {
		return homeRef{}, fmt.Errorf("rebuild segment %d: place a new home for the one lost on %s: %w", r.ID, lost.Node, err)
	}
	defer placed() // once the record names it, or it is freed
	h.State, h.Rebuilt = poolv1.HomeState_HOME_STATE_REBUILDING, 0
	if err := p.setHome(r.ID, w.home, lost, func(x *homeRef) { *x = h }); err != nil {
		p.freeLaterAt(h.Node, h.HomeID)
		return homeRef{}, fmt.Errorf("rebuild segment %d: record the new home on %s: %w", r.ID, h.Node, err)
	}
	// placeHome named the owner alone there: the new home is told the
	// clients attached (who read it after a failover, and whose forwarded
	// answers it keeps), in the background until told.
	p.tellLater(r.ID)
	return h, nil
}

// dropRebuildTarget marks a rebuild target that is gone (or failed) lost
// again, so that the next rebuild places another, and frees its copy if
// its host comes back.
func (p *core) dropRebuildTarget(id uint64, i int, h homeRef) error {
	err := p.setHome(id, i, h, func(x *homeRef) { x.State, x.Rebuilt = poolv1.HomeState_HOME_STATE_LOST, 0 })
	if err != nil && !errors.Is(err, errs.ErrUnavailable) { // changed: marked lost already
		return fmt.Errorf("rebuild segment %d: drop the target on %s: %w", id, h.Node, err)
	}
	p.freeLaterAt(h.Node, h.HomeID)
	return nil
}

// setHome changes home i of segment id with set and commits the record
// (updateRecord), if that home is still was (the same node, id there and
// state): the record may have changed meanwhile (a home lost, a rebuild
// target found gone and freed, attachers).
func (p *core) setHome(id uint64, i int, was homeRef, set func(*homeRef)) error {
	_, err := p.updateRecord(id, func(r *record) error {
		if !sameHome(r, i, was) {
			return fmt.Errorf("segment %d: its home %d changed meanwhile: %w", id, i, errs.ErrSegmentChanging)
		}
		set(&r.Homes[i])
		return nil
	})
	return err
}

// sameHome reports whether home i of r is h: the same node, id there and
// state.
func sameHome(r *record, i int, h homeRef) bool {
	return i < len(r.Homes) && r.Homes[i].Node == h.Node && r.Homes[i].HomeID == h.HomeID && r.Homes[i].State == h.State
}

// setRebuilt publishes how many bytes the rebuild of home i (h, still
// REBUILDING) copied so far, only in memory (a restarted rebuild starts
// from zero); false when the record no longer names h so: the rebuild is
// moot.
func (p *core) setRebuilt(id uint64, i int, h homeRef, n int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur, ok := p.segs[id]
	if !ok || !sameHome(cur, i, h) {
		return false
	}
	homes := slices.Clone(cur.Homes)
	homes[i].Rebuilt = n
	cur.Homes = homes
	return true
}

// homesIn counts r's homes in state st. A segment with fewer OK homes
// than it needs to be read (one copy, k shards) is lost (settle), though
// a rebuild had begun: a REBUILDING home is not filled yet.
func (r *record) homesIn(st poolv1.HomeState) int {
	n := 0
	for _, h := range r.Homes {
		if h.State == st {
			n++
		}
	}
	return n
}

// redundancyStates are the states farmem_redundant_segments reports.
var redundancyStates = []poolv1.RedundancyState{
	poolv1.RedundancyState_REDUNDANCY_STATE_OK, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED,
	poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING, poolv1.RedundancyState_REDUNDANCY_STATE_LOST,
}

// redundancyLabel is a state's label value: "ok", "degraded", ...
func redundancyLabel(s poolv1.RedundancyState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "REDUNDANCY_STATE_"))
}

// rateLimit paces the bytes of a daemon's rebuilds (Config.RebuildRate)
// or of its moves (Config.MoveRate), all together, to perSec: each wait
// takes the next turn, and one given up gives its turn back. Safe for
// concurrent use; a nil *rateLimit does not limit.
type rateLimit struct {
	perSec float64

	mu   sync.Mutex
	next time.Time // when the next bytes may go
}

// wait returns when n more bytes may go, or ctx's error; a wait given up
// gives its turn back.
func (l *rateLimit) wait(ctx context.Context, n int64) error {
	return l.take(ctx, n, true)
}

// paid charges n bytes that already went and returns when the bytes after
// them may go, or ctx's error; the charge stays when the wait is given up.
func (l *rateLimit) paid(ctx context.Context, n int64) error {
	return l.take(ctx, n, false)
}

// take is wait, which gives its turn back when ctx ends first if
// giveBack, and paid.
func (l *rateLimit) take(ctx context.Context, n int64, giveBack bool) error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	now := time.Now()
	at := l.next
	if at.Before(now) { // no credit saved up while idle
		at = now
	}
	cost := time.Duration(float64(n) / l.perSec * float64(time.Second))
	l.next = at.Add(cost)
	l.mu.Unlock()
	d := at.Sub(now)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		if giveBack {
			l.mu.Lock()
			l.next = l.next.Add(-cost) // the turns after it come sooner
			l.mu.Unlock()
		}
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}

func newRebuildMetrics(f promFactory) *copyMetrics {
	return newCopyMetrics(f, "rebuilds_total", "Rebuilds of a lost home of a redundant segment this daemon holds the record of, by result (ok, failed: retried later).",
		"rebuild_bytes_total", "Bytes written to new homes by rebuilds, the re-copied changed chunks included.",
		"rebuild_seconds", "Time each successful rebuild of one home took, from its placement to the home serving (OK).",
		// 10ms to 3 hours.
		prometheus.ExponentialBuckets(0.01, 3.5, 11))
}

// rebuildDone counts one rebuild's outcome.
func (m *metrics) rebuildDone(res rebuildResult, err error) {
	if m == nil {
		return
	}
	m.rebuilds.bytes.Add(float64(res.bytes))
	m.parityRepaired.Add(float64(res.repaired))
	switch {
	case err == nil:
		m.rebuilds.runs.WithLabelValues("ok").Inc()
		m.rebuilds.took.Observe(res.took.Seconds())
	case !errors.Is(err, errRebuildBusy) && !errors.Is(err, errRebuildAgain):
		m.rebuilds.runs.WithLabelValues("failed").Inc()
	}
}
