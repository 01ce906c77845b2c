package pool

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// lostBackupSim is a replicas=2 segment whose backup is lost (its host
// crashed; no rebuild here; newMoveHomeSim keeps it) and whose primary
// holds want, on a 4-host cluster whose origin (hosts[3], no seed: a restarted seed would join
// only itself) drains: a move of the primary goes to the one host left.
type lostBackupSim struct {
	sc   *simCluster
	oh   *simHost
	r    record // the segment as placed
	want []byte
	// joined runs, once armed, at the host the switch's Replicate of the
	// new copy reaches (ReplicateRequest.joined), before that host takes
	// it; an error answers the Replicate instead.
	joined atomic.Pointer[func(h *simHost, req *poolv1.ReplicateRequest) error]
	// stop: the origin's newHomeLost hook stops the move's finish there;
	// stopped is signalled each time it does.
	stop    atomic.Bool
	stopped chan uint64
}

func newLostBackupSim(t *testing.T) *lostBackupSim {
	ls := newMoveHomeSim(t, 4, "replicas=2")
	ls.sc.crash(ls.sc.host(ls.r.Homes[1].Node))
	require.Eventually(t, func() bool { return ls.state(t).Homes[1].State == poolv1.HomeState_HOME_STATE_LOST }, time.Minute, 10*time.Millisecond,
		"the backup is not marked lost: %s", homesString(ls.state(t).Homes))
	return ls
}

// newMoveHomeSim is newLostBackupSim with the backup still OK, or, on
// hosts hosts (the origin the last), a segment of redundancy spec whose
// first home holds want.
func newMoveHomeSim(t *testing.T, hosts int, spec string) *lostBackupSim {
	ls := &lostBackupSim{stopped: make(chan uint64, 1)}
	ls.sc = newSimCluster(t, simHostConfig{hosts: hosts, leaseTTL: 10 * time.Second, timing: fastDetection})
	ls.oh = ls.sc.hosts[hosts-1]
	for _, h := range ls.sc.hosts {
		h.cfg.Rebuild = false
		h.cfg.sim.grpc = append(h.cfg.sim.grpc, grpc.ChainUnaryInterceptor(
			func(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
				if rr, ok := req.(*poolv1.ReplicateRequest); ok && rr.Joined {
					if f := ls.joined.Swap(nil); f != nil {
						if err := (*f)(h, rr); err != nil {
							return nil, err
						}
					}
				}
				return next(ctx, req)
			}))
	}
	ls.oh.cfg.sim.newHomeLost = func(seg uint64) bool {
		if !ls.stop.Load() {
			return false
		}
		select {
		case ls.stopped <- seg:
		default:
		}
		return true
	}
	ls.sc.startDrainedOrigin(t, ls.oh)
	ctx, origin := t.Context(), ls.oh.daemon()
	const size = 64 << 10
	seg, err := allocSpec(ctx, t, origin, size, spec)
	require.NoError(t, err)
	ls.r = *seg
	ls.want = bytes.Repeat([]byte{0xc3}, int(ls.r.shardSize()))
	require.NoError(t, homeConn(t, origin, ls.r.Homes[0]).Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(ls.r.Homes[0]), Buf: ls.want}))
	return ls
}

// arm has joined run at the next Replicate that joins a new copy.
func (ls *lostBackupSim) arm(joined func(h *simHost, req *poolv1.ReplicateRequest) error) {
	ls.joined.Store(&joined)
}

// state is the segment's record at the origin now.
func (ls *lostBackupSim) state(t *testing.T) record {
	cur, ok := ls.oh.daemon().pool.redundantRecord(ls.r.ID)
	require.True(t, ok)
	return cur
}

// movePrimary moves the primary as its host's evacuation asks.
func (ls *lostBackupSim) movePrimary(t *testing.T) error {
	return ls.moveHome(t, ls.r.Homes[0])
}

// moveHome moves home leaving as its host's evacuation asks.
func (ls *lostBackupSim) moveHome(t *testing.T, leaving homeRef) error {
	origin := ls.oh.daemon()
	for {
		// The backup's loss has the homes told again (replicateLater),
		// which holds the segment's move lock a while.
		_, err := origin.pool.move(t.Context(), caller{client: &client{id: peerClientPrefix + leaving.Node}},
			&poolv1.MoveRequest{Home: leaving.Node, HomeId: leaving.HomeID}, origin.moveTLS(), origin.moveClients())
		if !errors.Is(err, errMoveBusy) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// restartOrigin kills the origin where the newHomeLost hook stopped its
// move's finish (no leave: the others do not hear it go) and starts it
// again from its store, the hook no longer stopping anything.
func (ls *lostBackupSim) restartOrigin(t *testing.T) {
	ls.waitStopped(t)
	origin := ls.oh.daemon()
	crashed := errors.New("killed by the test")
	origin.failErr.Store(&crashed)
	require.NoError(t, origin.Close())
	ls.stop.Store(false)
	require.NoError(t, ls.sc.start(ls.oh))
}

// checkLeavingServes checks that the origin finished the move by keeping
// the leaving primary: no intent left, the segment not lost, its primary
// the leaving home, holding the bytes written, and unsealed (a write is
// applied).
func (ls *lostBackupSim) checkLeavingServes(t *testing.T) {
	origin := ls.oh.daemon()
	require.Eventually(t, func() bool {
		ins, err := origin.pool.st.intents()
		return err == nil && len(ins) == 0
	}, time.Minute, 20*time.Millisecond, "the origin keeps the move's intent: %s", homesString(ls.state(t).Homes))
	cur, leaving := ls.state(t), ls.r.Homes[0]
	require.False(t, cur.Lost, "the leaving primary held every write: %s", homesString(cur.Homes))
	require.Equal(t, poolv1.HomeState_HOME_STATE_OK, cur.Homes[0].State, homesString(cur.Homes))
	require.Equal(t, leaving.Node, cur.Homes[0].Node, homesString(cur.Homes))
	require.Equal(t, leaving.HomeID, cur.Homes[0].HomeID, homesString(cur.Homes))
	ctx := t.Context()
	require.True(t, bytes.Equal(ls.want, homeBytes(ctx, t, origin, cur.Homes[0], int64(len(ls.want)))), "the primary on %s holds the bytes written", cur.Homes[0].Node)
	c := homeConn(t, origin, cur.Homes[0])
	require.Eventually(t, func() bool {
		return c.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(cur.Homes[0]), Buf: []byte{1}}) == nil
	}, 30*time.Second, 20*time.Millisecond, "the kept primary does not take writes (sealed)")
}

// freeCopy frees the new copy a joining Replicate names at h, as h does
// when the origin's lease there runs out: the origin finds it gone.
func freeCopy(h *simHost, req *poolv1.ReplicateRequest) error {
	reclaimHere(h.daemon().pool, req.HomeId, "the test's target lost its copy")
	return nil
}

// TestMoveHomeLeavingKeptAfterRestart: as in
// TestMoveHomeTargetGoneAtSwitch, the new copy of a moved primary is gone
// at the switch, and the segment has no OK copy without the leaving
// primary; the origin commits the new home lost, and is killed before it
// puts the leaving home back. Restarted, it finds the record naming the
// new home (lost) in the leaving one's place: the switch committed, and
// the intent holds the leaving home's copy, so the origin puts it back
// and undoes the move. Taken for a move not switched, the leaving home
// was named by no record and freed as an orphan: the only copy of the
// bytes.
func TestMoveHomeLeavingKeptAfterRestart(t *testing.T) {
	ls := newLostBackupSim(t)
	ls.stop.Store(true)
	ls.arm(freeCopy)
	require.NoError(t, ls.movePrimary(t), "the switch is committed; its finish is retried")
	ls.restartOrigin(t)
	ls.checkLeavingServes(t)
}

// TestMoveHomeUnreachableAfterRestart: the switch's Replicate does not
// reach the new copy of a moved primary, whose host then crashes for
// good; without it the segment has no OK copy, so the origin keeps the
// new home UNREACHABLE (a return with its copy would serve again), and
// is killed before it puts the leaving home back. Restarted, it finds the
// move switched to a home still out of reach: the leaving primary, which
// still holds its copy and every acknowledged write (the writers were
// sealed from before the switch), takes its place back and serves, the
// writers unsealed. Waited for, the new home kept the writers sealed for
// as long as its host was down.
func TestMoveHomeUnreachableAfterRestart(t *testing.T) {
	ls := newLostBackupSim(t)
	ls.stop.Store(true)
	var target atomic.Pointer[simHost]
	ls.arm(func(h *simHost, _ *poolv1.ReplicateRequest) error {
		target.Store(h)
		return errors.New("the test's target does not take it")
	})
	require.NoError(t, ls.movePrimary(t), "the switch is committed; its finish is retried")
	h := target.Load()
	require.NotNil(t, h, "the switch's Replicate did not reach the new copy")
	ls.sc.crash(h)
	ls.restartOrigin(t)
	ls.checkLeavingServes(t)
	require.Nil(t, h.daemon(), "the new home's host stays down")
}

// moveUnjoined moves home leaving while every Replicate that joins its
// new copy fails there, so that the switch commits and its finish is
// retried, and returns the new copy's host.
func (ls *lostBackupSim) moveUnjoined(t *testing.T, leaving homeRef) *simHost {
	var target atomic.Pointer[simHost]
	var fail func(h *simHost, _ *poolv1.ReplicateRequest) error
	fail = func(h *simHost, _ *poolv1.ReplicateRequest) error {
		target.Store(h)
		ls.arm(fail)
		return errors.New("the test's new copy does not join")
	}
	ls.arm(fail)
	require.NoError(t, ls.moveHome(t, leaving), "the switch is committed; its finish is retried")
	h := target.Load()
	require.NotNil(t, h, "the switch's Replicate did not reach the new copy")
	return h
}

// waitStopped waits until the origin's move finish finds its new home
// lost and the segment lost without it (the newHomeLost hook).
func (ls *lostBackupSim) waitStopped(t *testing.T) {
	select {
	case <-ls.stopped:
	case <-time.After(time.Minute):
		t.Fatalf("the move's finish did not find its new home lost: %s", homesString(ls.state(t).Homes))
	}
}

// TestMoveHomePromotedNotPutBack: a backup moves; the switch's Replicate
// does not reach its new copy, so the finish is retried, the writers
// sealed. The primary's host crashes: the new copy, which no seal holds,
// is promoted and acknowledges a write; then its host crashes too, and
// without it the segment is lost. The leaving backup, whose node still
// holds it, missed that write: it is not put back (the segment waits for
// the new copy). Put back, it served the bytes from before the write.
func TestMoveHomePromotedNotPutBack(t *testing.T) {
	ls := newMoveHomeSim(t, 4, "replicas=2")
	ls.stop.Store(true) // the test asks keepLeaving itself
	leaving := ls.r.Homes[1]
	h := ls.moveUnjoined(t, leaving)

	ls.sc.crash(ls.sc.host(ls.r.Homes[0].Node))
	require.Eventually(t, func() bool {
		cur := ls.state(t)
		return cur.Homes[0].Node == h.name && cur.Homes[0].State == poolv1.HomeState_HOME_STATE_OK
	}, time.Minute, 10*time.Millisecond, "the new copy is not promoted: %s", homesString(ls.state(t).Homes))
	ctx, origin := t.Context(), ls.oh.daemon()
	written := bytes.Repeat([]byte{0x5a}, len(ls.want))
	c := homeConn(t, origin, ls.state(t).Homes[0])
	require.Eventually(t, func() bool {
		return c.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(ls.state(t).Homes[0]), Buf: written}) == nil
	}, 30*time.Second, 20*time.Millisecond, "the promoted copy does not take writes")

	cur, err := ls.keepLeavingAfter(t, h)
	require.True(t, cur.Lost, "the leaving backup on %s, which missed a write, serves: %s", leaving.Node, homesString(cur.Homes))
	require.Error(t, err)
}

// keepLeavingAfter crashes h, the move's new home, waits for the finish
// the newHomeLost hook stops, and asks keepLeaving itself; it returns the
// record after that and keepLeaving's error.
func (ls *lostBackupSim) keepLeavingAfter(t *testing.T, h *simHost) (record, error) {
	ls.sc.crash(h)
	ls.waitStopped(t)
	origin := ls.oh.daemon()
	in, ok := origin.pool.moving.get(ls.r.ID)
	require.True(t, ok, "the move ended")
	err := origin.pool.keepLeaving(t.Context(), in)
	t.Logf("keepLeaving: %v", err)
	return ls.state(t), err
}

// TestMoveHomeLostShardWriteNotMissed: a parity shard of an ec=2+2
// segment whose data shard 0 is lost moves; the switch's Replicate does
// not reach its new shard, so the finish is retried. A write to the lost
// data shard (WriteLostShard) changes the parity shards the record names,
// the new one and not the leaving one; then the other parity shard and
// the new one are lost too, and the segment with them. The leaving shard
// is put back only if no such write was acknowledged: with it, shard 0
// decoded from the leaving parity lacked the write.
func TestMoveHomeLostShardWriteNotMissed(t *testing.T) {
	ls := newMoveHomeSim(t, 6, "ec=2+2")
	ls.stop.Store(true) // the test asks keepLeaving itself
	ls.sc.crash(ls.sc.host(ls.r.Homes[0].Node))
	require.Eventually(t, func() bool { return ls.state(t).Homes[0].State == poolv1.HomeState_HOME_STATE_LOST }, time.Minute, 10*time.Millisecond,
		"data shard 0 is not marked lost: %s", homesString(ls.state(t).Homes))
	h := ls.moveUnjoined(t, ls.r.Homes[2])

	ctx, origin := t.Context(), ls.oh.daemon()
	_, werr := origin.pool.writeLostShard(ctx, caller{}, &poolv1.WriteLostShardRequest{Id: ls.r.ID, Shard: 0, Data: bytes.Repeat([]byte{0x5a}, 4096)}, origin.moveTLS())
	t.Logf("the write to the lost data shard: %v", werr)

	ls.sc.crash(ls.sc.host(ls.r.Homes[3].Node))
	require.Eventually(t, func() bool { return ls.state(t).Homes[3].State == poolv1.HomeState_HOME_STATE_LOST }, time.Minute, 10*time.Millisecond,
		"parity shard 1 is not marked lost: %s", homesString(ls.state(t).Homes))
	cur, _ := ls.keepLeavingAfter(t, h)
	require.False(t, werr == nil && !cur.Lost, "the leaving parity shard, which missed an acknowledged write, serves: %s", homesString(cur.Homes))
}

// TestMoveHomeLeavingGoneNotPutBack: as in
// TestMoveHomeLeavingKeptAfterRestart, the new copy of a moved primary is
// gone at the switch and the segment lost without the leaving primary.
// A leaving home the intent forgot (forgetLeaving: given up unanswered,
// the writers unsealed without it) is not put back though its node still
// holds it, and the intent is committed without its copy; nor is one its
// node no longer holds (it took its COMMIT). The segment stays lost.
func TestMoveHomeLeavingGoneNotPutBack(t *testing.T) {
	ls := newLostBackupSim(t)
	ls.stop.Store(true) // the test asks keepLeaving itself
	ls.arm(freeCopy)
	require.NoError(t, ls.movePrimary(t), "the switch is committed; its finish is retried")
	ls.waitStopped(t)
	ctx, origin, leaving := t.Context(), ls.oh.daemon(), ls.r.Homes[0]
	in, ok := origin.pool.moving.get(ls.r.ID)
	require.True(t, ok, "the move ended")
	require.NotEmpty(t, in.FromAddr, "the intent holds the leaving home's copy")
	stillLost := func(err error) {
		t.Logf("keepLeaving: %v", err)
		t.Helper()
		require.ErrorIs(t, err, errs.ErrUnavailable)
		cur := ls.state(t)
		require.True(t, cur.Lost, "the leaving primary was put back: %s", homesString(cur.Homes))
	}

	require.NoError(t, origin.pool.forgetLeaving(in))
	stillLost(origin.pool.keepLeaving(ctx, in))
	ins, err := origin.pool.st.intents()
	require.NoError(t, err)
	require.Len(t, ins, 1)
	require.Empty(t, ins[0].FromAddr, "the stored intent still holds the leaving home's copy")
	require.True(t, ins[0].Switched)

	origin.pool.moving.set(in) // the copy known again: only the node's answer refuses it now
	reclaimHere(ls.sc.host(leaving.Node).daemon().pool, leaving.HomeID, "the test's leaving home let its copy go")
	stillLost(origin.pool.keepLeaving(ctx, in))
}
