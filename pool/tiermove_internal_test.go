package pool

import (
	"fmt"
	"maps"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/extent"
	"github.com/farmem/farmem/internal/testfs"
	"github.com/farmem/farmem/rdma"
)

// TestSwitchMoveVolatile: a segment demoted from this host's volatile
// memory keeps its record in the volatile file; the switch-over of its
// move within the rdma tier commits the record there and the intent,
// switched, in segments.db, and a restarted daemon takes the move up as
// switched.
func TestSwitchMoveVolatile(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	r := &record{ID: 9, Tier: poolv1.Tier_TIER_RDMA, Device: "peer", Size: 4096, Owner: "app", Epoch: 1,
		Key: rdma.Key{1}, Home: "b", HomeID: 90, DataAddr: "127.0.0.1:1", Volatile: true}
	require.NoError(t, p.st.put(r))
	in := intent{ID: 9, From: "b", FromID: 90, To: "c", ToID: 900}
	require.NoError(t, p.st.putIntent(in))
	next := *r
	next.Home, next.HomeID, next.Key = "c", 900, rdma.Key{2}
	require.NoError(t, p.st.switchMove(&next, in)())
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	defer p.close()
	in.Switched = true
	require.Equal(t, []intent{in}, p.leftMoves)
	rec, err := p.Stat(9)
	require.NoError(t, err)
	require.Equal(t, "c", rec.Home)
	require.True(t, rec.Volatile, "still in the volatile file")
}

// TestMappers: who maps a load/store segment, as a demotion counts them:
// each client handed its descriptor until it lets go, while it holds a
// session or its lease runs; no descriptor is handed out while the
// segment moves; and after a restart its owner and attachers, presumed to
// map it until they let go or one lease has passed without them.
func TestMappers(t *testing.T) {
	cfg := testConfig(t)
	p := newTestPool(t, cfg)
	p.openSession("s-app", "app", "", "app", 1, 0)
	p.openSession("s-reader", "reader", "", "reader", 2, 0)
	// Two clients of one identity: the reader may attach what app made.
	app, reader := caller{client: p.clients["app"], ident: "cn:app"}, caller{client: p.clients["reader"], ident: "cn:app"}
	r, err := p.Alloc(t.Context(), app, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "mapped"})
	require.NoError(t, err)
	_, err = p.Attach(reader, "mapped")
	require.NoError(t, err)
	for _, c := range []caller{app, reader} {
		b, err := p.Backing(c, r.ID)
		require.NoError(t, err)
		b.File.Close()
	}
	mappers := func(except caller) []string {
		p.mu.Lock()
		defer p.mu.Unlock()
		var ids []string
		for _, m := range p.mappersOf(r.ID, except) {
			ids = append(ids, m.client)
		}
		return ids
	}
	require.Equal(t, []string{"reader"}, mappers(app))
	require.Equal(t, []string{"app", "reader"}, mappers(admin()))

	require.True(t, p.moving.begin(r.ID))
	_, err = p.Backing(reader, r.ID)
	require.ErrorIs(t, err, errs.ErrLimit, "no descriptor while it moves")
	p.moving.end(r.ID)

	p.Unmapped(reader, r.ID)
	require.Empty(t, mappers(app), "the reader let go")
	p.closeSession("s-app")
	p.closeSession("s-reader")
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	defer p.close()
	require.Equal(t, []string{"app", "reader"}, mappers(admin()), "presumed after a restart")
	p.Unmapped(caller{client: &client{id: "reader"}}, r.ID)
	require.Equal(t, []string{"app"}, mappers(admin()))
	start := p.started
	p.now = func() time.Time { return start.Add(cfg.LeaseTTL + restartGrace + time.Second) }
	p.reap()
	require.Empty(t, mappers(admin()), "the owner stayed away past its lease")
}

// TestMapperOutlivesLease: a process that mapped a named segment and was
// stopped past its client's lease still maps it, and would write memory
// the segment left: a demotion is refused, naming its pid, until the
// process ends; then the reap forgets it and the demotion goes ahead (here
// to fail for want of peers). A pid that a later process took does not
// count for the one that mapped.
func TestMapperOutlivesLease(t *testing.T) {
	cfg, p, now := clockedPool(t)
	*now = p.started.Add(cfg.LeaseTTL + restartGrace + time.Second) // past the restart's grace
	proc := exec.Command("sleep", "600")
	require.NoError(t, proc.Start())
	t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })
	app := sessionCaller(t, p, "s1", "app", int64(proc.Process.Pid), 0)
	app.pid = int32(proc.Process.Pid)
	r, err := p.Alloc(t.Context(), app, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "kv"})
	require.NoError(t, err)
	b, err := p.Backing(app, r.ID)
	require.NoError(t, err)
	b.File.Close()
	demote := func() error {
		require.True(t, p.moving.begin(r.ID))
		_, err := p.demote(t.Context(), admin(), *r, &poolv1.MoveRequest{}, moveTLS{})
		return err
	}
	require.ErrorIs(t, demote(), errs.ErrInUse, "refused while app maps it")

	require.NoError(t, proc.Process.Signal(syscall.SIGSTOP))
	p.closeSession("s1")
	*now = now.Add(cfg.LeaseTTL)
	p.reap()
	p.mu.Lock()
	require.Nil(t, p.clients["app"], "the lease ran out")
	p.mu.Unlock()
	err = demote()
	require.ErrorIs(t, err, errs.ErrInUse, "the stopped process still maps it")
	require.Contains(t, err.Error(), fmt.Sprintf("pid %d: the client's lease ran out, but the process that mapped the segment still runs", proc.Process.Pid))

	p.mu.Lock()
	var m mapper
	for m = range p.mappers[r.ID] {
	}
	p.mu.Unlock()
	require.Equal(t, mapper{client: "app", pid: int32(proc.Process.Pid), start: m.start}, m)
	require.Equal(t, procRunning, m.state())
	m.start++
	require.Equal(t, procGone, m.state(), "another process under the same pid")

	require.NoError(t, proc.Process.Kill())
	proc.Wait()
	p.reap()
	p.mu.Lock()
	require.Empty(t, p.mappers[r.ID], "the reap forgets a mapper whose process ended")
	p.mu.Unlock()
	err = demote()
	require.ErrorIs(t, err, errs.ErrNoCapacity, "no mapper holds it back: it fails for want of peers")
}

// TestMapperPerProcess: two processes of one client id (a restarted one
// beside one stopped) are two mappers: the one's release, or its own
// demotion, leaves the other's mapping counted while it runs.
func TestMapperPerProcess(t *testing.T) {
	cfg, p, now := clockedPool(t)
	*now = p.started.Add(cfg.LeaseTTL + restartGrace + time.Second) // past the restart's grace
	start := func() *exec.Cmd {
		proc := exec.Command("sleep", "600")
		require.NoError(t, proc.Start())
		t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })
		return proc
	}
	old, restarted := start(), start()
	first := sessionCaller(t, p, "s1", "app", int64(old.Process.Pid), 0)
	first.pid = int32(old.Process.Pid)
	r, err := p.Alloc(t.Context(), first, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_CXL, Name: "kv"})
	require.NoError(t, err)
	second := sessionCaller(t, p, "s2", "app", int64(restarted.Process.Pid), 0)
	second.pid = int32(restarted.Process.Pid)
	for _, c := range []caller{first, second} {
		b, err := p.Backing(c, r.ID)
		require.NoError(t, err)
		b.File.Close()
	}
	require.NoError(t, old.Process.Signal(syscall.SIGSTOP))
	p.closeSession("s1")
	p.Unmapped(second, r.ID)
	demote := func(c caller) error {
		require.True(t, p.moving.begin(r.ID))
		_, err := p.demote(t.Context(), c, *r, &poolv1.MoveRequest{}, moveTLS{})
		return err
	}
	for _, c := range []caller{admin(), second} {
		err := demote(c)
		require.ErrorIs(t, err, errs.ErrInUse, "the stopped process still maps it")
		require.Contains(t, err.Error(), fmt.Sprintf("pid %d, which still runs beside the process holding the client's session", old.Process.Pid))
	}
	require.NoError(t, old.Process.Kill())
	old.Wait()
	require.ErrorIs(t, demote(second), errs.ErrNoCapacity, "no mapper holds it back: it fails for want of peers")
}

// TestReapHoldsMappedDevdaxExtent: a devdax segment (one descriptor for the
// whole device) freed while a process still maps it keeps its extent out
// of the allocator, so the next segment does not get the memory that
// process would write when it goes on: reclaimed when its client's lease
// ran out while the process is stopped (also across the device going away
// and coming back); freed by a caller of the same client id whose process
// the daemon cannot see; a named one freed by its owner while another
// client (its process unknown) maps it, until that client's lease ends.
// Once none maps it, the reap gives the extent back.
func TestReapHoldsMappedDevdaxExtent(t *testing.T) {
	cfg := testConfig(t)
	cfg.SysfsRoot = "../cxl/testdata/devdax"
	cfg.DevRoot = t.TempDir()
	cfg.AllowDevdaxFD = true
	testfs.DevdaxStandIns(t, cfg.SysfsRoot, cfg.DevRoot)
	p := newTestPool(t, cfg)
	t.Cleanup(func() { p.close() })
	now := p.started.Add(cfg.LeaseTTL + restartGrace + time.Second) // past the restart's grace
	p.now = func() time.Time { return now }
	ctx := t.Context()
	stopped := func() (*exec.Cmd, int32) {
		proc := exec.Command("sleep", "600")
		require.NoError(t, proc.Start())
		t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })
		require.NoError(t, proc.Process.Signal(syscall.SIGSTOP))
		return proc, int32(proc.Process.Pid)
	}
	mapIn := func(c caller, id uint64) {
		b, err := p.Backing(c, id)
		require.NoError(t, err)
		b.File.Close()
	}
	var free func() int64
	overlap := func(a, b *record) bool {
		return a.Device == b.Device && a.Offset < b.Offset+b.Extent && b.Offset < a.Offset+a.Extent
	}
	persist := func() *record {
		r, err := p.Alloc(ctx, admin(), allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Persist: true})
		require.NoError(t, err)
		return r
	}

	// mappedByStopped opens a session of client in a stopped process and
	// maps an unnamed segment it allocates.
	mappedByStopped := func(sid, client string) (*exec.Cmd, caller, *record) {
		proc, pid := stopped()
		c := sessionCaller(t, p, sid, client, int64(pid), 0)
		c.pid = pid
		r, err := p.Alloc(ctx, c, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL})
		require.NoError(t, err)
		require.True(t, p.device(r.Device).SharesFD(), "devdax")
		mapIn(c, r.ID)
		return proc, c, r
	}

	t.Run("reclaimed", func(t *testing.T) {
		proc, _, r := mappedByStopped("s1", "app")
		free = func() int64 { return p.device(r.Device).ext.Stats().Free }
		before := free()
		p.closeSession("s1")
		now = now.Add(cfg.LeaseTTL)
		p.reap()
		_, err := p.Stat(r.ID)
		require.ErrorIs(t, err, errs.ErrNotFound, "reclaimed")
		require.Equal(t, before, free(), "its extent is held while the stopped process runs")

		// The device goes and comes back (a fresh allocator): still held.
		p.mu.Lock()
		d := p.device(r.Device)
		p.devs = slices.DeleteFunc(slices.Clone(p.devs), func(x *dev) bool { return x == d })
		ext, err := extent.New(d.Capacity(), d.Align())
		require.NoError(t, err)
		p.addLocked(&dev{Device: d.Device, tier: d.tier, ext: ext, usable: d.usable})
		p.mu.Unlock()
		next := persist()
		require.False(t, overlap(next, r), "the next segment does not get its memory")

		require.NoError(t, proc.Process.Kill())
		proc.Wait()
		p.reap()
		third := persist()
		require.False(t, overlap(third, next), "given back to the allocator it was held in, freeing no live extent")
		require.NoError(t, p.Free(admin(), next.ID, ""))
		require.NoError(t, p.Free(admin(), third.ID, ""))
	})

	t.Run("freed by an unseen process of the client", func(t *testing.T) {
		proc, app, r := mappedByStopped("s2", "app2")
		before := free()
		unseen := app
		unseen.pid = 0 // another pid namespace, say
		require.NoError(t, p.Free(unseen, r.ID, ""))
		require.Equal(t, before, free(), "held: the stopped process maps it")
		require.NoError(t, proc.Process.Kill())
		proc.Wait()
		p.reap()
		require.Equal(t, before+r.Extent, free())
	})

	t.Run("named, freed while another client maps it", func(t *testing.T) {
		owner := identCaller(t, p, "owner", "uid:1000")
		r, err := p.Alloc(ctx, owner, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Name: "shared-dax"})
		require.NoError(t, err)
		reader := identCaller(t, p, "reader", "uid:1000") // one identity: it may attach the owner's name
		_, err = p.Attach(reader, "shared-dax")
		require.NoError(t, err)
		mapIn(reader, r.ID) // its process unknown: its session and lease decide
		before := free()
		require.NoError(t, p.Free(owner, r.ID, ""))
		p.reap()
		require.Equal(t, before, free(), "held while the reader's session lasts")
		p.closeSession("s-reader")
		now = now.Add(cfg.LeaseTTL)
		p.reap()
		require.Equal(t, before+r.Extent, free(), "given back once its lease ended")

		// One that lets go of it after the free (Segment.Close) gives it
		// back at the next reap, its session still open.
		again, err := p.Alloc(ctx, owner, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Name: "shared-dax"})
		require.NoError(t, err)
		reader = identCaller(t, p, "reader2", "uid:1000")
		_, err = p.Attach(reader, "shared-dax")
		require.NoError(t, err)
		mapIn(reader, again.ID)
		before = free()
		require.NoError(t, p.Free(owner, again.ID, ""))
		p.reap()
		require.Equal(t, before, free(), "held while the reader maps it")
		p.Unmapped(reader, again.ID)
		p.reap()
		require.Equal(t, before+again.Extent, free(), "given back once the reader let go")
	})
}

// TestMappedDevdaxAcrossRestart: who maps a devdax segment is in the store
// before the process gets its descriptor, so a restarted daemon knows it:
// the extent of a segment freed while a stopped process maps it stays out
// of the allocator after the restart, and a live segment whose client
// never comes back, reclaimed after the restart's grace, is held while its
// stopped process runs (presumed mappers alone would have let it go). Once
// the processes end, the extents go back and their entries leave the
// store; a second restart holds nothing.
func TestMappedDevdaxAcrossRestart(t *testing.T) {
	cfg := testConfig(t)
	cfg.SysfsRoot = "../cxl/testdata/devdax"
	cfg.DevRoot = t.TempDir()
	cfg.AllowDevdaxFD = true
	testfs.DevdaxStandIns(t, cfg.SysfsRoot, cfg.DevRoot)
	ctx := t.Context()
	stopped := func() (*exec.Cmd, int32) {
		proc := exec.Command("sleep", "600")
		require.NoError(t, proc.Start())
		t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })
		require.NoError(t, proc.Process.Signal(syscall.SIGSTOP))
		return proc, int32(proc.Process.Pid)
	}
	mappedBy := func(p *core, sid, client string) (*exec.Cmd, caller, *record) {
		proc, pid := stopped()
		c := sessionCaller(t, p, sid, client, int64(pid), 0)
		c.pid = pid
		r, err := p.Alloc(ctx, c, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL})
		require.NoError(t, err)
		require.True(t, p.device(r.Device).SharesFD(), "devdax")
		b, err := p.Backing(c, r.ID)
		require.NoError(t, err)
		b.File.Close()
		return proc, c, r
	}
	// taken reports whether r's extent is out of p's allocator.
	taken := func(p *core, r *record) bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		d := p.device(r.Device)
		if err := d.ext.Reserve(r.Offset, r.Extent); err != nil {
			return true
		}
		require.NoError(t, d.ext.Free(r.Offset, r.Extent))
		return false
	}
	entries := func(p *core) []uint64 {
		es, corrupt, err := p.st.mapped()
		require.NoError(t, err)
		require.Empty(t, corrupt)
		return slices.Sorted(maps.Keys(es))
	}

	p := newTestPool(t, cfg)
	procA, app, freed := mappedBy(p, "s1", "app")
	procB, _, live := mappedBy(p, "s2", "app2")
	unseen := app
	unseen.pid = 0 // the process that frees it is not the one that maps it
	require.NoError(t, p.Free(unseen, freed.ID, ""))
	require.True(t, taken(p, freed), "held: the stopped process maps it")
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	t.Cleanup(func() { p.close() })
	require.True(t, taken(p, freed), "still held after the restart")
	require.Equal(t, []uint64{freed.ID, live.ID}, entries(p))
	now := p.started.Add(cfg.LeaseTTL + restartGrace + time.Second) // app2 never came back
	p.now = func() time.Time { return now }
	p.reap()
	_, err := p.Stat(live.ID)
	require.ErrorIs(t, err, errs.ErrNotFound, "reclaimed: its client's lease ran out")
	require.True(t, taken(p, live), "held: the stopped process that mapped it before the restart runs")
	require.True(t, taken(p, freed))

	require.NoError(t, procA.Process.Kill())
	procA.Wait()
	p.reap()
	require.False(t, taken(p, freed), "given back: its process ended")
	require.True(t, taken(p, live))
	require.Equal(t, []uint64{live.ID}, entries(p))
	require.NoError(t, procB.Process.Kill())
	procB.Wait()
	p.reap()
	require.False(t, taken(p, live))
	require.Empty(t, entries(p))
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	require.False(t, taken(p, freed))
	require.False(t, taken(p, live))
	require.Empty(t, p.held)
}
