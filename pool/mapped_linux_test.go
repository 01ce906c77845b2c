package pool

import (
	"errors"
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
)

// devdaxConfig is a test pool's configuration with the devdax fixture's
// devices (stand-in files) handed out to clients.
func devdaxConfig(t *testing.T) Config {
	cfg := testConfig(t)
	cfg.SysfsRoot = "../cxl/testdata/devdax"
	cfg.DevRoot = t.TempDir()
	cfg.AllowDevdaxFD = true
	testfs.DevdaxStandIns(t, cfg.SysfsRoot, cfg.DevRoot)
	return cfg
}

// startProcess starts a process that runs until it is killed, at cleanup
// at the latest: one that maps what it mapped while it runs.
func startProcess(t *testing.T) *exec.Cmd {
	proc := exec.Command("sleep", "600")
	require.NoError(t, proc.Start())
	t.Cleanup(func() { proc.Process.Kill(); proc.Wait() })
	return proc
}

// stoppedProcess starts a process and stops it (SIGSTOP): one that maps
// what it mapped and writes it when it goes on.
func stoppedProcess(t *testing.T) (*exec.Cmd, int32) {
	proc := startProcess(t)
	require.NoError(t, proc.Process.Signal(syscall.SIGSTOP))
	return proc, int32(proc.Process.Pid)
}

// mappedByStopped opens a session of client in a stopped process, which
// allocates a devdax segment and gets its descriptor.
func mappedByStopped(t *testing.T, p *core, sid, client string) (*exec.Cmd, caller, *record) {
	proc, pid := stoppedProcess(t)
	c := sessionCaller(t, p, sid, client, int64(pid), 0)
	c.pid = pid
	r, err := p.Alloc(t.Context(), c, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL})
	require.NoError(t, err)
	require.True(t, p.device(r.Device).SharesFD(), "devdax")
	mapIn(t, p, c, r.ID)
	return proc, c, r
}

func mapIn(t *testing.T, p *core, c caller, id uint64) {
	b, err := p.Backing(c, id)
	require.NoError(t, err)
	b.File.Close()
}

// extentTaken reports whether r's extent is out of p's allocator.
func extentTaken(t *testing.T, p *core, r *record) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	d := p.device(r.Device)
	if err := d.ext.Reserve(r.Offset, r.Extent); err != nil {
		return true
	}
	require.NoError(t, d.ext.Free(r.Offset, r.Extent))
	return false
}

// mappedEntries are the segments p's store holds an entry of who maps.
func mappedEntries(t *testing.T, p *core) []uint64 {
	es, corrupt, err := p.st.mapped()
	require.NoError(t, err)
	require.Empty(t, corrupt)
	return slices.Sorted(maps.Keys(es))
}

// crash closes p leaving its store as a kill would: what it had not
// committed of who maps its devdax segments is not written at close.
func crash(t *testing.T, p *core) {
	p.mu.Lock()
	clear(p.mapped.dirty)
	p.mu.Unlock()
	require.NoError(t, p.close())
}

// pastGrace makes p's clock read past the restart's grace, so that
// clients that did not come back lose their segments at the next reap.
func pastGrace(p *core) *time.Time {
	now := p.started.Add(p.cfg.LeaseTTL + restartGrace + time.Second)
	p.now = func() time.Time { return now }
	return &now
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
	proc := startProcess(t)
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
	old, restarted := startProcess(t), startProcess(t)
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
	cfg := devdaxConfig(t)
	p := newTestPool(t, cfg)
	t.Cleanup(func() { p.close() })
	now := pastGrace(p)
	ctx := t.Context()
	var free func() int64
	overlap := func(a, b *record) bool {
		return a.Device == b.Device && a.Offset < b.Offset+b.Extent && b.Offset < a.Offset+a.Extent
	}
	persist := func() *record {
		r, err := p.Alloc(ctx, admin(), allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Persist: true})
		require.NoError(t, err)
		return r
	}

	t.Run("reclaimed", func(t *testing.T) {
		proc, _, r := mappedByStopped(t, p, "s1", "app")
		free = func() int64 { return p.device(r.Device).ext.Stats().Free }
		before := free()
		p.closeSession("s1")
		*now = now.Add(cfg.LeaseTTL)
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
		proc, app, r := mappedByStopped(t, p, "s2", "app2")
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
		mapIn(t, p, reader, r.ID) // its process unknown: its session and lease decide
		before := free()
		require.NoError(t, p.Free(owner, r.ID, ""))
		p.reap()
		require.Equal(t, before, free(), "held while the reader's session lasts")
		p.closeSession("s-reader")
		*now = now.Add(cfg.LeaseTTL)
		p.reap()
		require.Equal(t, before+r.Extent, free(), "given back once its lease ended")

		// One that lets go of it after the free (Segment.Close) gives it
		// back at the next reap, its session still open.
		again, err := p.Alloc(ctx, owner, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Name: "shared-dax"})
		require.NoError(t, err)
		reader = identCaller(t, p, "reader2", "uid:1000")
		_, err = p.Attach(reader, "shared-dax")
		require.NoError(t, err)
		mapIn(t, p, reader, again.ID)
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
	cfg := devdaxConfig(t)
	p := newTestPool(t, cfg)
	procA, app, freed := mappedByStopped(t, p, "s1", "app")
	procB, _, live := mappedByStopped(t, p, "s2", "app2")
	unseen := app
	unseen.pid = 0 // the process that frees it is not the one that maps it
	require.NoError(t, p.Free(unseen, freed.ID, ""))
	require.True(t, extentTaken(t, p, freed), "held: the stopped process maps it")
	crash(t, p)

	p = newTestPool(t, cfg)
	t.Cleanup(func() { p.close() })
	require.True(t, extentTaken(t, p, freed), "still held after the restart")
	require.Equal(t, []uint64{freed.ID, live.ID}, mappedEntries(t, p))
	pastGrace(p) // app2 never came back
	p.reap()
	_, err := p.Stat(live.ID)
	require.ErrorIs(t, err, errs.ErrNotFound, "reclaimed: its client's lease ran out")
	require.True(t, extentTaken(t, p, live), "held: the stopped process that mapped it before the restart runs")
	require.True(t, extentTaken(t, p, freed))

	require.NoError(t, procA.Process.Kill())
	procA.Wait()
	p.reap()
	require.False(t, extentTaken(t, p, freed), "given back: its process ended")
	require.True(t, extentTaken(t, p, live))
	require.Equal(t, []uint64{live.ID}, mappedEntries(t, p))
	require.NoError(t, procB.Process.Kill())
	procB.Wait()
	p.reap()
	require.False(t, extentTaken(t, p, live))
	require.Empty(t, mappedEntries(t, p))
	require.NoError(t, p.close())

	p = newTestPool(t, cfg)
	require.False(t, extentTaken(t, p, freed))
	require.False(t, extentTaken(t, p, live))
	require.Empty(t, p.held)
}

// TestMappedDevdaxCommitBeforeDescriptor: a process gets a devdax
// segment's descriptor only once its entry is committed, also on a second
// call while the first one's commit is on its way, and when that commit
// fails: the second call waits, and its own commit writes the entry. A
// restart right after (no sweep in between) holds the segment once it is
// reclaimed, its stopped process running.
func TestMappedDevdaxCommitBeforeDescriptor(t *testing.T) {
	cfg := devdaxConfig(t)
	p := newTestPool(t, cfg)
	_, pid := stoppedProcess(t)
	c := sessionCaller(t, p, "s1", "app", int64(pid), 0)
	c.pid = pid
	r, err := p.Alloc(t.Context(), c, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL})
	require.NoError(t, err)

	entered, release := make(chan struct{}), make(chan struct{})
	first := true
	p.st.volatile.mu.Lock()
	p.st.volatile.inject = func(bool) error {
		if !first {
			return nil
		}
		first = false
		close(entered)
		<-release
		return errors.New("injected: the disk refuses the write")
	}
	p.st.volatile.mu.Unlock()
	backing := func() chan error {
		done := make(chan error, 1)
		go func() {
			b, err := p.Backing(c, r.ID)
			if err == nil {
				b.File.Close()
			}
			done <- err
		}()
		return done
	}
	firstDone := backing()
	<-entered
	secondDone := backing()
	select {
	case err := <-secondDone:
		t.Fatalf("the second call got the descriptor (err %v) while the entry's commit was on its way", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	require.Error(t, <-firstDone, "its commit failed")
	require.NoError(t, <-secondDone)
	require.Equal(t, []uint64{r.ID}, mappedEntries(t, p))
	crash(t, p)

	p = newTestPool(t, cfg)
	t.Cleanup(func() { p.close() })
	pastGrace(p)
	p.reap()
	_, err = p.Stat(r.ID)
	require.ErrorIs(t, err, errs.ErrNotFound, "reclaimed")
	require.True(t, extentTaken(t, p, r), "held: the stopped process that got the descriptor maps it")
}

// TestMappedDevdaxFreeCommitted: a free writes what it changes in who maps
// the segment before it answers, so a restart right after it neither
// holds the memory of a segment its own process freed (for as long as
// that process runs) nor forgets the hold of one another client (its
// process unknown) still maps.
func TestMappedDevdaxFreeCommitted(t *testing.T) {
	cfg := devdaxConfig(t)
	p := newTestPool(t, cfg)
	_, own, mine := mappedByStopped(t, p, "s1", "app")
	owner := identCaller(t, p, "owner", "uid:1000")
	named, err := p.Alloc(t.Context(), owner, allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Name: "shared-dax"})
	require.NoError(t, err)
	reader := identCaller(t, p, "reader", "uid:1000")
	_, err = p.Attach(reader, "shared-dax")
	require.NoError(t, err)
	mapIn(t, p, reader, named.ID) // its process unknown

	require.NoError(t, p.Free(own, mine.ID, ""))
	require.False(t, extentTaken(t, p, mine), "not held: its own process freed it")
	require.NoError(t, p.Free(owner, named.ID, ""))
	require.True(t, extentTaken(t, p, named), "held while the reader's session lasts")
	require.Equal(t, []uint64{named.ID}, mappedEntries(t, p))
	crash(t, p)

	p = newTestPool(t, cfg)
	t.Cleanup(func() { p.close() })
	require.False(t, extentTaken(t, p, mine), "its process let go of it before it freed it")
	require.True(t, extentTaken(t, p, named), "held across the restart, for the restart's grace")
}

// TestMappedDevdaxEntriesGo: the entry of a segment whose device was
// absent when the daemon started goes once the segment is freed and its
// processes end; a Backing of a segment on another device commits
// nothing to the store.
func TestMappedDevdaxEntriesGo(t *testing.T) {
	cfg := devdaxConfig(t)
	p := newTestPool(t, cfg)
	proc, _, r := mappedByStopped(t, p, "s1", "app")
	crash(t, p)

	plain := cfg
	plain.SysfsRoot = "../cxl/testdata/plain"
	p = newTestPool(t, plain)
	t.Cleanup(func() { p.close() })
	st, err := p.Stat(r.ID)
	require.NoError(t, err)
	require.True(t, st.Lost, "its device is absent")
	require.NoError(t, p.Free(admin(), r.ID, ""))
	require.NoError(t, proc.Process.Kill())
	proc.Wait()
	p.reap()
	require.Empty(t, mappedEntries(t, p))

	local, err := p.Alloc(t.Context(), admin(), allocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_LOCAL, Persist: true})
	require.NoError(t, err)
	commits := p.st.volatile.commits.Load()
	mapIn(t, p, admin(), local.ID)
	require.Equal(t, commits, p.st.volatile.commits.Load(), "a segment of a device that is not devdax")
}
