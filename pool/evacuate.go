// This file holds the evacuator: while the node evacuates (memctl drain
// --evacuate), it asks the daemon that placed each segment here (its
// origin, the node after the peer prefix of the record's owner) to move the
// segment to another home (Move, docs/MOVE.md), a few at a time, retries
// what fails with a backoff, and keeps the progress that memctl drain and
// memctl status show. Segments of this node's own applications are not
// moved: they leave with their applications.

package pool

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/probe"
	"github.com/farmem/farmem/internal/size"
)

// Evacuation limits.
const (
	// evacMoves is Config.EvacuateMoves's default, how many moves the
	// evacuator runs at once: enough to overlap one move's commits and
	// round trips with another's copy; each copy takes CPU from the
	// applications on the hosts it crosses, so more moves finish sooner
	// and slow the applications more. maxEvacMoves is its most.
	evacMoves    = 4
	maxEvacMoves = 64
	// evacRetry is the first pause before a failed move is asked again;
	// it doubles with each failure of the segment, up to evacRetryMax.
	evacRetry    = 250 * time.Millisecond
	evacRetryMax = 10 * time.Second
	// evacScan is how often the evacuator looks for segments to move
	// while none is due (new ones, retries whose pause ended).
	evacScan = 250 * time.Millisecond
	// evacMoveBase plus the segment's size at the least move rate shared
	// by all the moves at once (leastMoveRate over Config.EvacuateMoves)
	// is one move's time: an origin paced at that rate and given every
	// move of this evacuation finishes each in it. Past it, the move goes
	// on while its origin asks this node for steps of it (one that directs
	// other moves too may take longer), and is given up once it asked
	// nothing for evacMoveBase (moveWithin).
	evacMoveBase = 30 * time.Second
	// evacStuckTries is how many moves of a segment must fail in a row
	// before the evacuation counts it as stuck: one failure is often
	// passing (a target that went away), and is retried first.
	evacStuckTries = 2
)

// evacuator runs the evacuation of this node while it evacuates. It is
// safe for concurrent use.
type evacuator struct {
	p *core
	// move asks origin to move the segment with homeID here elsewhere and
	// returns how long writes waited for its switch-over; core.moveAway,
	// replaced in tests.
	move func(ctx context.Context, origin string, homeID uint64) (time.Duration, error)

	mu     sync.Mutex
	run    *evacRun // the running evacuation; nil while none runs
	closed bool

	steps stepWatch
}

// stepWatch keeps, for each segment here whose move this node asked for
// (moveWithin), when its origin last asked this node for a step of it
// (MoveOut); base is evacMoveBase, which tests shorten. Safe for
// concurrent use.
type stepWatch struct {
	base  time.Duration
	mu    sync.Mutex
	moves map[uint64]*watched
}

// watched is a segment's entry in stepWatch: the asks for its move under
// way (the evacuation's and rebalancing's may overlap) and its last step.
type watched struct {
	asks int
	last time.Time
}

// saw notes a step of the move of segment id, if this node asked for it.
func (w *stepWatch) saw(id uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if m := w.moves[id]; m != nil {
		m.last = time.Now()
	}
}

// watch notes an ask for segment id's move, and returns the time of its
// last step and the end of the ask.
func (w *stepWatch) watch(id uint64) (last func() time.Time, end func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := w.moves[id]
	if m == nil {
		m = &watched{}
		w.moves[id] = m
	}
	m.asks++
	m.last = time.Now()
	last = func() time.Time {
		w.mu.Lock()
		defer w.mu.Unlock()
		return m.last
	}
	end = func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if m.asks--; m.asks == 0 {
			delete(w.moves, id)
		}
	}
	return last, end
}

// evacRun is one run of the evacuation: from its start (a drain
// --evacuate, or the daemon's start while evacuating) to its stop (undo,
// close). Its fields are guarded by evacuator.mu.
type evacRun struct {
	cancel context.CancelFunc
	done   chan struct{}

	started time.Time       // when this run began, for the rate
	ended   time.Time       // when nothing was left to move; zero before
	moved   int             // segments moved by this run
	bytes   int64           // their bytes
	pauses  []time.Duration // their switch-overs' pauses, as the origins measured them
	busy    map[uint64]bool
	failed  map[uint64]*evacFailure // by id here, until the segment leaves
}

// evacFailure is the last failed move of one segment.
type evacFailure struct {
	origin string
	size   int64
	err    error
	tries  int
	next   time.Time // when it is asked again
}

// evacItem is one segment to move: its id here, size and origin.
type evacItem struct {
	id     uint64
	size   int64
	origin string
}

func newEvacuator(p *core) *evacuator {
	e := &evacuator{p: p, steps: stepWatch{base: evacMoveBase, moves: map[uint64]*watched{}}}
	e.move = p.moveAway
	return e
}

// start runs the evacuation unless it runs already or the evacuator is
// closed.
func (e *evacuator) start() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.run != nil || e.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &evacRun{cancel: cancel, done: make(chan struct{}), started: e.p.now(),
		busy: map[uint64]bool{}, failed: map[uint64]*evacFailure{}}
	e.run = r
	go e.loop(ctx, r)
}

// stop ends the running evacuation, if any, and waits for its moves: a
// move under way is canceled (the origin aborts it; the segment stays
// here, whole).
func (e *evacuator) stop() {
	e.mu.Lock()
	r := e.run
	e.run = nil
	e.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// close stops the evacuation for good (the daemon stops).
func (e *evacuator) close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.stop()
}

// loop moves the segments peers placed here, Config.EvacuateMoves at a
// time, until ctx ends.
func (e *evacuator) loop(ctx context.Context, r *evacRun) {
	defer close(r.done)
	var wg sync.WaitGroup
	defer wg.Wait()
	results := make(chan struct{}, e.p.cfg.EvacuateMoves)
	tick := time.NewTicker(evacScan)
	defer tick.Stop()
	for {
		for _, it := range e.due(r) {
			wg.Go(func() {
				pause, err := e.moveOne(ctx, it)
				e.finish(r, it, pause, err)
				select { // a wake-up: one waiting is enough
				case results <- struct{}{}:
				default:
				}
			})
		}
		select {
		case <-ctx.Done():
			return
		case <-results:
		case <-tick.C:
		}
	}
}

// due marks busy and returns the segments to move now: those not moving
// and not waiting for a retry, up to Config.EvacuateMoves moving at once.
func (e *evacuator) due(r *evacRun) []evacItem {
	items, _, _ := e.p.peerHeld()
	now := e.p.now()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(items) == 0 && r.ended.IsZero() && len(r.busy) == 0 {
		r.ended = now
		pauses := probe.Summarize(r.pauses)
		e.p.log.Info("evacuation done: no segment of a peer is left here", "node", e.p.cfg.Node,
			"moved", r.moved, "bytes", r.bytes, "took", now.Sub(r.started).Round(time.Millisecond),
			"pause-p50", pauses.P50, "pause-p99", pauses.P99, "pause-max", slices.Max(append(r.pauses, 0)))
	}
	var out []evacItem
	for _, it := range items {
		if len(r.busy)+len(out) >= e.p.cfg.EvacuateMoves {
			break
		}
		if f := r.failed[it.id]; r.busy[it.id] || f != nil && now.Before(f.next) {
			continue
		}
		out = append(out, it)
	}
	for _, it := range out {
		r.busy[it.id] = true
	}
	if len(out) > 0 {
		r.ended = time.Time{}
	}
	return out
}

// moveOne asks the segment's origin to move it, within a time that grows
// with its size.
func (e *evacuator) moveOne(ctx context.Context, it evacItem) (time.Duration, error) {
	return e.moveWithin(ctx, it, e.move, e.p.cfg.EvacuateMoves)
}

// moveWithin asks the segment's origin, through move, to move it. It gives
// up once the move has taken longer than its time, evacMoveBase plus its
// size at leastMoveRate shared by moves at once, and its origin has asked
// this node for no step of it (MoveOut) for evacMoveBase: a move that its
// origin's pacer holds back behind other moves goes on as long as its
// steps come.
func (e *evacuator) moveWithin(ctx context.Context, it evacItem, move func(ctx context.Context, origin string, homeID uint64) (time.Duration, error), moves int) (time.Duration, error) {
	w := &e.steps
	lastStep, end := w.watch(it.id)
	defer end()
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// At its time, and then whenever its origin has been quiet for base
	// since its last step, the timer looks again: quiet that long, the
	// move is given up.
	var t *time.Timer
	t = time.AfterFunc(time.Duration(math.MaxInt64), func() {
		if quiet := time.Since(lastStep()); quiet < w.base {
			t.Reset(w.base - quiet)
			return
		}
		// The same words for every such move of an origin: the
		// evacuation's stuck reason groups them.
		cancel(fmt.Errorf("%w: past its time, origin %s asked this node nothing of the move for %s", context.DeadlineExceeded, it.origin, w.base))
	})
	t.Reset(w.base + time.Duration(it.size*int64(moves)/leastMoveRate)*time.Second) // after t is set: the callback reads it
	defer t.Stop()
	pause, err := move(ctx, it.origin, it.id)
	if cause := context.Cause(ctx); err != nil && ctx.Err() != nil && cause != nil && !errors.Is(err, cause) {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	return pause, err
}

// finish records the outcome of a move.
func (e *evacuator) finish(r *evacRun, it evacItem, pause time.Duration, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(r.busy, it.id)
	if err == nil {
		delete(r.failed, it.id)
		r.moved++
		r.bytes += it.size
		r.pauses = append(r.pauses, pause)
		e.p.log.Debug("evacuated a segment", "segment", it.id, "origin", it.origin, "size", it.size)
		return
	}
	if e.run != r {
		return // stopped: the run's account is gone with it
	}
	f := r.failed[it.id]
	if f == nil {
		f = &evacFailure{origin: it.origin, size: it.size}
		r.failed[it.id] = f
		e.p.log.Info("evacuation: a move failed; retrying", "segment", it.id, "origin", it.origin, "size", it.size, "err", err)
	}
	f.err = err
	f.tries++
	f.next = e.p.now().Add(min(evacRetry<<min(f.tries-1, 16), evacRetryMax))
}

// peerHeld lists the segments peers placed here (their owner is a peer
// daemon's client id), oldest id first, and counts the others, which stay.
func (p *core) peerHeld() (items []evacItem, staying int, stayingBytes int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, r := range p.segs {
		switch origin, ok := strings.CutPrefix(r.Owner, peerClientPrefix); {
		case r.Home != "":
			// Held on a peer for a client here: not on this host.
		case ok:
			items = append(items, evacItem{id: r.ID, size: r.Size, origin: origin})
		default:
			staying++
			stayingBytes += r.Size
		}
	}
	slices.SortFunc(items, func(a, b evacItem) int { return cmp.Compare(a.id, b.id) })
	return items, staying, stayingBytes
}

// progress returns the evacuation's progress; nil while it does not run.
func (e *evacuator) progress() *poolv1.Evacuation {
	items, staying, stayingBytes := e.p.peerHeld()
	since := e.p.drainState().evacSince
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.run
	if r == nil {
		return nil
	}
	ev := &poolv1.Evacuation{SegmentsMoved: uint32(r.moved), BytesMoved: uint64(r.bytes),
		SegmentsStaying: uint32(staying), BytesStaying: uint64(stayingBytes), SinceUnixMs: unixMs(since)}
	var failed []*evacFailure // failed again after a retry
	for _, it := range items {
		ev.SegmentsLeft++
		ev.BytesLeft += uint64(it.size)
		if f := r.failed[it.id]; f != nil {
			ev.SegmentsFailed++
			if f.tries >= evacStuckTries {
				failed = append(failed, f)
			}
		}
	}
	ev.Done = len(items) == 0 && len(r.busy) == 0 // a move's answer counted too
	end := e.p.now()
	if !r.ended.IsZero() {
		end = r.ended
	}
	if secs := end.Sub(r.started).Seconds(); secs > 0 && r.bytes > 0 {
		ev.BytesPerSecond = float64(r.bytes) / secs
		if !ev.Done {
			ev.EtaMs = int64(float64(ev.BytesLeft) / ev.BytesPerSecond * 1e3)
		}
	}
	if len(items) > 0 && len(failed) == len(items) { // every one failed again
		ev.Stuck = stuckReason(e.p.cfg.Node, failed)
	}
	return ev
}

// stuckReason says why none of the segments left can move, from the last
// failure of each: grouped by cause, with what to do.
func stuckReason(node string, failed []*evacFailure) string {
	var noRoom int
	var largest int64
	down := map[string]int{}
	other := map[string][]string{} // origins by error
	for _, f := range failed {
		switch {
		case errors.Is(f.err, errs.ErrNoCapacity):
			noRoom++
			largest = max(largest, f.size)
		case errors.Is(f.err, errOriginDown):
			down[f.origin]++
		default:
			if msg := f.err.Error(); !slices.Contains(other[msg], f.origin) {
				other[msg] = append(other[msg], f.origin)
			}
		}
	}
	var why []string
	if noRoom > 0 {
		why = append(why, fmt.Sprintf("no other host has room for %s (%s); add capacity or undo the drain ('memctl drain %s --undo')",
			size.Size(largest).Human(), waiting(noRoom), node))
	}
	for _, o := range slices.Sorted(maps.Keys(down)) {
		why = append(why, fmt.Sprintf("origin %s is unreachable (%s): they move once its poold is back", o, waiting(down[o])))
	}
	for _, msg := range slices.Sorted(maps.Keys(other)) {
		origins := other[msg]
		slices.Sort(origins)
		label := "origin "
		if len(origins) > 1 {
			label = "origins "
		}
		why = append(why, label+strings.Join(origins, ", ")+": "+msg)
	}
	return strings.Join(why, "; ")
}

// waiting says how many segments wait, for stuckReason.
func waiting(n int) string {
	if n == 1 {
		return "1 segment waits"
	}
	return fmt.Sprintf("%d segments wait", n)
}

// errOriginDown marks a move whose origin is not an alive member.
var errOriginDown = errs.Sub(errs.ErrUnavailable, "the segment's origin is not alive")

// moveAway asks origin, over this daemon's peer session with it, to move
// the segment it placed here with id homeID to another home.
func (p *core) moveAway(ctx context.Context, origin string, homeID uint64) (time.Duration, error) {
	pc, err := p.homeSession(ctx, origin, "origin")
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errOriginDown, err)
	}
	cctx, _, err := pc.Call(ctx)
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errOriginDown, err)
	}
	resp, err := pc.API().Move(cctx, &poolv1.MoveRequest{Home: p.cfg.Node, HomeId: homeID})
	if err = errs.FromStatus(err); errors.Is(err, errs.ErrNotSupported) {
		return 0, fmt.Errorf("its poold cannot move segments (%w); upgrade it", err)
	} else if err != nil {
		return 0, err
	}
	return time.Duration(resp.PauseUs) * time.Microsecond, nil
}
