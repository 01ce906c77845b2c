package alloc_test

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/coherence"
	"github.com/farmem/farmem/coherence/lincheck"
	"github.com/farmem/farmem/internal/faultproxy"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/pool"
	"github.com/farmem/farmem/rdma/tcp"
)

// sharedPool starts a pool and allocates a named rdma segment on it.
func sharedPool(t *testing.T, size int64) (string, []*alloc.Client) {
	cfg, c0 := startPool(t)
	_, err := c0.Alloc(t.Context(), size, alloc.WithName("hot"), alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	clients := []*alloc.Client{c0, dial(t, cfg.Socket), dial(t, cfg.Socket)}
	return "hot", clients
}

func attachAll(t *testing.T, name string, clients []*alloc.Client) []*alloc.SharedSegment {
	var segs []*alloc.SharedSegment
	for _, c := range clients {
		seg, err := c.Attach(t.Context(), name, alloc.Shared(alloc.SharedPageSize(512)))
		require.NoError(t, err)
		s := seg.Shared()
		t.Cleanup(func() { s.Detach(context.Background()) })
		segs = append(segs, s)
	}
	return segs
}

func TestSharedSegmentCoherent(t *testing.T) {
	name, clients := sharedPool(t, 4096)
	segs := attachAll(t, name, clients)
	ctx := t.Context()

	// A write by one attachment is seen by the others, which cached the
	// page before it.
	for _, s := range segs {
		v, err := s.Load64(0)
		require.NoError(t, err)
		require.Zero(t, v)
	}
	require.NoError(t, segs[0].Store64(0, 42))
	for _, s := range segs {
		v, err := s.Load64(0)
		require.NoError(t, err)
		require.EqualValues(t, 42, v)
	}
	require.Positive(t, segs[1].Stats().Invalidations+segs[2].Stats().Invalidations)

	// Counters from every attachment add up.
	var wg sync.WaitGroup
	for _, s := range segs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				_, err := s.Add64(8, 1)
				require.NoError(t, err)
			}
		}()
	}
	wg.Wait()
	v, err := segs[2].Load64(8)
	require.NoError(t, err)
	require.EqualValues(t, 150, v)

	// Spanning pages, bounds, alignment.
	buf := make([]byte, 1500)
	for i := range buf {
		buf[i] = byte(i)
	}
	_, err = segs[1].WriteAt(buf, 100)
	require.NoError(t, err)
	got := make([]byte, 1500)
	_, err = segs[0].ReadAt(got, 100)
	require.NoError(t, err)
	require.Equal(t, buf, got)
	_, err = segs[0].WriteAt(buf, 4000)
	require.ErrorIs(t, err, alloc.ErrOutOfRange)
	n, err := segs[0].ReadAt(got, 4000)
	require.Equal(t, 96, n)
	require.ErrorIs(t, err, io.EOF)
	_, err = segs[0].CompareAndSwap64(4, 0, 1)
	require.ErrorIs(t, err, alloc.ErrUnaligned)

	// Sync makes the writes survive the writer: a dead attachment loses
	// only what it had not written back.
	require.NoError(t, segs[1].Store64(16, 7))
	require.NoError(t, segs[1].Sync(ctx))
	require.NoError(t, segs[1].Detach(ctx))
	v, err = segs[0].Load64(16)
	require.NoError(t, err)
	require.EqualValues(t, 7, v)

	// A page size the home does not use is refused.
	odd, err := clients[1].Attach(ctx, name, alloc.Shared(alloc.SharedPageSize(1024)))
	require.NoError(t, err)
	_, err = odd.Load64(0)
	require.Error(t, err)
	require.NoError(t, odd.Shared().Detach(ctx))
}

func TestSharedSegmentNeedsRDMA(t *testing.T) {
	_, c := startPool(t)
	_, err := c.Alloc(t.Context(), 4096, alloc.WithName("local"), alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	_, err = c.Attach(t.Context(), "local", alloc.Shared())
	require.ErrorIs(t, err, alloc.ErrNotSupported)
}

// TestSharedSegmentLinearizable records reads, writes and CAS of three
// attachments on three hot pages through the real daemon's data plane and
// checks the history with porcupine, also when one attachment dies midway
// (its writes not written back are lost: they count as outcome unknown).
// Failing histories are kept in $FARMEM_KEEP_HISTORIES (else the test's
// temporary directory) and the path is printed.
func TestSharedSegmentLinearizable(t *testing.T) {
	for _, kill := range []bool{false, true} {
		t.Run(map[bool]string{false: "no faults", true: "sharer killed"}[kill], func(t *testing.T) {
			name, clients := sharedPool(t, 3*512)
			segs := attachAll(t, name, clients)
			rec := lincheck.NewRecorder()
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for i, s := range segs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					sharedWorker(s, rec, i, stop)
				}()
			}
			time.Sleep(500 * time.Millisecond)
			if kill {
				alloc.AbandonShared(segs[2])
			}
			time.Sleep(700 * time.Millisecond)
			close(stop)
			wg.Wait()
			if kill {
				rec.Forget(2, 0, rec.Now())
			}
			dir := os.Getenv("FARMEM_KEEP_HISTORIES")
			if dir == "" {
				dir = t.TempDir()
			}
			ok, path, err := lincheck.Check(rec.Ops(), 30*time.Second, dir)
			require.NoError(t, err)
			require.True(t, ok, "history not linearizable; see %s", path)
			t.Logf("%d operations linearizable", len(rec.Ops()))
		})
	}
}

// sharedWorker does random reads, writes and CAS on three hot words until
// stop closes, recording each.
func sharedWorker(s *alloc.SharedSegment, rec *lincheck.Recorder, i int, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(uint64(i), 99))
	for {
		select {
		case <-stop:
			return
		default:
		}
		time.Sleep(time.Duration(rng.IntN(500)) * time.Microsecond)
		k := rng.IntN(3)
		off := int64(k * 512)
		in := lincheck.Input{Key: k}
		var out lincheck.Output
		call := rec.Now()
		var err error
		switch r := rng.IntN(10); {
		case r < 5:
			in.Kind = lincheck.Read
			out.Value, err = s.Load64(off)
		case r < 8:
			in.Kind, in.Value = lincheck.Write, rng.Uint64N(100)+1
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], in.Value)
			_, err = s.WriteAt(b[:], off)
		default:
			in.Kind = lincheck.CAS
			in.Old, err = s.Load64(off)
			if err == nil {
				call = rec.Now()
				in.New = rng.Uint64N(100) + 1
				out.Swapped, err = s.CompareAndSwap64(off, in.Old, in.New)
			}
		}
		if errors.Is(err, alloc.ErrClosed) {
			rec.AddUnknown(i, in, call)
			return
		}
		if err != nil {
			rec.AddUnknown(i, in, call)
			continue
		}
		rec.Add(i, in, out, call)
	}
}

func TestSharedSegmentMetrics(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Metrics = "127.0.0.1:0"
	d := pooltest.Start(t, cfg)
	clients := []*alloc.Client{dial(t, cfg.Socket), dial(t, cfg.Socket)}
	_, err := clients[0].Alloc(t.Context(), 4096, alloc.WithName("m"), alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	segs := attachAll(t, "m", clients)
	_, err = segs[1].Load64(0)
	require.NoError(t, err)
	require.NoError(t, segs[0].Store64(0, 1)) // invalidates segs[1]
	require.NoError(t, segs[0].Sync(t.Context()))
	resp, err := http.Get("http://" + d.MetricsAddr() + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for _, want := range []string{"farmem_coherence_invalidations_total 1", "farmem_coherence_writebacks_total 1", `farmem_coherence_sharers{segment="1"} 2`, "farmem_coherence_lease_waits_total 0"} {
		require.Contains(t, string(body), want)
	}
}

// TestSharedSegmentHomeRestart restarts the home's poold (same data
// plane address): open attachments fail with ErrSegmentLost, and a new
// attachment sees what was last written back (Sync), not later writes.
func TestSharedSegmentHomeRestart(t *testing.T) {
	cfg := pooltest.Config(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg.DataListen = l.Addr().String()
	l.Close()
	d, err := pool.Start(cfg, nil)
	require.NoError(t, err)
	ctx := t.Context()
	c, err := alloc.Dial(ctx, cfg.Socket)
	require.NoError(t, err)
	_, err = c.Alloc(ctx, 4096, alloc.WithName("r"), alloc.WithTier(alloc.TierRDMA), alloc.WithPersist())
	require.NoError(t, err)
	seg, err := c.Attach(ctx, "r", alloc.Shared(alloc.SharedPageSize(512)))
	require.NoError(t, err)
	s := seg.Shared()
	require.NoError(t, s.Store64(0, 1))
	require.NoError(t, s.Sync(ctx))
	require.NoError(t, s.Store64(0, 2)) // never written back
	require.NoError(t, d.Close())

	d, err = pool.Start(cfg, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	// The old attachment's next miss reaches the new directory.
	var lerr error
	for range 200 {
		if _, lerr = s.Load64(512); lerr != nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.ErrorIs(t, lerr, alloc.ErrSegmentLost)
	require.ErrorIs(t, s.Detach(ctx), alloc.ErrSegmentLost, "detach reports the unsynced write it could not hand back")
	require.NoError(t, c.Close())

	c2 := dial(t, cfg.Socket)
	s2, err := c2.Attach(ctx, "r", alloc.Shared(alloc.SharedPageSize(512)))
	require.NoError(t, err)
	defer s2.Shared().Detach(ctx)
	v, err := s2.Load64(0)
	require.NoError(t, err)
	require.EqualValues(t, 1, v, "the home keeps what was written back, not the later write")
}

// TestCoherenceFitsMSG: the largest requests a sharer sends, a page of the
// largest page size and a poll carrying a full batch of acks without data,
// fit in one MSG, whose payload the home refuses beyond tcp.MaxMessage.
func TestCoherenceFitsMSG(t *testing.T) {
	page := coherence.AppendBatch(nil, []coherence.Message{{Kind: coherence.WriteBack, HasData: true, Data: make([]byte, coherence.MaxData)}})
	require.LessOrEqual(t, len(page), tcp.MaxMessage, "a WriteBack of a %d-byte page", coherence.MaxData)
	poll := coherence.AppendBatch(nil, make([]coherence.Message, coherence.MaxBatch))
	require.LessOrEqual(t, len(poll), tcp.MaxMessage, "a poll with %d acks", coherence.MaxBatch-1)
}

// TestSharedLinkRenewsCredential: a shared attachment whose client's
// session with its daemon ended (the daemon withdrew the data-plane
// credential the link presents) and whose link's connections broke goes on
// once the client has a new session: the home refuses the old credential,
// and the link asks the daemon for the one it holds now instead of
// reporting the segment lost.
func TestSharedLinkRenewsCredential(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Listen = "127.0.0.1:0"
	pooltest.TLS(t, &cfg)
	d := pooltest.Start(t, cfg)
	control, err := faultproxy.Start(faultproxy.Config{Target: d.ListenAddr()})
	require.NoError(t, err)
	defer control.Close()
	through, data := lazyProxy(t, faultproxy.Config{})
	c := dial(t, "tcp://"+control.Addr(), alloc.WithTLS(pooltest.ClientTLS(t, "renewing-app")), alloc.WithDataAddr(through))
	ctx := t.Context()
	_, err = c.Alloc(ctx, 4096, alloc.WithName("renewed"), alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	seg, err := c.Attach(ctx, "renewed", alloc.Shared(alloc.SharedPageSize(512)))
	require.NoError(t, err)
	s := seg.Shared()
	t.Cleanup(func() { s.Detach(context.Background()) })
	require.NoError(t, s.Store64(0, 42))
	require.NoError(t, s.Sync(ctx))

	before := alloc.SessionID(c)
	control.KillAll() // the session ends: its credential is withdrawn
	require.Eventually(t, func() bool {
		_, err := c.Tiers(ctx)
		sid := alloc.SessionID(c)
		return err == nil && sid != "" && sid != before
	}, 10*time.Second, 20*time.Millisecond, "the client opens a new session")
	data().KillAll() // the link's connections break: it dials again

	// A write by another attachment makes this one's next read go to the
	// home (its copy is invalidated), over connections dialed anew.
	other, err := c.Attach(ctx, "renewed", alloc.Shared(alloc.SharedPageSize(512)))
	require.NoError(t, err)
	o := other.Shared()
	t.Cleanup(func() { o.Detach(context.Background()) })
	require.NoError(t, o.Store64(0, 43))
	v, err := s.Load64(0)
	require.NoError(t, err, "the attachment goes on with the credential of the client's new session")
	require.EqualValues(t, 43, v)
}
