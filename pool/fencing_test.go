package pool

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// newServingPool is a core whose rdma tier is served on a loopback data
// plane, on a clock the test moves.
func newServingPool(t *testing.T) (*core, *time.Time) {
	cfg := testConfig(t)
	cfg.ExportSize = 16 * size.MiB
	cfg.DataListen = "127.0.0.1:0"
	return servingPool(t, cfg)
}

// servingPool is newServingPool on cfg: again on the same configuration,
// a restart.
func servingPool(t *testing.T, cfg Config) (*core, *time.Time) {
	log := slog.New(slog.DiscardHandler)
	_, devs, err := discover(cfg, log)
	require.NoError(t, err)
	dp, err := newDataPlane(cfg.DataListen, tcp.ServerConfig{Logger: log, BusyPoll: -1}, dataSecurity{}, nil)
	require.NoError(t, err)
	p, err := newCore(cfg, log, devs, dp, nil)
	require.NoError(t, err)
	dp.serve()
	t.Cleanup(func() { require.NoError(t, p.close()) })
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	return p, &now
}

// region is what a client holds to reach an rdma segment.
func region(t *testing.T, r *record) rdma.Region {
	require.False(t, r.Key.IsZero(), "segment %d has no rdma key", r.ID)
	return rdma.Region{Segment: r.ID, Key: r.Key, Epoch: r.Epoch}
}

// TestFencing: a client whose lease ends loses its segment even while it
// keeps reading (reads are not keep-alives); the memory goes to another
// client; every write, atomic and read the old client retries is refused
// with ErrLeaseExpired, and the new owner's bytes are intact. A live
// segment whose epoch was raised refuses writes with the old epoch.
func TestFencing(t *testing.T) {
	p, now := newServingPool(t)
	ctx := t.Context()
	p.openSession("s-old", "old", "", "old", 1, 0)
	oldC, err := p.callerFor("s-old")
	require.NoError(t, err)
	const n = 64 << 10
	r1, err := p.Alloc(ctx, oldC, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err)
	// Each client reaches its own segments with its own credential.
	dial := func(session, client string) *tcp.Client {
		c, err := tcp.Dial(ctx, p.dp.addr, tcp.WithCredential(p.auth.issue(session, client, client)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := dial("s-old", "old")
	old := region(t, r1)
	require.NoError(t, c.Write(ctx, old, 0, bytes.Repeat([]byte{0xAA}, n)))

	// The old client's session ends (a partition, a pause); it goes on
	// reading through the data plane, which does not renew its lease.
	p.closeSession("s-old")
	for range 3 {
		*now = now.Add(p.cfg.LeaseTTL / 2)
		_ = c.Read(ctx, old, 0, make([]byte, 8))
		p.reap()
	}
	_, err = p.Stat(r1.ID)
	require.Error(t, err, "the lease ran out although the client kept reading")
	require.Empty(t, p.auth.identity("old"), "reap forgot the client id's binding")

	// The same memory goes to a new client.
	p.openSession("s-new", "new", "", "new", 2, 0)
	newC, err := p.callerFor("s-new")
	require.NoError(t, err)
	r2, err := p.Alloc(ctx, newC, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err)
	require.Equal(t, [2]any{r1.Device, r1.Offset}, [2]any{r2.Device, r2.Offset}, "the extent is reused")
	require.NotEqual(t, r1.ID, r2.ID)
	want := make([]byte, n)
	rand.Read(want)
	fresh := region(t, r2)
	cNew := dial("s-new", "new")
	require.NoError(t, cNew.Write(ctx, fresh, 0, want))
	require.ErrorIs(t, c.Read(ctx, fresh, 0, make([]byte, 8)), rdma.ErrAccessDenied, "the old client's credential does not reach the new owner's segment")

	for _, tc := range []struct {
		name string
		op   func() error
	}{
		{"write", func() error { return c.Write(ctx, old, 0, bytes.Repeat([]byte{0xAA}, n)) }},
		{"cas", func() error { _, _, err := c.CompareAndSwap64(ctx, old, 0, 0, 1); return err }},
		{"fadd", func() error { _, err := c.FetchAdd64(ctx, old, 8, 1); return err }},
		{"read", func() error { return c.Read(ctx, old, 0, make([]byte, 8)) }},
	} {
		t.Run("old owner "+tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.op(), rdma.ErrLeaseExpired)
		})
	}
	got := make([]byte, n)
	require.NoError(t, cNew.Read(ctx, fresh, 0, got))
	require.Equal(t, want, got, "the new owner's bytes are intact")

	// The epoch check itself: a raised epoch fences writes carrying the
	// old one, and reads go on.
	require.NoError(t, p.dp.srv.SetEpoch(r2.ID, r2.Epoch+1))
	require.ErrorIs(t, cNew.Write(ctx, fresh, 0, []byte{1}), rdma.ErrLeaseExpired)
	_, err = cNew.FetchAdd64(ctx, fresh, 0, 1)
	require.ErrorIs(t, err, rdma.ErrLeaseExpired)
	require.NoError(t, cNew.Read(ctx, fresh, 0, got))
	require.Equal(t, want, got)
	next := fresh
	next.Epoch++
	require.NoError(t, cNew.Write(ctx, next, 0, want[:8]))

	// A free fences the segment too.
	require.NoError(t, p.Free(newC, r2.ID, ""))
	require.ErrorIs(t, cNew.Write(ctx, next, 0, want[:8]), rdma.ErrLeaseExpired)

	// The old client's id is bound anew by another identity: the old
	// client's connection, which would act for it, is closed; one of the
	// same identity coming back would have kept it.
	same := dial("s-old-2", "old")
	require.NoError(t, p.auth.bind("old", "old"))
	require.ErrorIs(t, same.Read(ctx, old, 0, make([]byte, 8)), rdma.ErrLeaseExpired, "bound anew by the same identity: kept")
	p.auth.forget("old")
	require.NoError(t, p.auth.bind("old", "uid:4242"))
	require.ErrorIs(t, c.Read(ctx, old, 0, make([]byte, 8)), rdma.ErrClosed, "bound anew by another identity: closed")
}

// TestPeerLease: the segments a peer poold placed here outlive its last
// session for PeerLeaseTTL, not LeaseTTL: a partition between the hosts
// ends that session, and the memory may hold the only copy of a segment
// the peer serves again once the partition heals. An application's
// segment is reclaimed one LeaseTTL after its session ends, as before;
// a restart keeps the same two leases for the owners it finds.
func TestPeerLease(t *testing.T) {
	p, now := newServingPool(t)
	cfg := p.cfg
	require.Greater(t, cfg.PeerLeaseTTL, 4*cfg.LeaseTTL, "the default peer lease is well beyond a client's")
	ctx := t.Context()
	alloc := func(p *core, session, client string) *record {
		r, err := p.Alloc(ctx, sessionCaller(t, p, session, client, 1, 0), allocRequest{Size: 64 << 10, Tier: poolv1.Tier_TIER_RDMA})
		require.NoError(t, err)
		return r
	}
	held := func(p *core, id uint64) bool {
		_, err := p.Stat(id)
		return err == nil
	}
	// passes moves the clock on by d, in steps of a quarter lease, reaping
	// at each as the daemon does.
	passes := func(p *core, now *time.Time, d time.Duration) {
		for step := cfg.LeaseTTL / 4; d > 0; d -= step {
			*now = now.Add(min(step, d))
			p.reap()
		}
	}

	app, peer := alloc(p, "s-app", "app"), alloc(p, "s-peer", peerClientPrefix+"b")
	p.closeSession("s-app")
	p.closeSession("s-peer")
	passes(p, now, 2*cfg.LeaseTTL)
	require.False(t, held(p, app.ID), "the application's segment is reclaimed one lease after its session")
	require.True(t, held(p, peer.ID), "the peer's segment outlives a client's lease")
	passes(p, now, cfg.PeerLeaseTTL-3*cfg.LeaseTTL)
	require.True(t, held(p, peer.ID), "the peer's segment is held until its peer lease ends")
	passes(p, now, 2*cfg.LeaseTTL)
	require.False(t, held(p, peer.ID), "the peer's segment is reclaimed one peer lease after its session")

	// A restart: the owners found in the store get the same leases.
	app, peer = alloc(p, "s-app2", "app"), alloc(p, "s-peer2", peerClientPrefix+"b")
	require.NoError(t, p.close())
	p, now = servingPool(t, cfg)
	*now = time.Now() // the restored leases run from the restart, on the real clock
	passes(p, now, 2*(cfg.LeaseTTL+restartGrace))
	require.False(t, held(p, app.ID), "after a restart, the application's segment is reclaimed one lease (and the restart's grace) on")
	require.True(t, held(p, peer.ID), "after a restart, the peer's segment outlives a client's lease")
	passes(p, now, cfg.PeerLeaseTTL)
	require.False(t, held(p, peer.ID))
}

// TestFreeFenceOutsideLock: a client that stops reading the answer of a
// large READ holds up the fence of its segment until it reads again (or
// the data plane's WriteTimeout cuts it off); a Free of that segment, or
// the reclaim of its owner's lease, waits for the fence, but another
// client's Alloc meanwhile does not wait behind it, and is not given the
// memory being fenced. A reclaim fences its segments together: the second
// one's fence begins while the first one's waits. A READ begun before
// gets its whole answer once its client reads again.
func TestFreeFenceOutsideLock(t *testing.T) {
	for _, tc := range []struct {
		reclaim string
		segs    int
	}{{"free", 1}, {"lease expired", 2}} {
		t.Run(tc.reclaim, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.ExportSize = 32 * size.MiB
			cfg.DataListen = "127.0.0.1:0"
			p, now := servingPool(t, cfg)
			ctx := t.Context()
			a, b := sessionCaller(t, p, "s-a", "a", 1, 0), sessionCaller(t, p, "s-b", "b", 1, 0)
			cred := tcp.WithCredential(p.auth.issue("s-a", "a", "a"))
			const n = 8 << 20 // beyond what the sockets between the data plane and the client buffer
			var segs []*record
			var proxies []*stallingProxy
			reads := make(chan error, tc.segs)
			for range tc.segs {
				r, err := p.Alloc(ctx, a, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA})
				require.NoError(t, err)
				px := newStallingProxy(t, p.dp.addr)
				stuck, err := tcp.Dial(ctx, px.addr, tcp.WithConns(1), cred)
				require.NoError(t, err)
				t.Cleanup(func() { stuck.Close() })
				px.stall()
				go func() { reads <- stuck.Read(ctx, region(t, r), 0, make([]byte, n)) }()
				<-px.stalled // the answer began: the READ holds the segment until it is flushed
				segs, proxies = append(segs, r), append(proxies, px)
			}

			freed := make(chan error, 1)
			if tc.reclaim == "free" {
				go func() { freed <- p.Free(a, segs[0].ID, "") }()
			} else {
				p.closeSession("s-a")
				*now = now.Add(2 * p.cfg.LeaseTTL)
				go func() { p.reap(); freed <- nil }()
			}
			// A segment's fence began once an operation with its key is refused.
			probe, err := tcp.Dial(ctx, p.dp.addr, cred)
			require.NoError(t, err)
			t.Cleanup(func() { probe.Close() })
			for _, r := range segs {
				for !errors.Is(probe.Read(ctx, region(t, r), 0, make([]byte, 8)), rdma.ErrLeaseExpired) {
					time.Sleep(time.Millisecond)
				}
			}

			other := make(chan *record, 1)
			go func() {
				r2, err := p.Alloc(ctx, b, allocRequest{Size: 64 << 10, Tier: poolv1.Tier_TIER_RDMA})
				assert.NoError(t, err)
				other <- r2
			}()
			var r2 *record
			select {
			case r2 = <-other:
			case err := <-freed:
				t.Fatalf("the %s (err %v) returned before another client's Alloc, which waited for its fence", tc.reclaim, err)
			}
			select {
			case err := <-freed:
				t.Fatalf("the %s (err %v) returned while the READs it fences were unanswered", tc.reclaim, err)
			default:
			}
			require.NotNil(t, r2)
			for _, r := range segs {
				require.True(t, r2.Device != r.Device || r2.Offset >= r.Offset+r.Extent || r2.Offset+r2.Extent <= r.Offset,
					"the Alloc was given memory of a segment being fenced: %d+%d within %d+%d", r2.Offset, r2.Extent, r.Offset, r.Extent)
			}

			for _, px := range proxies {
				px.resume()
			}
			for range segs {
				require.NoError(t, <-reads, "a READ begun before gets its whole answer (an error: the data plane cut the stalled client off, its fence ended before it read again)")
			}
			require.NoError(t, <-freed)
			for _, r := range segs {
				_, err = p.Stat(r.ID)
				require.ErrorIs(t, err, errs.ErrNotFound)
				require.ErrorIs(t, probe.Read(ctx, region(t, r), 0, make([]byte, 8)), rdma.ErrLeaseExpired)
			}
		})
	}
}

// stallingProxy relays one connection to a data plane and, once told to
// stall, holds the data plane's bytes from the next that arrive until told
// to resume: a client that stops reading its answers.
type stallingProxy struct {
	addr    string
	stalls  atomic.Bool
	stalled chan struct{} // closed once it holds bytes
	resumed chan struct{}
	once    sync.Once
}

func newStallingProxy(t *testing.T, to string) *stallingProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	px := &stallingProxy{addr: l.Addr().String(), stalled: make(chan struct{}), resumed: make(chan struct{})}
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		px.resume()
		wg.Wait()
	})
	wg.Go(func() {
		down, err := l.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", to)
		mu.Lock()
		conns = append(conns, down)
		if err == nil {
			conns = append(conns, up)
		}
		mu.Unlock()
		if err != nil {
			down.Close()
			return
		}
		// A small receive buffer keeps the data plane's answer in its own
		// socket rather than here.
		up.(*net.TCPConn).SetReadBuffer(256 << 10)
		wg.Go(func() { io.Copy(up, down) })
		buf := make([]byte, 32<<10)
		for {
			k, err := up.Read(buf)
			if k > 0 && px.stalls.CompareAndSwap(true, false) {
				close(px.stalled)
				<-px.resumed
			}
			if k > 0 {
				if _, err := down.Write(buf[:k]); err != nil {
					return
				}
			}
			if err != nil {
				down.Close()
				return
			}
		}
	})
	return px
}

// stall holds the data plane's next bytes and all after them.
func (px *stallingProxy) stall() { px.stalls.Store(true) }

// resume relays what the proxy holds and all that follows.
func (px *stallingProxy) resume() { px.once.Do(func() { close(px.resumed) }) }

// TestUndoneAllocRevokeOutsideLock: an rdma allocation whose commit the
// store refuses is undone, and the data plane revokes its export, which
// waits until no operation touches the segment's memory, without p.mu
// held: another client's Alloc goes on meanwhile, and is given other
// memory than the undone segment's, which is free again only after the
// revoke.
func TestUndoneAllocRevokeOutsideLock(t *testing.T) {
	cfg := testConfig(t)
	cfg.ExportSize = 16 * size.MiB
	cfg.DataListen = "127.0.0.1:0"
	revoking, resume := make(chan uint64, 1), make(chan struct{})
	cfg.sim.revoking = func(seg uint64) {
		revoking <- seg
		<-resume
	}
	p, _ := servingPool(t, cfg)
	ctx := t.Context()
	a, b := sessionCaller(t, p, "s-a", "a", 1, 0), sessionCaller(t, p, "s-b", "b", 1, 0)
	free := func() int64 {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, d := range p.devs {
			if d.tier == poolv1.Tier_TIER_RDMA {
				return d.ext.Stats().Free
			}
		}
		t.Fatal("no rdma device")
		return 0
	}
	// The first allocation reserves a block of ids, a commit of its own.
	_, err := p.Alloc(ctx, b, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL})
	require.NoError(t, err)
	before := free()
	var refused atomic.Bool
	for _, f := range p.st.files() {
		f.mu.Lock()
		f.inject = func(removal bool) error {
			if !removal && refused.CompareAndSwap(false, true) {
				return errors.New("injected: the disk refused the write")
			}
			return nil
		}
		f.mu.Unlock()
	}
	const n = 1 << 20
	failed := make(chan error, 1)
	go func() {
		_, err := p.Alloc(ctx, a, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA})
		failed <- err
	}()
	select {
	case <-revoking:
	case err := <-failed:
		t.Fatalf("the allocation ended (err %v) before its export was revoked", err)
	}
	resumed := false
	defer func() {
		if !resumed {
			close(resume)
		}
	}()
	require.Eventually(t, func() bool {
		if !p.mu.TryLock() {
			return false
		}
		p.mu.Unlock()
		return true
	}, 10*time.Second, time.Millisecond, "p.mu is held while the undone allocation's export is revoked")
	r2, err := p.Alloc(ctx, b, allocRequest{Size: n, Tier: poolv1.Tier_TIER_RDMA})
	require.NoError(t, err, "another client's Alloc while the revoke waits")
	require.Equal(t, before-2*r2.Extent, free(), "the undone segment's extent stays taken until its export is revoked")
	close(resume)
	resumed = true
	require.ErrorContains(t, <-failed, "injected")
	require.Equal(t, before-r2.Extent, free(), "the undone segment's extent is free once its export is revoked")
}

// TestFailedFreeKeepsItsName: a free commits its removal outside p.mu, and
// an allocation of the same name during it is refused (the name is still
// the segment's), so a removal that fails puts the segment back under its
// name rather than over another segment that took it meanwhile (which the
// name would then no longer find, and a restart would find two of).
func TestFailedFreeKeepsItsName(t *testing.T) {
	p, _ := servingPool(t, testConfig(t))
	ctx := t.Context()
	a, b := sessionCaller(t, p, "s-a", "a", 1, 1000), sessionCaller(t, p, "s-b", "b", 1, 1000)
	old, err := p.Alloc(ctx, a, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "X"})
	require.NoError(t, err)
	var during error
	f := p.st.storeFile
	f.mu.Lock()
	f.inject = func(removal bool) error {
		if !removal {
			return nil
		}
		f.inject = nil // under f.mu
		_, during = p.Alloc(ctx, b, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL, Name: "X"})
		return errors.New("injected: the disk refused the removal")
	}
	f.mu.Unlock()
	require.Error(t, p.Free(a, old.ID, ""))
	require.ErrorIs(t, during, errs.ErrExists, "the name is the freeing segment's until its removal commits")
	named := func() uint64 {
		p.mu.Lock()
		defer p.mu.Unlock()
		r, err := p.lookup(0, "X")
		require.NoError(t, err)
		return r.ID
	}
	require.Equal(t, old.ID, named(), "the segment whose free failed keeps its name")
	require.NoError(t, p.Free(a, old.ID, ""))
	fresh, err := p.Alloc(ctx, b, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_LOCAL, Name: "X"})
	require.NoError(t, err, "a committed free gives the name up")
	require.Equal(t, fresh.ID, named())
}

// sessionCaller opens session sid of client id client (named the same)
// for process pid of user uid and returns its caller.
func sessionCaller(t testing.TB, p *core, sid, client string, pid int64, uid uint32) caller {
	t.Helper()
	p.openSession(sid, client, "", client, pid, uid)
	c, err := p.callerFor(sid)
	require.NoError(t, err)
	return c
}

// identCaller binds client id id to identity ident and opens a session of
// it (process 2 of uid 1000) whose caller proved ident.
func identCaller(t testing.TB, p *core, id, ident string) caller {
	t.Helper()
	require.NoError(t, p.auth.bind(id, ident))
	c := sessionCaller(t, p, "s-"+id, id, 2, 1000)
	c.ident = ident
	return c
}
