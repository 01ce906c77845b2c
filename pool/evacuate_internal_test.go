package pool

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
)

// fakeOrigins stands in for the origins' Move: each origin answers with
// the error its function returns; nil moves the segment away, as the
// source's commit does (the record here is freed).
type fakeOrigins struct {
	p  *core
	mu sync.Mutex
	// answer is what origin answers for the segment with homeID.
	answer map[string]func(homeID uint64) error
	calls  map[string]int
}

func (f *fakeOrigins) move(_ context.Context, origin string, homeID uint64) (time.Duration, error) {
	f.mu.Lock()
	f.calls[origin]++
	fn := f.answer[origin]
	f.mu.Unlock()
	if err := fn(homeID); err != nil {
		return 0, err
	}
	return time.Millisecond, f.p.Free(admin(), homeID, "")
}

func (f *fakeOrigins) count(origin string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[origin]
}

func (f *fakeOrigins) set(origin string, fn func(uint64) error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer[origin] = fn
}

// evacGauges returns farmem_evacuation_segments_left and _bytes_left.
func evacGauges(p *core) (v [2]float64) {
	p.collect(func(d *prometheus.Desc, x float64, _ ...string) {
		switch d {
		case evacSegsDesc:
			v[0] = x
		case evacBytesDesc:
			v[1] = x
		}
	})
	return v
}

// peerSegment places a segment of size bytes here for the peer daemon
// origin, as its Alloc on this home does.
func peerSegment(t *testing.T, p *core, origin string, size int64) uint64 {
	t.Helper()
	r, err := p.Alloc(t.Context(), caller{client: &client{id: peerClientPrefix + origin}}, allocRequest{Size: size, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.NoError(t, err)
	return r.ID
}

// TestEvacuatorProgressAndStuck runs the evacuator against fake origins:
// it moves what its origins move (one after a transient failure, retried),
// counts the segments of this node's own clients as staying, reports a
// segment whose origin is down and then one that no host has room for as
// stuck, with the reason and what to do; it stops at the undo, resumes
// from the store after a restart, and stops at close (goleak in TestMain).
func TestEvacuatorProgressAndStuck(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	f := &fakeOrigins{p: p, answer: map[string]func(uint64) error{}, calls: map[string]int{}}
	p.evac.move = f.move
	a1 := peerSegment(t, p, "a", 1<<20)
	a2 := peerSegment(t, p, "a", 2<<20)
	c1 := peerSegment(t, p, "c", 1<<20)
	_, err := p.Alloc(t.Context(), caller{client: &client{id: "app"}}, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL, Persist: true})
	require.NoError(t, err)

	failedOnce := map[uint64]bool{}
	f.set("a", func(id uint64) error {
		if id == a2 && !failedOnce[id] {
			failedOnce[id] = true
			return fmt.Errorf("move: %w: the target went away", errs.ErrUnavailable)
		}
		return nil
	})
	f.set("c", func(uint64) error { return fmt.Errorf("%w: node c is dead", errOriginDown) })

	require.Nil(t, p.evac.progress(), "no progress while not evacuating")
	ds, changed, err := p.drain(true, true)
	require.NoError(t, err)
	require.True(t, changed)
	require.False(t, ds.evacSince.IsZero())
	var ev *poolv1.Evacuation
	require.Eventually(t, func() bool { ev = p.evac.progress(); return ev.Stuck != "" && ev.SegmentsMoved == 2 }, 10*time.Second, 10*time.Millisecond)
	require.GreaterOrEqual(t, f.count("c"), evacStuckTries, "c was asked again before it counts as stuck")
	require.EqualValues(t, 2, ev.SegmentsMoved, "%+v", ev)
	require.EqualValues(t, 3<<20, ev.BytesMoved)
	require.EqualValues(t, 1, ev.SegmentsLeft)
	require.EqualValues(t, 1<<20, ev.BytesLeft)
	require.EqualValues(t, 1, ev.SegmentsFailed)
	require.EqualValues(t, 1, ev.SegmentsStaying, "the local client's segment leaves with its application")
	require.EqualValues(t, 4096, ev.BytesStaying)
	require.False(t, ev.Done)
	require.Positive(t, ev.BytesPerSecond)
	require.Positive(t, ev.EtaMs)
	require.Equal(t, unixMs(ds.evacSince), ev.SinceUnixMs)
	require.Equal(t, "origin c is unreachable (1 segment waits): they move once its poold is back", ev.Stuck)
	require.True(t, failedOnce[a2], "a's transient failure happened and was retried")
	require.Equal(t, [2]float64{1, 1 << 20}, evacGauges(p), "farmem_evacuation_segments_left, _bytes_left")
	_, err = p.lookup(a1, "")
	require.ErrorIs(t, err, errs.ErrNotFound, "a moved segment is gone from here")

	// The last host with room is draining: every answer is no capacity.
	f.set("c", func(uint64) error {
		return &cluster.NoPeerError{Tier: "rdma", Size: 1 << 20, Reason: cluster.AllDraining, Alive: 2}
	})
	require.Eventually(t, func() bool { ev = p.evac.progress(); return ev.Stuck != "" && ev.Stuck[0] == 'n' }, 20*time.Second, 10*time.Millisecond, "%+v", ev)
	require.Equal(t, "no other host has room for 1.0 MiB (1 segment waits); add capacity or undo the drain ('memctl drain n1 --undo')", ev.Stuck)

	// A restart resumes the evacuation from the store; the undo stops it.
	require.NoError(t, p.close())
	p = newTestPool(t, cfg)
	defer p.close()
	f.p = p
	p.evac.move = f.move
	require.Nil(t, p.evac.progress(), "nothing runs before the daemon serves")
	p.resumeEvacuation()
	f.set("c", func(uint64) error { return nil })
	require.Eventually(t, func() bool { ev = p.evac.progress(); return ev.Done }, 10*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 1, ev.SegmentsMoved, "this run's moves")
	require.Empty(t, ev.Stuck)
	require.Zero(t, ev.EtaMs)
	_, err = p.lookup(c1, "")
	require.ErrorIs(t, err, errs.ErrNotFound)

	_, changed, err = p.drain(false, false)
	require.NoError(t, err)
	require.True(t, changed)
	require.Nil(t, p.evac.progress(), "the undo ends the evacuation")
	require.Equal(t, [2]float64{0, 0}, evacGauges(p))
	require.Equal(t, drainState{}, p.drainState())
}

// stuckReason groups the causes: no room (with the largest segment), each
// origin that is down, and each other error with the origins that gave it.
func TestStuckReason(t *testing.T) {
	old := fmt.Errorf("its poold cannot move segments (%w); upgrade it", errs.ErrNotSupported)
	got := stuckReason("d", []*evacFailure{
		{origin: "a", size: 64 << 20, err: fmt.Errorf("move: %w", errs.ErrNoCapacity)},
		{origin: "b", size: 1 << 20, err: &cluster.NoPeerError{Reason: cluster.NotEnoughFree}},
		{origin: "c", err: fmt.Errorf("%w: node c is dead", errOriginDown)},
		{origin: "f", err: old}, {origin: "e", err: old}, {origin: "e", err: old},
	})
	require.Equal(t, "no other host has room for 64.0 MiB (2 segments wait); add capacity or undo the drain ('memctl drain d --undo'); "+
		"origin c is unreachable (1 segment waits): they move once its poold is back; "+
		"origins e, f: its poold cannot move segments (not supported on this host or build); upgrade it", got)
}

// TestEvacuateMovesAtOnce: an evacuating node has at most
// Config.EvacuateMoves of its segments moved at once, and that many while
// more are left.
func TestEvacuateMovesAtOnce(t *testing.T) {
	cfg := testConfig(t)
	cfg.EvacuateMoves = 2
	p := newTestPool(t, cfg)
	t.Cleanup(func() { p.close() })
	f := &fakeOrigins{p: p, answer: map[string]func(uint64) error{}, calls: map[string]int{}}
	p.evac.move = f.move
	for range 6 {
		peerSegment(t, p, "a", 1<<20)
	}
	var mu sync.Mutex
	moving, most := 0, 0
	gate := make(chan struct{})
	var opened sync.Once
	open := func() { opened.Do(func() { close(gate) }) }
	t.Cleanup(open) // before the pool closes, which waits for the moves
	f.set("a", func(uint64) error {
		mu.Lock()
		moving++
		most = max(most, moving)
		mu.Unlock()
		<-gate
		mu.Lock()
		moving--
		mu.Unlock()
		return nil
	})
	at := func() (int, int) {
		mu.Lock()
		defer mu.Unlock()
		return moving, most
	}
	_, _, err := p.drain(true, true)
	require.NoError(t, err)
	require.Eventually(t, func() bool { n, _ := at(); return n == 2 }, 10*time.Second, 5*time.Millisecond)
	time.Sleep(3 * evacScan) // a scan or two that could start more
	n, m := at()
	require.Equal(t, 2, n)
	require.Equal(t, 2, m)
	open()
	require.Eventually(t, func() bool { return p.evac.progress().Done }, 10*time.Second, 10*time.Millisecond)
	_, m = at()
	require.Equal(t, 2, m, "never more than two at once")
	require.Equal(t, 6, f.count("a"))
}

// TestMoveWithinTime: an evacuating node gives up a move once it took
// longer than its time (evacMoveBase plus a second per 16 MiB of its size
// for each move at once) and its origin has asked nothing of it for
// evacMoveBase (both shortened here); a move whose steps keep coming goes
// on past its time, also when another ask for the same segment (the
// rebalancer's beside the evacuation's) ends meanwhile.
func TestMoveWithinTime(t *testing.T) {
	const base = time.Second
	e := &evacuator{steps: stepWatch{base: base, moves: map[uint64]*watched{}}}
	silent := func(ctx context.Context, _ string, _ uint64) (time.Duration, error) {
		<-ctx.Done()
		return 0, context.Cause(ctx)
	}
	for _, moves := range []int{1, 2} {
		began := time.Now()
		_, err := e.moveWithin(t.Context(), evacItem{id: 1, size: 16 << 20, origin: "a"}, silent, moves)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.EqualError(t, err, "context deadline exceeded: past its time, origin a asked this node nothing of the move for 1s")
		require.GreaterOrEqual(t, time.Since(began), base+time.Duration(moves)*time.Second, "its time: the base and a second for 16 MiB per move at once")
	}

	stepping := func(ctx context.Context, _ string, id uint64) (time.Duration, error) {
		for end := time.Now().Add(3 * base); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if ctx.Err() != nil {
				return 0, context.Cause(ctx)
			}
			e.steps.saw(id)
		}
		return 0, nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.moveWithin(t.Context(), evacItem{id: 2, origin: "a"}, stepping, 1)
		done <- err
	}()
	require.Eventually(t, func() bool {
		e.steps.mu.Lock()
		defer e.steps.mu.Unlock()
		return e.steps.moves[2] != nil
	}, 10*time.Second, time.Millisecond, "the first ask is watched")
	refused := func(context.Context, string, uint64) (time.Duration, error) { return 0, errMoveBusy }
	_, err := e.moveWithin(t.Context(), evacItem{id: 2, origin: "a"}, refused, 1)
	require.ErrorIs(t, err, errMoveBusy)
	require.NoError(t, <-done, "it goes on while its steps come")
	require.Empty(t, e.steps.moves, "a move's steps are forgotten once its asks end")
	e.steps.saw(3)
	require.Empty(t, e.steps.moves, "steps of moves this node did not ask for are not kept")
}
