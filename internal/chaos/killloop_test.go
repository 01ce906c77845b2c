package chaos

import (
	"context"
	"errors"
	"flag"
	"math/rand/v2"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

var kills = flag.Int("chaos.kills", 15, "TestKillLoop: how many times poold is killed")

// callTimeout bounds every client call in the chaos tests: a call that
// reaches it hung, which fails the test. Generous, for -race on a small
// machine; a healthy call returns in milliseconds, or in the time a
// restart takes.
const callTimeout = 30 * time.Second

// fill is the byte segment id holds at offset i.
func fill(id uint64, i int) byte { return byte(id*131 + uint64(i)*7 + uint64(i>>12)) }

// ledger is the client side's account of what the daemon acknowledged.
type ledger struct {
	mu sync.Mutex
	// live: allocated and written, both acknowledged, not freed.
	live map[uint64]*held
	// unsure: a free was in flight at a kill: the segment may exist or not.
	unsure map[uint64]*held
	// freed: frees acknowledged; those segments must never come back.
	freed map[uint64]bool
	// lostAllocs counts allocations in flight at a kill: each may exist
	// afterwards without the client knowing its id.
	lostAllocs int
}

// held is a segment the client has (or may have).
type held struct {
	id   uint64
	size int64
	seg  *alloc.Segment // nil once Free was called on it
}

// call runs one client call with callTimeout and reports its error: nil,
// or one that errors.Is alloc.ErrUnavailable (the daemon died under it).
// Any other error, or a call that hangs, fails the test.
func call(t *testing.T, what string, fn func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	err := fn(ctx)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		t.Errorf("%s hung for %v: %v", what, callTimeout, err)
	case !errors.Is(err, alloc.ErrUnavailable):
		t.Errorf("%s failed with %v, which is not alloc.ErrUnavailable", what, err)
	}
	return err
}

// work allocates, writes and frees until stop is closed.
func (l *ledger) work(t *testing.T, c *alloc.Client, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		l.mu.Lock()
		var victim *held
		if n := len(l.live); n >= 32 || n > 0 && rand.IntN(5) < 2 {
			for _, h := range l.live {
				victim = h
				break
			}
			delete(l.live, victim.id)
		}
		l.mu.Unlock()
		if victim != nil {
			l.free(t, c, victim)
			continue
		}
		var seg *alloc.Segment
		err := call(t, "Alloc", func(ctx context.Context) (err error) {
			seg, err = c.Alloc(ctx, int64(4096*(1+rand.IntN(16))), alloc.WithTier(alloc.TierCXL))
			return err
		})
		if err != nil {
			l.mu.Lock()
			l.lostAllocs++
			l.mu.Unlock()
			continue
		}
		b, ok := seg.Bytes()
		if !ok {
			t.Errorf("segment %d on the cxl tier has no mapping", seg.ID())
			return
		}
		for i := range b {
			b[i] = fill(seg.ID(), i)
		}
		l.mu.Lock()
		l.live[seg.ID()] = &held{id: seg.ID(), size: seg.Size(), seg: seg}
		l.mu.Unlock()
	}
}

// free frees h and records the outcome: through its Segment, or by id
// when it has none (a segment whose earlier free was lost in a kill).
func (l *ledger) free(t *testing.T, c *alloc.Client, h *held) {
	seg := h.seg
	h.seg = nil
	err := call(t, "Free", func(ctx context.Context) error {
		if seg == nil {
			return c.FreeByID(ctx, h.id)
		}
		return seg.Free(ctx)
	})
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.unsure[h.id] = h
		return
	}
	l.freed[h.id] = true
}

// TestKillLoop kills poold with SIGKILL at random points while four
// goroutines of one client allocate, write and free segments, restarts it,
// and checks after each restart that every acknowledged segment exists
// with its bytes, that no acknowledged free came back, and that nothing
// half-done remains: no segment file without a record, no two extents
// overlapping, free capacity equal to capacity minus the live extents.
// The client is never re-dialled: it reconnects by itself, and its calls
// in flight at a kill fail with ErrUnavailable (call checks it).
func TestKillLoop(t *testing.T) {
	n := newNode(t, "--lease-ttl", "5s")
	n.start(t)
	api := n.admin(t)
	ctx := t.Context()
	c, err := alloc.Dial(ctx, n.sock, alloc.WithClientID("kill-loop"))
	require.NoError(t, err)
	defer c.Close()
	l := &ledger{live: map[uint64]*held{}, unsure: map[uint64]*held{}, freed: map[uint64]bool{}}
	for k := range *kills {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { l.work(t, c, stop) })
		}
		time.Sleep(time.Duration(50+rand.IntN(400)) * time.Millisecond)
		n.kill9(t)
		time.Sleep(time.Duration(rand.IntN(50)) * time.Millisecond)
		close(stop)
		n.start(t)
		wg.Wait()
		if t.Failed() {
			return
		}
		l.check(t, n, api, k)
	}

	// Free what is left: all capacity comes back.
	for _, h := range l.live {
		l.free(t, c, h)
	}
	st, err := n.state(ctx, api)
	require.NoError(t, err)
	for _, s := range st.segs {
		require.NoError(t, c.FreeByID(ctx, s.Id))
	}
	st, err = n.state(ctx, api)
	require.NoError(t, err)
	require.Empty(t, st.segs)
	require.Equal(t, st.capacity, st.free, "all capacity is back")
	require.Empty(t, n.segFiles(t), "no segment file is left")
	t.Logf("%d kills; %d segments freed; %d allocations and %d frees were in flight at a kill", *kills, len(l.freed), l.lostAllocs, len(l.unsure))
}

// check compares the restarted daemon's state with the ledger.
func (l *ledger) check(t *testing.T, n *node, api poolv1.PoolClient, kill int) {
	t.Helper()
	st, err := n.state(t.Context(), api)
	require.NoError(t, err)
	byID := map[uint64]*poolv1.Segment{}
	for _, s := range st.segs {
		byID[s.Id] = s
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, h := range l.live {
		s := byID[id]
		require.NotNil(t, s, "after kill %d: acknowledged segment %d is gone", kill, id)
		require.Equal(t, h.size, s.Size)
		require.Equal(t, poolv1.SegmentState_SEGMENT_STATE_ACTIVE, s.State)
		b, err := os.ReadFile(n.segFile(id))
		require.NoError(t, err)
		require.GreaterOrEqual(t, int64(len(b)), h.size)
		for i := range h.size {
			if b[i] != fill(id, int(i)) {
				t.Fatalf("after kill %d: segment %d holds %#x at %d, written %#x", kill, id, b[i], i, fill(id, int(i)))
			}
		}
	}
	for id, h := range l.unsure {
		if byID[id] != nil {
			l.live[id] = h // its free never happened; FreeByID frees it at the end
		}
		delete(l.unsure, id)
	}
	strays := 0
	for id, s := range byID {
		require.False(t, l.freed[id], "after kill %d: segment %d came back after its free was acknowledged", kill, id)
		require.Equal(t, "kill-loop", s.Owner)
		if l.live[id] == nil {
			strays++ // an allocation whose reply the kill lost
		}
	}
	require.LessOrEqual(t, strays, l.lostAllocs, "after kill %d: more unknown segments than allocations in flight at kills", kill)

	// Nothing half-done: one file per segment, no overlap, capacity adds up.
	files := n.segFiles(t)
	ids := map[uint64]bool{}
	for id := range byID {
		ids[id] = true
	}
	require.Equal(t, ids, files, "after kill %d: segment files and records differ", kill)
	segs := slices.Clone(st.segs)
	slices.SortFunc(segs, func(a, b *poolv1.Segment) int { return int(a.Offset - b.Offset) })
	var used int64
	for i, s := range segs {
		extent := (s.Size + 4095) / 4096 * 4096
		used += extent
		if i+1 < len(segs) {
			require.LessOrEqual(t, s.Offset+extent, segs[i+1].Offset, "after kill %d: segments %d and %d overlap", kill, s.Id, segs[i+1].Id)
		}
	}
	require.Equal(t, st.capacity-used, st.free, "after kill %d: free capacity is not capacity minus the live segments", kill)
}
