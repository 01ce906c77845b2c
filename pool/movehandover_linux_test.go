package pool

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

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
	checkMovedAway(t, oh, seg, from, before, after)
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
	checkMovedAway(t, oh, seg, from, before, after)
}

// TestMoveLateSealAfterAbort: on 4 simulated hosts, the source refuses a
// move's SEAL (the moveOutStep hook: the origin's call fails before the
// handler ran), so the origin asks STATUS, finds the segment not sealed
// and sends ABORT, which runs; the move fails. The copy's node refuses
// the origin's Free of the copy (as one unreachable then would), so the
// copy outlives the ABORT. A second move of the segment begins; before
// its first PUSH of the changed chunks, the client writes (the source
// tracks it for the second move), and the test runs the SEAL the source
// refused first, as a handler that completes late would: the source
// refuses it (errMoveAborted) rather than take the second move's changed
// chunks, push them to the first move's copy, seal the segment and hand
// it over there. The client, told of both copies, writes and reads
// again at the old home, following nothing; the second move then
// succeeds, and its copy holds the bytes from before and the write.
func TestMoveLateSealAfterAbort(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second})
	oh := sc.hosts[3]
	const (
		loseSeal = iota + 1 // the first move's SEAL is refused
		runLate             // the second move's first PUSH runs it first
	)
	var (
		mu       sync.Mutex
		stage    int
		sealBy   caller
		sealReq  *poolv1.MoveOutRequest
		write    func() error // the client's write before the late SEAL
		client   func() error // its write and read at the old home after it
		sealErr  = make(chan error, 1)
		useErr   = make(chan error, 1)
		keepCopy atomic.Bool
	)
	for _, h := range sc.hosts[:3] {
		h.cfg.sim.grpc = append(h.cfg.sim.grpc, refuseFreeWhile(&keepCopy, "the test keeps the copy of the failed move"))
		h.cfg.sim.moveOutStep = func(c caller, req *poolv1.MoveOutRequest) error {
			mu.Lock()
			switch {
			case stage == loseSeal && req.Phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL:
				stage, sealBy, sealReq = 0, c, req
				mu.Unlock()
				return fmt.Errorf("the test lost the SEAL: %w", errs.ErrUnavailable)
			case stage == runLate && req.Phase == poolv1.MoveOutPhase_MOVE_OUT_PUSH && !req.All:
				stage = 0
				mu.Unlock()
				werr := write()
				d := h.daemon()
				_, err := d.pool.moveOut(context.Background(), sealBy, sealReq, d.moveTLS())
				sealErr <- err
				useErr <- errors.Join(werr, client())
				return nil
			}
			mu.Unlock()
			return nil
		}
	}
	// A client that bounced between the old home and a copy would fail
	// its write after this, rather than the default 30 s.
	c, seg, before := startHandover(t, sc, oh, alloc.WithOpTimeout(5*time.Second))
	ctx, from := t.Context(), seg.Node()
	after := bytes.Repeat([]byte{0x5a}, 4096)
	write = func() error {
		_, err := seg.WriteAt(after, 8192)
		return err
	}
	client = func() error {
		if _, err := seg.WriteAt(before[:4096], 0); err != nil {
			return fmt.Errorf("write: %w", err)
		}
		got := make([]byte, len(after))
		if _, err := seg.ReadAt(got, 8192); err != nil {
			return fmt.Errorf("read: %w", err)
		}
		if !bytes.Equal(after, got) {
			return errors.New("the read did not return the write")
		}
		if seg.Node() != from {
			return fmt.Errorf("the client uses %s, not the old home %s", seg.Node(), from)
		}
		return nil
	}

	mu.Lock()
	stage = loseSeal
	mu.Unlock()
	keepCopy.Store(true)
	require.Error(t, c.Move(ctx, seg), "the first move failed: its SEAL was lost and the source not sealed")
	require.Eventually(t, func() bool { return c.Stats().MovePreconnects == 1 }, 10*time.Second, 10*time.Millisecond,
		"the client was told of the first move's copy")
	mu.Lock()
	require.NotNil(t, sealReq, "the test lost the first move's SEAL")
	stage = runLate
	mu.Unlock()

	merr := c.Move(ctx, seg)
	select {
	case err := <-useErr:
		require.NoError(t, err, "the client's write and read at the old home after the late SEAL")
	default:
		t.Fatal("the second move sent no PUSH")
	}
	require.ErrorIs(t, <-sealErr, errMoveAborted, "the late SEAL of the aborted move is refused")
	require.NoError(t, merr, "the second move")
	require.Zero(t, c.Stats().MoveHandovers, "no operation followed a handover")
	keepCopy.Store(false)
	checkMovedAway(t, oh, seg, from, before, after)
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

// startHandover starts sc and has client "app" of oh, dialed with opts,
// allocate a 1 MiB rdma segment filled with 0xa5 (before).
func startHandover(t *testing.T, sc *simCluster, oh *simHost, opts ...alloc.DialOption) (c *alloc.Client, seg *alloc.Segment, before []byte) {
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	c, err = alloc.Dial(t.Context(), oh.cfg.Socket, append([]alloc.DialOption{alloc.WithClientID("app")}, opts...)...)
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

// checkMovedAway waits until oh's daemon resolved the move of seg (one
// that rolled forward, or succeeded), then checks that its record names
// a home other than from, the one seg uses, and that seg reads before
// with after written at 8192.
func checkMovedAway(t *testing.T, oh *simHost, seg *alloc.Segment, from string, before, after []byte) {
	origin := oh.daemon()
	require.Eventually(t, func() bool {
		ins, err := origin.pool.st.intents()
		return err == nil && len(ins) == 0
	}, 30*time.Second, 50*time.Millisecond, "the move is resolved")
	r, err := origin.pool.Stat(seg.ID())
	require.NoError(t, err)
	require.NotEqual(t, from, r.Home, "the record names the new home")
	require.Equal(t, r.Home, seg.Node(), "the client reads and writes at the home the record names")
	want := bytes.Clone(before)
	copy(want[8192:], after)
	got := make([]byte, handoverSize)
	_, err = seg.ReadAt(got, 0)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, got), "the bytes from before the move and the write made during it")
}

// refuseFreeWhile is a host's gRPC interceptor that refuses every Free
// (ErrUnavailable, saying why) while keep is set: a test keeps the copy
// of a move it undid, so that a late step of that move finds it.
func refuseFreeWhile(keep *atomic.Bool, why string) grpc.ServerOption {
	return grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
		if keep.Load() && strings.HasSuffix(info.FullMethod, "/Free") {
			return nil, errs.ToStatus(fmt.Errorf("%s: %w", why, errs.ErrUnavailable))
		}
		return next(ctx, req)
	})
}
