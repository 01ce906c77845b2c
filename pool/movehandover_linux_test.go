package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// TestMoveHandover: on 4 simulated hosts, the origin of a move is held
// after the source answered its SEAL and before it announces the
// switch-over (the sealAnswered hook). The segment's client, told of the
// copy before the seal, writes meanwhile: the old home answers MOVED with
// the copy's token and the write lands at the new home at once, while the
// origin still holds (MoveHandovers counts it). The hook then fails the
// move there, as a SEAL whose answer was lost would: the origin asks the
// source, finds its last chunks pushed to the target, and rolls the move
// forward rather than undoing it, so the record names the new home and
// the write made there is kept, with the bytes from before the move; the
// move reports success, as it happened.
func TestMoveHandover(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second})
	oh := sc.hosts[3]
	held, release := holdAfterSeal(t, oh)
	c, seg, before := startHandover(t, sc, oh)
	ctx, from := t.Context(), seg.Node()

	moved := make(chan error, 1)
	go func() { moved <- c.Move(ctx, seg) }()
	select {
	case id := <-held:
		require.Equal(t, seg.ID(), id)
	case <-time.After(30 * time.Second):
		t.Fatal("the move did not reach its switch-over")
	}
	require.Eventually(t, func() bool { return c.Stats().MovePreconnects == 1 }, 10*time.Second, 10*time.Millisecond,
		"the client was told of the move before the seal")
	after := bytes.Repeat([]byte{0x5a}, 4096)
	wrote := make(chan error, 1)
	go func() {
		_, err := seg.WriteAt(after, 8192)
		wrote <- err
	}()
	select {
	case err := <-wrote:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the write waited for the origin to announce the switch-over, which it holds")
	}
	require.NotEqual(t, from, seg.Node(), "the write went to the new home")
	require.EqualValues(t, 1, c.Stats().MoveHandovers)

	release()
	require.NoError(t, <-moved, "the move the test failed after its SEAL answered rolled forward: it happened")
	checkRolledForward(t, oh, seg, from, before, after)
}

// copyDelegates is who the home node serves its segment id to (the
// clients its origin named there).
func copyDelegates(sc *simCluster, node string, id uint64) []string {
	p := sc.host(node).daemon().pool
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.segs[id]; ok {
		return slices.Sorted(slices.Values(r.Delegates))
	}
	return nil
}

// TestMoveRolledForwardTellsClients: on 4 simulated hosts, a move is held
// after the source answered its SEAL (the sealAnswered hook); meanwhile
// the client "reader", attached before the move, detaches, and "late"
// attaches. The hook then fails the move, which rolls forward (the
// source handed the segment over): the move reports success, and the new
// home ends up serving the copy to the owner and "late" only, as after a
// move that succeeded: not to the detached reader, nor to the old home's
// daemon that wrote it during the move; "late" reads it there.
func TestMoveRolledForwardTellsClients(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second})
	oh := sc.hosts[3]
	held, release := holdAfterSeal(t, oh)
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	ctx := t.Context()
	dial := func(id string) *alloc.Client {
		c, err := alloc.Dial(ctx, oh.cfg.Socket, alloc.WithClientID(id))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}

	app, reader, late := dial("app"), dial("reader"), dial("late")
	seg, err := app.Alloc(ctx, 64<<10, alloc.WithTier(alloc.TierRDMA), alloc.WithName("rolled"))
	require.NoError(t, err)
	want := bytes.Repeat([]byte{0x3c}, 64<<10)
	_, err = seg.WriteAt(want, 0)
	require.NoError(t, err)
	from := seg.Node()
	rs, err := reader.Attach(ctx, "rolled")
	require.NoError(t, err)

	moved := make(chan error, 1)
	go func() { moved <- app.Move(ctx, seg) }()
	select {
	case id := <-held:
		require.Equal(t, seg.ID(), id)
	case <-time.After(30 * time.Second):
		t.Fatal("the move did not reach its switch-over")
	}
	require.NoError(t, rs.Close(), "the reader detaches during the move")
	ls, err := late.Attach(ctx, "rolled")
	require.NoError(t, err, "late attaches during the move")
	release()
	require.NoError(t, <-moved, "the move rolled forward: it happened")

	origin := oh.daemon()
	r, err := origin.pool.Stat(seg.ID())
	require.NoError(t, err)
	require.NotEqual(t, from, r.Home, "rolled forward: the record names the new home")
	require.Eventually(t, func() bool {
		return slices.Equal(copyDelegates(sc, r.Home, r.HomeID), []string{"app", "late"})
	}, 30*time.Second, 20*time.Millisecond, "the new home serves the copy to the owner and late only")
	got := make([]byte, len(want))
	_, err = ls.ReadAt(got, 0)
	require.NoError(t, err, "late reads the moved segment at its new home")
	require.True(t, bytes.Equal(want, got))
}

// TestMoveLateSealHandedOver: on 4 simulated hosts, the source refuses a
// move's SEAL (the moveOutStep hook: the origin's call fails before the
// handler ran), so the origin asks STATUS, finds the segment not sealed,
// and sends ABORT; the test holds that ABORT and runs the SEAL it refused
// first, as a handler that completes late would: the source pushes,
// notes the push and hands the segment over, and the client, told of the
// copy, writes there. The source then refuses the ABORT (the segment was
// handed over) and the origin rolls the move forward: the record names
// the new home, the write made there is kept, and the move succeeds.
func TestMoveLateSealHandedOver(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second})
	oh := sc.hosts[3]
	var (
		mu      sync.Mutex
		armed   bool
		sealBy  caller
		sealReq *poolv1.MoveOutRequest
		late    func() error // the late SEAL, then the client's write
		lateErr = make(chan error, 1)
	)
	for _, h := range sc.hosts[:3] {
		h.cfg.sim.moveOutStep = func(c caller, req *poolv1.MoveOutRequest) error {
			mu.Lock()
			switch {
			case !armed:
			case req.Phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL:
				sealBy, sealReq = c, req
				mu.Unlock()
				return fmt.Errorf("the test lost the SEAL: %w", errs.ErrUnavailable)
			case req.Phase == poolv1.MoveOutPhase_MOVE_OUT_ABORT && sealReq != nil:
				armed = false // the late SEAL runs through here too
				mu.Unlock()
				d := h.daemon()
				_, err := d.pool.moveOut(context.Background(), sealBy, sealReq, d.moveTLS())
				lateErr <- errors.Join(err, late())
				return nil
			}
			mu.Unlock()
			return nil
		}
	}
	c, seg, before := startHandover(t, sc, oh)
	ctx, from := t.Context(), seg.Node()
	after := bytes.Repeat([]byte{0x5a}, 4096)
	mu.Lock()
	armed = true
	late = func() error {
		if c.Stats().MovePreconnects != 1 {
			return errors.New("the client was not told of the move before the seal")
		}
		_, err := seg.WriteAt(after, 8192)
		return err
	}
	mu.Unlock()

	merr := c.Move(ctx, seg)
	select {
	case err := <-lateErr:
		require.NoError(t, err, "the late SEAL and the client's write at the copy")
	default:
		t.Fatal("the origin sent no ABORT after its SEAL failed")
	}
	require.NoError(t, merr, "the move rolled forward: it happened")
	require.EqualValues(t, 1, c.Stats().MoveHandovers, "the write followed the handover")
	checkRolledForward(t, oh, seg, from, before, after)
}

// holdAfterSeal holds every move oh's daemon directs after its source
// answered the SEAL (the sealAnswered hook): held gets the segment's id,
// and release lets the move go on, failed there as a SEAL whose answer
// was lost would be. The test's end releases a move still held.
func holdAfterSeal(t *testing.T, oh *simHost) (held chan uint64, release func()) {
	held = make(chan uint64, 1)
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	oh.cfg.sim.sealAnswered = func(seg uint64) error {
		held <- seg
		<-ch
		return fmt.Errorf("the test failed the move after its SEAL answered: %w", errs.ErrUnavailable)
	}
	return held, release
}

// startHandover starts sc and has client "app" of oh allocate a 1 MiB
// rdma segment filled with 0xa5 (before).
func startHandover(t *testing.T, sc *simCluster, oh *simHost) (c *alloc.Client, seg *alloc.Segment, before []byte) {
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	c, err = alloc.Dial(t.Context(), oh.cfg.Socket, alloc.WithClientID("app"))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	seg, err = c.Alloc(t.Context(), handoverSize, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	before = bytes.Repeat([]byte{0xa5}, handoverSize)
	_, err = seg.WriteAt(before, 0)
	require.NoError(t, err)
	return c, seg, before
}

// handoverSize is startHandover's segment size.
const handoverSize = 1 << 20

// checkRolledForward waits until oh's daemon resolved the move of seg,
// then checks that its record names a home other than from, the one seg
// uses, and that seg reads before with after written at 8192.
func checkRolledForward(t *testing.T, oh *simHost, seg *alloc.Segment, from string, before, after []byte) {
	origin := oh.daemon()
	require.Eventually(t, func() bool {
		ins, err := origin.pool.st.intents()
		return err == nil && len(ins) == 0
	}, 30*time.Second, 50*time.Millisecond, "the move is resolved")
	r, err := origin.pool.Stat(seg.ID())
	require.NoError(t, err)
	require.NotEqual(t, from, r.Home, "rolled forward: the record names the new home")
	require.Equal(t, r.Home, seg.Node(), "the client reads and writes at the home the record names")
	want := bytes.Clone(before)
	copy(want[8192:], after)
	got := make([]byte, handoverSize)
	_, err = seg.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the bytes from before the move and the write made at the new home")
}
