package pool

import (
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
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
