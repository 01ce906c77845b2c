package pool

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/session"
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
