package pool

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// TestReplicaHome: the home side of Replicate on a real data plane. A copy
// peer x placed here for its client app is made a backup: the epoch is
// raised (the old one refused), x and the writer node w may write it, app
// only read it; a stale epoch and another peer are refused. A copy whose
// writes were forwarded holds them after a restart (writes answer MOVED,
// x still reads) until x sets its forwarding again.
func TestReplicaHome(t *testing.T) {
	p, _ := newServingPool(t)
	cfg := p.cfg
	ctx := t.Context()
	x, y := sessionCaller(t, p, "s-poold/x", "poold/x", 1, 0), sessionCaller(t, p, "s-poold/y", "poold/y", 1, 0)
	r, err := p.Alloc(ctx, x, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: "app"})
	require.NoError(t, err)
	dial := func(p *core, principal string) *tcp.Client {
		c, err := tcp.Dial(ctx, p.dp.addr, tcp.WithCredential(p.auth.issue("s-"+principal, principal, principal)))
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	owner, writer, app := dial(p, "poold/x"), dial(p, "poold/w"), dial(p, delegatedPrincipal("poold/x", "app"))

	_, err = p.replicateHere(ctx, y, &poolv1.ReplicateRequest{HomeId: r.ID, Epoch: 2}, moveTLS{})
	require.ErrorIs(t, err, errs.ErrAccessDenied, "another peer's copy")
	resp, err := p.replicateHere(ctx, x, &poolv1.ReplicateRequest{HomeId: r.ID, Epoch: 2, Writers: []string{"w"}, ClientsReadOnly: true}, moveTLS{})
	require.NoError(t, err)
	require.Equal(t, uint64(2), resp.Epoch)
	_, err = p.replicateHere(ctx, x, &poolv1.ReplicateRequest{HomeId: r.ID, Epoch: 1}, moveTLS{})
	require.ErrorIs(t, err, errs.ErrInvalid, "a stale epoch")

	reg := rdma.Region{Segment: r.ID, Key: r.Key, Epoch: 2}
	require.ErrorIs(t, owner.Write(ctx, rdma.Region{Segment: r.ID, Key: r.Key, Epoch: 1}, 0, []byte("old")), rdma.ErrLeaseExpired, "the old epoch is fenced")
	require.NoError(t, writer.Write(ctx, reg, 0, []byte("from the primary")))
	require.NoError(t, owner.Write(ctx, reg, 100, []byte("from the origin")))
	require.ErrorIs(t, app.Write(ctx, reg, 0, []byte("x")), rdma.ErrAccessDenied, "the client only reads a backup")
	got := make([]byte, 16)
	require.NoError(t, app.Read(ctx, reg, 0, got))
	require.Equal(t, "from the primary", string(got))
	rec, err := p.Stat(r.ID)
	require.NoError(t, err)
	require.Equal(t, []string{"w"}, rec.Writers)
	require.True(t, rec.ReadOnly)

	// As a primary that forwarded when this daemon stopped.
	_, err = p.updateRecord(r.ID, func(r *record) error { r.Forwards, r.ReadOnly, r.Writers = true, false, nil; return nil })
	require.NoError(t, err)
	require.NoError(t, p.close())
	p, _ = servingPool(t, cfg)
	x = sessionCaller(t, p, "s-poold/x", "poold/x", 1, 0)
	owner, app = dial(p, "poold/x"), dial(p, delegatedPrincipal("poold/x", "app"))
	require.ErrorIs(t, app.Write(ctx, reg, 0, []byte("x")), rdma.ErrMoved, "writes wait for the forwarding")
	require.NoError(t, owner.Read(ctx, reg, 0, got), "the origin reads")
	_, err = p.replicateHere(ctx, x, &poolv1.ReplicateRequest{HomeId: r.ID, Epoch: 2}, moveTLS{})
	require.NoError(t, err)
	require.NoError(t, app.Write(ctx, reg, 0, []byte("x")), "writes go on once the origin set the forwarding")
	rec, err = p.Stat(r.ID)
	require.NoError(t, err)
	require.False(t, rec.Forwards, "no targets: nothing forwarded")
}

// TestReplicaWhileMoving: a copy whose writes a MoveOut tracks and seals
// (a rebuild's or a home move's survivor, or a leaving home) takes
// Replicate: the origin sets the homes' forwarding and raises epochs while
// the writers are sealed (switchOK, finishHomeMove), and a leaving home
// forwards until it is let go. Once let go (COMMIT) it is not found.
func TestReplicaWhileMoving(t *testing.T) {
	p, _ := newServingPool(t)
	ctx := t.Context()
	x := peerCaller(t, p, "x", 1)
	r, err := p.Alloc(ctx, x, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: "app"})
	require.NoError(t, err)
	for _, phase := range []poolv1.MoveOutPhase{poolv1.MoveOutPhase_MOVE_OUT_TRACK, poolv1.MoveOutPhase_MOVE_OUT_SEAL} {
		_, err = p.moveOut(ctx, x, &poolv1.MoveOutRequest{HomeId: r.ID, Phase: phase, Chunk: 4096}, moveTLS{})
		require.NoError(t, err, "%s", phase)
	}
	resp, err := p.replicateHere(ctx, x, &poolv1.ReplicateRequest{HomeId: r.ID, Epoch: 2, Writers: []string{"w"}, ClientsReadOnly: true}, moveTLS{})
	require.NoError(t, err, "a sealed, tracked copy")
	require.Equal(t, uint64(2), resp.Epoch)
	rec, err := p.Stat(r.ID)
	require.NoError(t, err)
	require.True(t, rec.Sealed, "Replicate leaves the seal to the move")
	require.Equal(t, []string{"w"}, rec.Writers)

	_, err = p.moveOut(ctx, x, &poolv1.MoveOutRequest{HomeId: r.ID, Phase: poolv1.MoveOutPhase_MOVE_OUT_COMMIT}, moveTLS{})
	require.NoError(t, err)
	_, err = p.replicateHere(ctx, x, &poolv1.ReplicateRequest{HomeId: r.ID, Epoch: 3}, moveTLS{})
	require.ErrorIs(t, err, errs.ErrNotFound, "a copy let go")
}

// TestReplicaFreedWhileForwardingSet: a Free of a copy that races a
// Replicate setting its forwarding: the Replicate found the copy in the
// table and set the forwarding on the data plane, and the Free unlinks
// the copy and fences it before the Replicate records the forwarding's
// connections. The fence stops the forwarding the Replicate set (it waits
// for it), so no forwarding or connection of the freed copy is left.
func TestReplicaFreedWhileForwardingSet(t *testing.T) {
	cfg := testConfig(t)
	cfg.ExportSize = 16 * size.MiB
	cfg.DataListen = "127.0.0.1:0"
	set, resume := make(chan uint64, 1), make(chan struct{})
	cfg.sim.forwarding = func(seg uint64) {
		set <- seg
		<-resume
	}
	p, _ := servingPool(t, cfg)
	ctx := t.Context()
	x := peerCaller(t, p, "x", 1)
	r, err := p.Alloc(ctx, x, allocRequest{Size: 4096, Tier: poolv1.Tier_TIER_RDMA, HomeOnly: true, ForClient: "app"})
	require.NoError(t, err)

	replicated := make(chan error, 1)
	go func() {
		// A lost target: the forwarding has a target and no connection to dial.
		_, err := p.replicateHere(ctx, x, &poolv1.ReplicateRequest{HomeId: r.ID, Epoch: 2,
			Targets: []*poolv1.SegmentHome{{State: poolv1.HomeState_HOME_STATE_LOST}}}, moveTLS{})
		replicated <- err
	}()
	<-set
	resumed := false
	defer func() {
		if !resumed {
			close(resume)
		}
	}()
	freed := make(chan error, 1)
	go func() { freed <- p.Free(x, r.ID, "") }()
	// The Free either ends (nothing holds it up) or waits in its fence
	// for the Replicate; either way it has unlinked the copy.
	var freeErr error
	ended := false
	require.Eventually(t, func() bool {
		select {
		case freeErr = <-freed:
			ended = true
			return true
		default:
			return waitsOnLock("pool.(*core).stopForwarding")
		}
	}, 10*time.Second, time.Millisecond, "the Free neither ends nor waits for the Replicate")
	close(resume)
	resumed = true
	require.NoError(t, <-replicated)
	if !ended {
		freeErr = <-freed
	}
	require.NoError(t, freeErr)
	_, err = p.Stat(r.ID)
	require.ErrorIs(t, err, errs.ErrNotFound)
	p.fwd.mu.Lock()
	defer p.fwd.mu.Unlock()
	require.NotContains(t, p.fwd.conns, r.ID, "the freed copy's forwarding is stopped")
}

// waitsOnLock reports whether a goroutine waits for a sync.Mutex in fn.
func waitsOnLock(fn string) bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "[sync.Mutex.Lock") && strings.Contains(g, fn+"(") {
			return true
		}
	}
	return false
}
