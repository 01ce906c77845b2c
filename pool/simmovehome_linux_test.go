package pool

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
)

// TestMoveHomeSim: on 8 simulated hosts, a replicas=2 and an ec=4+2
// segment are written; a host of a copy (the primary when it holds a
// shard too) and of a shard evacuates, and the origin crashes (cut off, then stopped)
// while it moves one of those homes, with the move's intent in its store.
// Until then the leaving home is described as moving, with the bytes
// copied, and the evacuation counts its bytes as left. Restarted, the
// origin finishes the move if it had switched and undoes it otherwise; the evacuation asks again and both homes move: the
// evacuated host holds nothing of the origin's, every home of both
// segments is OK elsewhere and holds the bytes written, and the origin
// keeps no intent.
func TestMoveHomeSim(t *testing.T) {
	// 8 hosts: the origin, which drains, the six of the coded segment,
	// and one more for the shard that leaves.
	// The moves go at the rebuilds' rate, 1 MiB/s here: the crash comes
	// well within the copy's move.
	rs := newRedundantSim(t, 8, 4<<20, func(oh *simHost) { oh.cfg.RebuildRate = 1 << 20 })
	sc, oh := rs.sc, rs.oh
	// The evacuated host holds a copy, the primary when it can, and a
	// shard: of the 7 lenders, 6 hold shards.
	xi := 0
	if !rs.ec.homedOn(rs.rep.Homes[0].Node) {
		xi = 1
	}
	x := sc.host(rs.rep.Homes[xi].Node)
	require.True(t, rs.ec.homedOn(x.name), "the evacuated host holds a shard too")

	conn, err := session.Channel("unix", x.cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	_, err = poolv1.NewPoolClient(conn).Drain(ctx, &poolv1.DrainRequest{Evacuate: true})
	cancel()
	require.NoError(t, err)

	// The origin loses power once a move of a home is under way: its
	// store as it was then (a consistent copy taken with a move intent
	// in it) is what it finds when it starts again. Its stop undid the
	// move meanwhile, as far as the homes go; the restart must cope with
	// either.
	//
	// The copy's progress changes every rebuildProgress (200 ms) and the
	// replica's 4 MiB go at 1 MiB/s, for seconds: a poll every
	// 20 ms sees it mid-way many times over, without spinning.
	origin := oh.daemon()
	snap := origin.pool.st.path + ".snapshot"
	require.Eventually(t, func() bool {
		origin.pool.moving.mu.Lock()
		mid := false
		if in := origin.pool.moving.m[rs.repID]; in != nil {
			mid = in.copied > 0 && in.copied < rs.rep.Size // the first batches copied, the rest paced
		}
		origin.pool.moving.mu.Unlock()
		if !mid {
			return false
		}
		found := false
		err := origin.pool.st.db.View(func(tx *bolt.Tx) error {
			k, _ := tx.Bucket(bucketMeta).Cursor().Seek(intentPrefix)
			if found = bytes.HasPrefix(k, intentPrefix); found {
				return tx.CopyFile(snap, 0o600)
			}
			return nil
		})
		return err == nil && found
	}, time.Minute, 20*time.Millisecond, "no move of a home began")
	// Meanwhile the segment's description shows the move (memctl
	// segments), and the evacuation counts the home's bytes as left.
	seg := origin.segmentProto(func() record { r, _ := origin.pool.redundantRecord(rs.repID); return r }())
	moving := seg.Homes[xi]
	require.Equal(t, x.name, moving.Node)
	require.NotEmpty(t, moving.MovingTo, "the leaving home is described as moving: %+v", moving)
	require.Positive(t, moving.RebuiltBytes)
	ev := x.daemon().pool.evac.progress()
	require.NotNil(t, ev)
	require.GreaterOrEqual(t, ev.BytesLeft, uint64(rs.rep.Size), "the moving copy's bytes are left to move: %+v", ev)
	sc.crash(oh)
	require.NoError(t, os.Rename(snap, origin.pool.st.path))
	sc.net.Heal()
	require.NoError(t, sc.start(oh))
	origin = oh.daemon()
	left, err := origin.pool.st.intents()
	require.NoError(t, err)
	require.NotEmpty(t, left, "the restarted origin finds the move's intent")
	for _, in := range left {
		t.Logf("the restarted origin finds the move of segment %d's home on %s to %s (switched %v)", in.ID, in.From, in.To, in.Switched)
	}

	// The evacuation ends with both homes moved.
	xd := x.daemon()
	require.Eventually(t, func() bool {
		items, _, _ := xd.pool.peerHeld()
		return len(items) == 0
	}, time.Minute, 20*time.Millisecond, "%s still holds homes of the origin's", x.name)
	require.Eventually(t, func() bool {
		ins, err := origin.pool.st.intents()
		return err == nil && len(ins) == 0
	}, time.Minute, 20*time.Millisecond, "the origin keeps a move intent")
	rs.checkHomes(t, []string{x.name})
	rep, _ := origin.pool.redundantRecord(rs.repID)
	require.NotEqual(t, rs.rep.Homes[xi].Node, rep.Homes[xi].Node, "the copy's role went with its move")
	require.Equal(t, rs.rep.Homes[1-xi].Node, rep.Homes[1-xi].Node, "the other copy stayed")
	t.Logf("copies %s -> %s, shards %s -> %s", homesString(rs.rep.Homes), homesString(rep.Homes), homesString(rs.ec.Homes), func() string {
		ec, _ := origin.pool.redundantRecord(rs.ecID)
		return fmt.Sprint(homesString(ec.Homes))
	}())
}

// TestMoveHomeLateSealAfterAbort: on 4 simulated hosts, the origin moves
// the backup of a replicas=2 segment (as an evacuation of its host asks)
// and the primary's SEAL, which pushes the fill's last changes itself, is
// lost: the move is undone, and the copy it filled is kept (its Free
// refused). A second move's fill starts; at its first PUSH of changed
// chunks, a write at the primary is acknowledged, then the lost SEAL
// arrives there after all: it is refused (errMoveAborted), so it neither
// takes the second fill's changed chunks to the undone copy nor seals the
// primary. The second move succeeds, and every home of the segment holds
// the write.
func TestMoveHomeLateSealAfterAbort(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 4, leaseTTL: 10 * time.Second})
	oh := sc.hosts[3]
	const (
		loseSeal = iota + 1 // the first fill's SEAL is refused
		runLate             // the second fill's first PUSH of changes runs it first
	)
	var (
		mu       sync.Mutex
		stage    int
		sealBy   caller
		sealReq  *poolv1.MoveOutRequest
		write    func() error // the write at the primary before the late SEAL
		sealErr  = make(chan error, 1)
		writeErr = make(chan error, 1)
		keepCopy atomic.Bool
	)
	for _, h := range sc.hosts[:3] {
		h.cfg.sim.grpc = append(h.cfg.sim.grpc, refuseFreeWhile(&keepCopy, "the test keeps the copy of the undone move"))
		h.cfg.sim.moveOutStep = func(c caller, req *poolv1.MoveOutRequest) error {
			mu.Lock()
			switch {
			case stage == loseSeal && req.Phase == poolv1.MoveOutPhase_MOVE_OUT_SEAL && req.Target != nil:
				stage, sealBy, sealReq = 0, c, req
				mu.Unlock()
				return fmt.Errorf("the test lost the SEAL: %w", errs.ErrUnavailable)
			case stage == runLate && req.Phase == poolv1.MoveOutPhase_MOVE_OUT_PUSH && !req.All:
				stage = 0
				mu.Unlock()
				writeErr <- write()
				d := h.daemon()
				_, err := d.pool.moveOut(context.Background(), sealBy, sealReq, d.moveTLS())
				sealErr <- err
				return nil
			}
			mu.Unlock()
			return nil
		}
	}
	sc.startDrainedOrigin(t, oh)
	ctx, origin := t.Context(), oh.daemon()
	conn, err := session.Dial(ctx, "unix", oh.cfg.Socket, session.Options{ClientID: "app"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	cctx, _, err := conn.Call(ctx)
	require.NoError(t, err)
	const size = 1 << 20
	seg, err := conn.API().Alloc(cctx, &poolv1.AllocRequest{Size: size, Tier: poolv1.Tier_TIER_RDMA, Redundancy: &poolv1.Redundancy{Replicas: 2}})
	require.NoError(t, err)
	r, ok := origin.pool.redundantRecord(seg.Id)
	require.True(t, ok)
	want := bytes.Repeat([]byte{0xa5}, size)
	primary := homeConn(t, origin, r.Homes[0])
	require.NoError(t, primary.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(r.Homes[0]), Buf: want}))
	after := bytes.Repeat([]byte{0x5a}, 4096)
	write = func() error {
		return primary.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(r.Homes[0]), Offset: 8192, Buf: after})
	}
	leaving := r.Homes[1]
	moveBackup := func() error {
		_, err := origin.pool.move(ctx, caller{client: &client{id: peerClientPrefix + leaving.Node}},
			&poolv1.MoveRequest{Home: leaving.Node, HomeId: leaving.HomeID}, origin.moveTLS(), origin.moveClients())
		return err
	}

	mu.Lock()
	stage = loseSeal
	mu.Unlock()
	keepCopy.Store(true)
	require.Error(t, moveBackup(), "the first move failed: its SEAL was lost")
	mu.Lock()
	require.NotNil(t, sealReq, "the test lost the first fill's SEAL")
	stage = runLate
	mu.Unlock()
	require.Eventually(t, func() bool {
		ins, err := origin.pool.st.intents()
		return err == nil && len(ins) == 0
	}, 30*time.Second, 50*time.Millisecond, "the first move is undone")

	require.NoError(t, moveBackup(), "the second move")
	select {
	case err := <-writeErr:
		require.NoError(t, err, "the write at the primary before the late SEAL")
	default:
		t.Fatal("the second move's fill sent no PUSH of changes")
	}
	copy(want[8192:], after)
	keepCopy.Store(false)
	r, ok = origin.pool.redundantRecord(seg.Id)
	require.True(t, ok)
	require.NotEqual(t, leaving.Node, r.Homes[1].Node, "the backup moved")
	for i, h := range r.Homes {
		require.Equal(t, poolv1.HomeState_HOME_STATE_OK, h.State, "home %d on %s", i, h.Node)
		require.True(t, bytes.Equal(want, homeBytes(ctx, t, origin, h, size)), "home %d on %s holds every acknowledged write", i, h.Node)
	}
	require.ErrorIs(t, <-sealErr, errMoveAborted, "the late SEAL of the undone fill is refused")
}
