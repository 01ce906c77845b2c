package pool

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/reedsolomon"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/rdma"
)

// This file holds the scale simulation's view of redundant segments and
// their rebuild (TestScale's redundant share), and TestRebuildSim, which
// checks the same on a few simulated hosts with the bytes compared.

// redundantOn lists, per running host, the ids of its redundant records
// with a home on node, or all of them if node is empty.
func (sc *simCluster) redundantOn(node string) map[*simHost][]uint64 {
	out := map[*simHost][]uint64{}
	for _, h := range sc.up() {
		p := h.daemon().pool
		p.mu.Lock()
		for _, r := range p.segs {
			if r.redundant() && (node == "" || slices.ContainsFunc(r.Homes, func(x homeRef) bool { return x.Node == node })) {
				out[h] = append(out[h], r.ID)
			}
		}
		p.mu.Unlock()
	}
	return out
}

// simRebuild is how far the rebuild of the redundant records that had a
// home on a crashed host has come.
type simRebuild struct {
	ok       int // every home OK, none on the crashed host (or freed meanwhile)
	degraded int // a home lost and no host left to rebuild it on
	pending  []string
}

// rebuildState looks at the records of ids (per owner host) that had a
// home on gone (or at any redundant records, gone empty).
func (sc *simCluster) rebuildState(ids map[*simHost][]uint64, gone string) simRebuild {
	var s simRebuild
	lenders := slices.DeleteFunc(sc.up(), func(h *simHost) bool { return !h.daemon().pool.drainState().since.IsZero() })
	for h, list := range ids {
		d := h.daemon()
		if d == nil {
			continue
		}
		d.pool.mu.Lock()
		for _, id := range list {
			r := d.pool.segs[id]
			if r == nil {
				s.ok++ // freed by its application meanwhile
				continue
			}
			switch st := r.redundancyState(); {
			case st == poolv1.RedundancyState_REDUNDANCY_STATE_OK && !slices.ContainsFunc(r.Homes, func(x homeRef) bool { return x.Node == gone }):
				s.ok++
			case st == poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED && !slices.ContainsFunc(lenders, func(o *simHost) bool { return !r.homedOn(o.name) }):
				s.degraded++ // every running host that takes homes holds one of it already
			default:
				s.pending = append(s.pending, fmt.Sprintf("%s:%d %s %s", h.name, id, redundancyLabel(st), homesString(r.Homes)))
			}
		}
		d.pool.mu.Unlock()
	}
	return s
}

// homesString shows homes as node:state, for a failing test's message.
func homesString(hs []homeRef) string {
	var b strings.Builder
	for i, h := range hs {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s:%s", h.Node, strings.ToLower(strings.TrimPrefix(h.State.String(), "HOME_STATE_")))
	}
	return b.String()
}

// waitRebuilt waits until every record of ids that had a home on gone is
// rebuilt (or degraded with no host left) and returns the final state and
// how long it took from since.
func (sc *simCluster) waitRebuilt(t testing.TB, ids map[*simHost][]uint64, gone string, since time.Time, timeout time.Duration) (simRebuild, time.Duration) {
	deadline := time.Now().Add(timeout)
	for {
		s := sc.rebuildState(ids, gone)
		if len(s.pending) == 0 {
			return s, time.Since(since)
		}
		if time.Now().After(deadline) {
			slices.Sort(s.pending)
			require.Failf(t, "rebuild", "%v after the crash of %s, %d redundant segments are not rebuilt (%d are): %s",
				time.Since(since).Round(time.Millisecond), gone, len(s.pending), s.ok, strings.Join(s.pending[:min(20, len(s.pending))], "; "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rebuildBytes sums the running hosts' farmem_rebuild_bytes_total.
func (sc *simCluster) rebuildBytes() int64 {
	var n float64
	for _, h := range sc.up() {
		var m dto.Metric
		if err := h.daemon().metrics.rebuilds.bytes.Write(&m); err == nil {
			n += m.GetCounter().GetValue()
		}
	}
	return int64(n)
}

// simRedundancy draws the redundancy of the scale workload's next
// segment: replicas=2 for a share repShare of them, ec=4+2 for ecShare,
// none for the rest.
func simRedundancy(rnd interface{ Float64() float64 }, repShare, ecShare float64) *poolv1.Redundancy {
	switch x := rnd.Float64(); {
	case x < repShare:
		return &poolv1.Redundancy{Replicas: 2}
	case x < repShare+ecShare:
		return &poolv1.Redundancy{DataShards: 4, ParityShards: 2}
	}
	return nil
}

// dialOwner is homeConn for a caller that handles the error: a
// data-plane connection to home h with origin's own credential there.
func dialOwner(ctx context.Context, origin *Daemon, h homeRef) (rdma.Conn, error) {
	pc := origin.pool.peers.conn(h.Node)
	if pc == nil {
		return nil, fmt.Errorf("no session with %s", h.Node)
	}
	return dialHome(ctx, h.Node, h.DataAddr, false, nil, pc.DataCredential())
}

// homeBytes reads the whole segment of home h (n bytes) as origin.
func homeBytes(ctx context.Context, t *testing.T, origin *Daemon, h homeRef, n int64) []byte {
	c := homeConn(t, origin, h)
	buf := make([]byte, n)
	require.NoError(t, c.Do(ctx, &rdma.Op{Kind: rdma.OpRead, Region: homeRegion(h), Buf: buf}), "read home on %s", h.Node)
	return buf
}

// TestRebuildSim: on 9 simulated hosts, a replicas=2 and an ec=4+2
// segment are written (the replicated one through its primary, the coded
// one shard by shard at its data homes, whose parity deltas the data
// plane forwards); while a writer keeps writing, the host holding a backup
// copy and a data shard crashes; the origin (at --rebuild-rate 1MiB, so
// that the rebuild takes a while) is restarted while it rebuilds, and
// starts the rebuild over; both segments are rebuilt on other hosts and
// every home's bytes are what was written (parity: the code of the data
// shards), the rebuild counted in farmem_rebuild_bytes_total.
func TestRebuildSim(t *testing.T) {
	// 9 hosts: the origin, which drains, and 8 that lend: two crash, and
	// the six left have room for the coded segment's six homes.
	const size = 1 << 20
	rs := newRedundantSim(t, 9, size, func(oh *simHost) { oh.cfg.RebuildRate = 1 << 20 })
	sc, oh, rep, ec, primary := rs.sc, rs.oh, rs.rep, rs.ec, rs.primary
	origin := oh.daemon()
	ctx := t.Context()
	repID, ecID := rs.repID, rs.ecID

	// The victims: the backup's host, and a data home's host of the coded
	// segment (the same when it has one there) that is not the primary's.
	victims := []string{rep.Homes[1].Node}
	if !slices.ContainsFunc(ec.Homes[:4], func(h homeRef) bool { return h.Node == victims[0] }) {
		i := slices.IndexFunc(ec.Homes[:4], func(h homeRef) bool { return h.Node != rep.Homes[0].Node })
		victims = append(victims, ec.Homes[i].Node)
	}

	// A writer keeps writing the replicated segment's first 64 KiB during
	// the rebuild (a write the seal refuses fails, and the next one goes
	// on; one whose credential went with the origin's restart dials again
	// with the restarted origin's); once stopped it writes until a write
	// succeeds, and that last write is what must be there.
	stop := make(chan struct{})
	wrote := make(chan []byte, 1)
	go func() {
		block := make([]byte, 64<<10)
		conn := primary
		for i := byte(1); ; i++ {
			for j := range block {
				block[j] = i + byte(j)
			}
			err := errors.New("not connected")
			if conn != nil {
				err = conn.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(rep.Homes[0]), Buf: block})
			}
			if err != nil {
				if conn != primary && conn != nil {
					conn.Close()
				}
				conn = nil
				if d := oh.daemon(); d != nil {
					conn, _ = dialOwner(ctx, d, rep.Homes[0])
				}
			}
			select {
			case <-stop:
				if err == nil || ctx.Err() != nil {
					if conn != primary && conn != nil {
						conn.Close()
					}
					wrote <- block
					return
				}
			default:
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()

	ids := map[*simHost][]uint64{oh: {repID, ecID}}
	crashed := time.Now()
	for _, v := range victims {
		sc.crash(sc.host(v))
	}
	// The origin restarts while it rebuilds the copy.
	require.Eventually(t, func() bool {
		r, _ := origin.pool.redundantRecord(repID)
		return r.Homes[1].State == poolv1.HomeState_HOME_STATE_REBUILDING && r.Homes[1].Rebuilt > 0
	}, time.Minute, 5*time.Millisecond, "the copy's rebuild does not begin")
	require.NoError(t, origin.Close())
	require.NoError(t, sc.start(oh))
	origin = oh.daemon()
	r, _ := origin.pool.redundantRecord(repID)
	require.Equal(t, poolv1.HomeState_HOME_STATE_REBUILDING, r.Homes[1].State, "the restarted origin finds the rebuild in the record")
	bytes0 := sc.rebuildBytes()
	state, took := sc.waitRebuilt(t, ids, victims[0], crashed, time.Minute)
	if len(victims) > 1 {
		state, took = sc.waitRebuilt(t, ids, victims[1], crashed, time.Minute)
	}
	close(stop)
	last := <-wrote
	require.Equal(t, 2, state.ok)
	moved := sc.rebuildBytes() - bytes0
	t.Logf("crash of %v: both segments rebuilt after %v, %d bytes written to new homes", victims, took.Round(time.Millisecond), moved)
	require.GreaterOrEqual(t, moved, int64(size), "the restarted rebuild wrote a whole copy at least")

	copy(rs.repWant, last)
	rs.checkHomes(t, victims)
}

// redundantSim is a simulated cluster whose origin, which drains (it
// takes no homes, so that no crash of a home takes it), placed a
// replicas=2 and an ec=4+2 segment for a client of its own and wrote
// random bytes to them: the copies at the primary, the shards at each
// data home (whose parity deltas the data plane forwards).
type redundantSim struct {
	sc          *simCluster
	oh          *simHost // the origin's host
	repID, ecID uint64
	rep, ec     record // as placed
	repWant     []byte
	ecWant      [][]byte      // each shard's bytes, the parity shards' included
	primary     rdma.Conn     // to the copies' primary, with the origin's credential
	conn        *session.Conn // the segments' owner's session with the origin
}

// newRedundantSim starts hosts simulated hosts, the fourth the origin
// (no seed: a restarted seed would join only itself), with setup applied
// to the origin's host first, and places and writes the two segments of
// size bytes.
func newRedundantSim(t *testing.T, hosts int, size int64, setup func(oh *simHost)) *redundantSim {
	return newRedundantSimOf(t, hosts, size, size, setup)
}

// newRedundantSimOf is newRedundantSim with the replicated segment of
// repSize bytes and the coded one of ecSize.
func newRedundantSimOf(t *testing.T, hosts int, repSize, ecSize int64, setup func(oh *simHost)) *redundantSim {
	sc := newSimCluster(t, simHostConfig{hosts: hosts, leaseTTL: 10 * time.Second, timing: pushPullEverySecond})
	for _, h := range sc.hosts {
		h.cfg.GossipProfile = cluster.ProfileLocal // failure detection in about a second
	}
	rs := &redundantSim{sc: sc, oh: sc.hosts[3]}
	setup(rs.oh)
	sc.startDrainedOrigin(t, rs.oh)
	ctx := t.Context()
	oh := rs.oh
	origin := oh.daemon()
	conn, err := session.Dial(ctx, "unix", oh.cfg.Socket, session.Options{ClientID: "redundant-sim"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	rs.conn = conn
	alloc := func(red *poolv1.Redundancy, size int64) (uint64, record) {
		cctx, _, err := conn.Call(ctx)
		require.NoError(t, err)
		seg, err := conn.API().Alloc(cctx, &poolv1.AllocRequest{Size: size, Tier: poolv1.Tier_TIER_RDMA, Redundancy: red})
		require.NoError(t, err)
		r, ok := origin.pool.redundantRecord(seg.Id)
		require.True(t, ok)
		return seg.Id, r
	}
	rs.repID, rs.rep = alloc(&poolv1.Redundancy{Replicas: 2}, repSize)
	rs.ecID, rs.ec = alloc(&poolv1.Redundancy{DataShards: 4, ParityShards: 2}, ecSize)
	require.Len(t, rs.rep.Homes, 2)
	require.Len(t, rs.ec.Homes, 6)
	shard := rs.ec.shardSize()

	// The bytes: random, written at the primary and at each data home in
	// one write (a data home waits for a parity shard that is slow to take
	// a 16 MiB delta as long as it keeps answering: rdma/tcp
	// TestForwardSlowTargetKept).
	rs.repWant = make([]byte, repSize)
	_, _ = rand.Read(rs.repWant)
	rs.primary = homeConn(t, origin, rs.rep.Homes[0])
	require.NoError(t, rs.primary.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(rs.rep.Homes[0]), Buf: rs.repWant}))
	rs.ecWant = make([][]byte, 6)
	for i := range rs.ecWant {
		rs.ecWant[i] = make([]byte, shard)
		if i < 4 {
			_, _ = rand.Read(rs.ecWant[i])
			c := homeConn(t, origin, rs.ec.Homes[i])
			require.NoError(t, c.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(rs.ec.Homes[i]), Buf: rs.ecWant[i]}))
		}
	}
	enc, err := reedsolomon.New(4, 2)
	require.NoError(t, err)
	require.NoError(t, enc.Encode(rs.ecWant))
	return rs
}

// startDrainedOrigin starts sc and drains oh, the origin of the
// segments a test places, until every host knows: their homes go on the
// other hosts.
func (sc *simCluster) startDrainedOrigin(t *testing.T, oh *simHost) {
	sc.startAll()
	_, err := sc.waitConverged(time.Minute)
	require.NoError(t, err)
	require.NoError(t, sc.drain(oh, false))
	require.Eventually(t, func() bool {
		for _, h := range sc.up() {
			if m, ok := h.daemon().pool.cl.Member(oh.name); !ok || !m.Meta.Draining {
				return false
			}
		}
		return true
	}, time.Minute, 10*time.Millisecond, "the origin's drain is not gossiped")
}

// checkHomes checks the segments' records at the origin now: no home on a
// node of gone, every home OK and holding the bytes written (repWant,
// ecWant).
func (rs *redundantSim) checkHomes(t *testing.T, gone []string) {
	origin := rs.oh.daemon()
	for _, seg := range []struct {
		id   uint64
		want func(i int) []byte
	}{{rs.repID, func(int) []byte { return rs.repWant }}, {rs.ecID, func(i int) []byte { return rs.ecWant[i] }}} {
		r, ok := origin.pool.redundantRecord(seg.id)
		require.True(t, ok)
		for i, h := range r.Homes {
			require.False(t, slices.Contains(gone, h.Node), "segment %d: home %d on %s", seg.id, i, h.Node)
			require.Equal(t, poolv1.HomeState_HOME_STATE_OK, h.State, "segment %d: home %d on %s", seg.id, i, h.Node)
			want := seg.want(i)
			require.True(t, bytes.Equal(want, homeBytes(t.Context(), t, origin, h, int64(len(want)))), "segment %d: home %d on %s", seg.id, i, h.Node)
		}
	}
}

// TestRestartedWriterRebuilt: the daemons holding the replicated
// segment's primary and a data shard of the coded one stop without
// leaving the cluster (as kill -9 does) and start again at once, faster
// than gossip declares them dead, with their homes still in memory. A
// write applied just before may never have reached the other homes, so
// the origin does not let them go on as they were: the backup becomes the
// primary and the copy is rebuilt from it (the restarted daemon's copy is
// freed, never served); the data shard keeps its bytes and the parity
// shards, which may each hold a different part of its last write's
// deltas, are rebuilt from the data shards. Every home holds the bytes
// written.
func TestRestartedWriterRebuilt(t *testing.T) {
	const size = 1 << 20
	rs := newRedundantSim(t, 9, size, func(*simHost) {})
	sc, rep, ec := rs.sc, rs.rep, rs.ec
	primary, shard := rep.Homes[0], ec.Homes[0]
	restart := func(node string) {
		h := sc.host(node)
		d := h.daemon()
		crashed := errors.New("killed by the test")
		d.failErr.Store(&crashed) // no leave: the others do not hear it go
		require.NoError(t, d.Close())
		require.NoError(t, sc.start(h))
	}
	restart(primary.Node)
	if shard.Node != primary.Node {
		restart(shard.Node)
	}

	origin := rs.oh.daemon()
	allOK := func(r record) bool {
		return !slices.ContainsFunc(r.Homes, func(h homeRef) bool { return h.State != poolv1.HomeState_HOME_STATE_OK })
	}
	same := func(a, b homeRef) bool { return a.Node == b.Node && a.HomeID == b.HomeID }
	require.Eventually(t, func() bool {
		r, _ := origin.pool.redundantRecord(rs.repID)
		return allOK(r) && !slices.ContainsFunc(r.Homes, func(h homeRef) bool { return same(h, primary) })
	}, time.Minute, 10*time.Millisecond, "the restarted primary's copy is not replaced")
	r, _ := origin.pool.redundantRecord(rs.repID)
	require.Equal(t, rep.Homes[1].Node, r.Homes[0].Node, "the backup is the primary")
	require.Eventually(t, func() bool {
		r, _ := origin.pool.redundantRecord(rs.ecID)
		return allOK(r) && !slices.ContainsFunc(r.Homes[4:], func(h homeRef) bool { return same(h, ec.Homes[4]) || same(h, ec.Homes[5]) })
	}, time.Minute, 10*time.Millisecond, "the coded segment's parity is not rebuilt")
	r, _ = origin.pool.redundantRecord(rs.ecID)
	require.True(t, same(r.Homes[0], shard), "the restarted data shard keeps its place")
	rs.checkHomes(t, nil)
}

// TestWriteHoleRepaired: a data home of an ec=4+2 segment sends a write's
// parity deltas to one parity shard and dies before the other gets its
// own (here: the first parity shard is written as the write would change
// it, the second is not, and the data home's host crashes). The write was
// never acknowledged, so either outcome may stand, but the shards must
// agree on one: the rebuild decodes the lost shard, checks the decode
// against the other parity shard, and in its sealed last round brings
// that one in line. Afterwards the six shards are a consistent code of the
// data shards, data shard 0 holds the bytes before or after the write,
// and the other data shards hold theirs. The origin tells the homes how
// they are written again while the rebuild copies (as a membership change
// has it do): the shard being filled must not forward the copy's writes
// to the parity shards as deltas.
func TestWriteHoleRepaired(t *testing.T) {
	// Shards of 1 MiB, copied in four batches of 256 KiB a second apart.
	const size = 4 << 20
	rs := newRedundantSim(t, 9, size, func(oh *simHost) { oh.cfg.RebuildRate = 256 << 10 })
	sc, ec := rs.sc, rs.ec
	origin := rs.oh.daemon()
	ctx := t.Context()
	enc, err := reedsolomon.New(4, 2)
	require.NoError(t, err)

	const off, n = 8192 + 100, 512
	after := make([][]byte, 6)
	for i := range after {
		after[i] = slices.Clone(rs.ecWant[i])
	}
	_, _ = rand.Read(after[0][off : off+n])
	require.NoError(t, enc.Encode(after))
	c := homeConn(t, origin, ec.Homes[4])
	require.NoError(t, c.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(ec.Homes[4]), Offset: off, Buf: after[4][off : off+n]}))

	victim, crashed := rs.crashShard0(t, true)
	r, _ := origin.pool.redundantRecord(rs.ecID)
	require.NoError(t, origin.pool.replicate(ctx, &r))
	state, took := sc.waitRebuilt(t, map[*simHost][]uint64{rs.oh: {rs.ecID}}, victim, crashed, time.Minute)
	require.Equal(t, 1, state.ok)
	t.Logf("the data shard on %s rebuilt %v after the crash", victim, took.Round(time.Millisecond))

	r, _ = origin.pool.redundantRecord(rs.ecID)
	got := make([][]byte, 6)
	for i, h := range r.Homes {
		got[i] = homeBytes(ctx, t, origin, h, ec.shardSize())
	}
	agree, err := enc.Verify(got)
	require.NoError(t, err)
	require.True(t, agree, "the shards are not a consistent code of the data shards")
	require.True(t, bytes.Equal(got[0], rs.ecWant[0]) || bytes.Equal(got[0], after[0]), "data shard 0 holds neither outcome of the write")
	var m dto.Metric
	require.NoError(t, origin.metrics.parityRepaired.Write(&m))
	require.GreaterOrEqual(t, m.GetCounter().GetValue(), float64(n), "farmem_rebuild_parity_repaired_bytes_total counts the bytes rewritten")
	for i := 1; i < 4; i++ {
		require.True(t, bytes.Equal(got[i], rs.ecWant[i]), "data shard %d changed", i)
	}
}

// TestLostSourceEndsFill: while data shard 0 of an ec=4+2 segment is
// rebuilt, data shard 1 takes a write whose delta parity shard 4, a
// source of the decode, misses (here: its old bytes are written back),
// and the record marks parity shard 4 lost, as a data home's report of
// the failed forward does. The fill must not go on decoding from it: a
// decode from it is wrong where the write was, and the sealed vote (one
// spare, a tie) would keep it and rewrite parity shard 5 to match. The
// fill ends and starts again from the shards left; every shard holds the
// bytes written afterwards, parity shard 4 rebuilt.
func TestLostSourceEndsFill(t *testing.T) {
	const size = 4 << 20
	rs := newRedundantSim(t, 9, size, func(oh *simHost) { oh.cfg.RebuildRate = 256 << 10 })
	ec, origin, ctx := rs.ec, rs.oh.daemon(), t.Context()
	victim, crashed := rs.crashShard0(t, true)

	const off, n = 8192 + 100, 512
	after := make([][]byte, 6)
	for i := range after {
		after[i] = slices.Clone(rs.ecWant[i])
	}
	_, _ = rand.Read(after[1][off : off+n])
	enc, err := reedsolomon.New(4, 2)
	require.NoError(t, err)
	require.NoError(t, enc.Encode(after))
	c := homeConn(t, origin, ec.Homes[1])
	require.NoError(t, c.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(ec.Homes[1]), Offset: off, Buf: after[1][off : off+n]}))
	c = homeConn(t, origin, ec.Homes[4])
	require.NoError(t, c.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(ec.Homes[4]), Offset: off, Buf: rs.ecWant[4][off : off+n]}))
	require.NoError(t, origin.pool.setHome(rs.ecID, 4, ec.Homes[4], func(x *homeRef) { x.State = poolv1.HomeState_HOME_STATE_LOST }))
	rs.ecWant = after

	whole := func() bool {
		r, _ := origin.pool.redundantRecord(rs.ecID)
		was := r.Homes[4].Node == ec.Homes[4].Node && r.Homes[4].HomeID == ec.Homes[4].HomeID
		return !was && !slices.ContainsFunc(r.Homes, func(h homeRef) bool { return h.State != poolv1.HomeState_HOME_STATE_OK })
	}
	for deadline := time.Now().Add(time.Minute); !whole(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			r, _ := origin.pool.redundantRecord(rs.ecID)
			t.Fatalf("data shard 0 and parity shard 4 are not rebuilt: %s", homesString(r.Homes))
		}
	}
	t.Logf("data shard 0 (on %s) and parity shard 4 rebuilt %v after the crash", victim, time.Since(crashed).Round(time.Millisecond))
	rs.checkShards(t)
}

// TestRepairFailureLosesParity: a data home of an ec=4+2 segment sends a
// write's parity delta to parity shard 4 and dies before parity shard 5
// gets its own (the write hole of TestWriteHoleRepaired), and the sealed
// round of data shard 0's rebuild cannot bring parity shard 5 in line:
// its repair write fails (the repairing hook), or it disagrees in more
// than maxRepair (16 MiB) bytes, which the fill does not hold (no write
// is tried). The record must then mark parity shard 5 lost, never leave
// it OK out of line with the data shards: while the one host left that
// could take a home drains, it stays lost (the segment degraded); once
// that host takes homes again, parity shard 5 is rebuilt there from the
// data shards. Afterwards every shard holds the code of the data shards
// (data shard 0 the outcome of the write the decode chose, parity shard
// 4's), so any one home lost decodes every byte.
func TestRepairFailureLosesParity(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ecSize int64
		// from, to: the bytes of data shard 0 the dead home's write
		// changed, whose delta reached parity shard 4 only.
		from, to  int64
		failWrite bool // the repair write of parity shard 5 fails
	}{
		{"its repair write fails", 4 << 20, 8192 + 100, 8192 + 612, true},
		{"out of line in more than 16 MiB", 4 * (maxRepair + 1<<20), 0, maxRepair + 1<<20, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tried atomic.Int32 // repair writes of parity shard 5
			rs := newRedundantSimOf(t, 9, 1<<20, tc.ecSize, func(oh *simHost) {
				oh.cfg.sim.repairing = func(_ uint64, shard int) error {
					if shard != 5 {
						return nil
					}
					tried.Add(1)
					if !tc.failWrite {
						return nil
					}
					return fmt.Errorf("the repair write refused by the test: %w", rdma.ErrClosed)
				}
			})
			sc, ec, origin, ctx := rs.sc, rs.ec, rs.oh.daemon(), t.Context()

			// Of the two hosts that hold no shard, one drains: the other
			// takes data shard 0's new home, and no host is left for
			// parity shard 5.
			free := slices.DeleteFunc(sc.up(), func(h *simHost) bool {
				return h == rs.oh || slices.ContainsFunc(ec.Homes, func(x homeRef) bool { return x.Node == h.name })
			})
			require.Len(t, free, 2)
			spare := free[0]
			require.NoError(t, sc.drain(spare, false))
			require.Eventually(t, func() bool {
				m, ok := origin.pool.cl.Member(spare.name)
				return ok && m.Meta.Draining
			}, time.Minute, 10*time.Millisecond, "the spare's drain is not gossiped to the origin")

			r, _ := origin.pool.redundantRecord(rs.ecID)
			require.Equal(t, homesString(ec.Homes), homesString(r.Homes), "the segment's homes changed before the write hole")

			after := make([][]byte, 6)
			for i := range after {
				after[i] = slices.Clone(rs.ecWant[i])
			}
			_, _ = rand.Read(after[0][tc.from:tc.to])
			enc, err := reedsolomon.New(4, 2)
			require.NoError(t, err)
			require.NoError(t, enc.Encode(after))
			c := homeConn(t, origin, ec.Homes[4])
			require.NoError(t, c.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(ec.Homes[4]), Offset: tc.from, Buf: after[4][tc.from:tc.to]}))

			victim, crashed := rs.crashShard0(t, false)
			parity := ec.Homes[5]
			lost := func() bool {
				r, _ := origin.pool.redundantRecord(rs.ecID)
				return r.Homes[0].State == poolv1.HomeState_HOME_STATE_OK && r.Homes[0].Node != victim &&
					r.Homes[5].Node == parity.Node && r.Homes[5].HomeID == parity.HomeID && r.Homes[5].State == poolv1.HomeState_HOME_STATE_LOST
			}
			for deadline := time.Now().Add(2 * time.Minute); !lost(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					r, _ := origin.pool.redundantRecord(rs.ecID)
					t.Fatalf("after data shard 0's rebuild, parity shard 5 (out of line, not brought in line) is not marked lost: %s", homesString(r.Homes))
				}
			}
			t.Logf("data shard 0 rebuilt and parity shard 5 marked lost %v after the crash", time.Since(crashed).Round(time.Millisecond))
			if tc.failWrite {
				require.Positive(t, tried.Load(), "the sealed round did not try to bring parity shard 5 in line")
			} else {
				require.Zero(t, tried.Load(), "the sealed round wrote more than maxRepair bytes of parity shard 5")
			}
			r, _ = origin.pool.redundantRecord(rs.ecID)
			require.Equal(t, poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED, r.redundancyState(), "parity shard 5 lost, no host to rebuild it on: %s", homesString(r.Homes))
			var m dto.Metric
			require.NoError(t, origin.metrics.parityRepaired.Write(&m))
			require.Zero(t, m.GetCounter().GetValue(), "farmem_rebuild_parity_repaired_bytes_total counts bytes not rewritten")

			require.NoError(t, sc.drain(spare, true))
			whole := func() bool {
				r, _ := origin.pool.redundantRecord(rs.ecID)
				return r.Homes[5].Node == spare.name && !slices.ContainsFunc(r.Homes, func(h homeRef) bool { return h.State != poolv1.HomeState_HOME_STATE_OK })
			}
			undrained := time.Now()
			for deadline := time.Now().Add(2 * time.Minute); !whole(); time.Sleep(10 * time.Millisecond) {
				if time.Now().After(deadline) {
					r, _ := origin.pool.redundantRecord(rs.ecID)
					t.Fatalf("parity shard 5 is not rebuilt on %s, which takes homes again: %s", spare.name, homesString(r.Homes))
				}
			}
			t.Logf("parity shard 5 rebuilt on %s %v after it took homes again", spare.name, time.Since(undrained).Round(time.Millisecond))
			rs.ecWant = after
			rs.checkShards(t)
		})
	}
}

// TestLostShardWrites: with the home of data shard 0 of an ec=4+2
// segment lost (its host crashed; the origin does not rebuild here), its
// owner's writes to that shard go through the origin (WriteLostShard),
// which decodes the old bytes and sends both parity shards the change,
// while a data home's own writes to the same rows go on: the five
// surviving shards then decode shard 0 as written, and the six are one
// consistent code. Atomics on a word of the lost shard answer and change
// it as at a home. Bad requests are refused with typed errors: while the
// home is up, a parity shard, no bytes, bytes past the shard's end, an
// unaligned atomic, and another client's.
func TestLostShardWrites(t *testing.T) {
	const size = 1 << 20
	rs := newRedundantSim(t, 9, size, func(oh *simHost) { oh.cfg.Rebuild = false })
	sc, ec := rs.sc, rs.ec
	origin := rs.oh.daemon()
	ctx := t.Context()
	shard := ec.shardSize()
	writeAs := func(conn *session.Conn, idx uint32, off int64, b []byte) error {
		cctx, _, err := conn.Call(ctx)
		require.NoError(t, err)
		_, err = conn.API().WriteLostShard(cctx, &poolv1.WriteLostShardRequest{Id: rs.ecID, Shard: idx, Offset: off, Data: b})
		return errs.FromStatus(err)
	}
	write := func(idx uint32, off int64, b []byte) error { return writeAs(rs.conn, idx, off, b) }
	require.ErrorIs(t, write(0, 0, []byte{1}), errs.ErrInvalid, "its home is up")

	sc.crash(sc.host(ec.Homes[0].Node))
	require.Eventually(t, func() bool {
		r, _ := origin.pool.redundantRecord(rs.ecID)
		return r.Homes[0].State == poolv1.HomeState_HOME_STATE_LOST
	}, time.Minute, 10*time.Millisecond, "the data shard's home is not marked lost")
	require.ErrorIs(t, write(4, 0, []byte{1}), errs.ErrInvalid, "a parity shard")
	require.ErrorIs(t, write(0, 0, nil), errs.ErrInvalid, "no bytes")
	require.ErrorIs(t, write(0, shard-1, []byte{1, 2}), errs.ErrOutOfRange, "past the end")
	stranger, err := session.Dial(ctx, "unix", rs.oh.cfg.Socket, session.Options{ClientID: "stranger"})
	require.NoError(t, err)
	defer stranger.Close()
	require.ErrorIs(t, writeAs(stranger, 0, 0, []byte{1}), errs.ErrAccessDenied, "another client's")

	// Writes to shard 0 through the origin, and to shard 1 at its home
	// (which forwards its parity deltas), over the same rows.
	want := [][]byte{slices.Clone(rs.ecWant[0]), slices.Clone(rs.ecWant[1])}
	d1 := homeConn(t, origin, ec.Homes[1])
	for _, w := range []struct{ off, n int64 }{{0, 4096}, {5000, 300}, {shard - 70000, 70000}, {4000, 200}} {
		b := make([]byte, w.n)
		_, _ = rand.Read(b)
		require.NoError(t, write(0, w.off, b), "write %d bytes at %d", w.n, w.off)
		copy(want[0][w.off:], b)
		_, _ = rand.Read(b)
		require.NoError(t, d1.Do(ctx, &rdma.Op{Kind: rdma.OpWrite, Region: homeRegion(ec.Homes[1]), Offset: w.off, Buf: b}))
		copy(want[1][w.off:], b)
	}

	// Atomics on a word of shard 0: a fetch-and-add, a compare-and-swap
	// that fails and one that holds.
	atomicErr := func(req *poolv1.WriteLostShardRequest) (*poolv1.WriteLostShardResponse, error) {
		cctx, _, err := rs.conn.Call(ctx)
		require.NoError(t, err)
		req.Id, req.Shard = rs.ecID, 0
		resp, err := rs.conn.API().WriteLostShard(cctx, req)
		return resp, errs.FromStatus(err)
	}
	atomic := func(req *poolv1.WriteLostShardRequest) *poolv1.WriteLostShardResponse {
		resp, err := atomicErr(req)
		require.NoError(t, err)
		return resp
	}
	const word = 8 * 1000
	was := binary.LittleEndian.Uint64(want[0][word:])
	resp := atomic(&poolv1.WriteLostShardRequest{Offset: word, Atomic: uint32(rdma.OpFetchAdd), Delta: 5})
	require.Equal(t, was, resp.Prev, "fetch-and-add's previous value")
	resp = atomic(&poolv1.WriteLostShardRequest{Offset: word, Atomic: uint32(rdma.OpCompareAndSwap), Old: was, New: 1})
	require.Equal(t, []any{was + 5, false}, []any{resp.Prev, resp.Swapped}, "a swap against a stale value fails")
	resp = atomic(&poolv1.WriteLostShardRequest{Offset: word, Atomic: uint32(rdma.OpCompareAndSwap), Old: was + 5, New: 42})
	require.Equal(t, []any{was + 5, true}, []any{resp.Prev, resp.Swapped})
	binary.LittleEndian.PutUint64(want[0][word:], 42)
	_, err = atomicErr(&poolv1.WriteLostShardRequest{Offset: 4, Atomic: uint32(rdma.OpFetchAdd)})
	require.ErrorIs(t, err, errs.ErrUnaligned)

	got := make([][]byte, 6)
	for i := 1; i < 6; i++ {
		got[i] = homeBytes(ctx, t, origin, ec.Homes[i], shard)
	}
	require.True(t, bytes.Equal(want[1], got[1]), "data shard 1 holds its writes")
	enc, err := reedsolomon.New(4, 2)
	require.NoError(t, err)
	for _, drop := range []int{4, 5} { // decoded from either parity shard
		from := slices.Clone(got)
		from[drop] = nil
		require.NoError(t, enc.ReconstructData(from))
		require.True(t, bytes.Equal(want[0], from[0]), "shard 0 as decoded without parity shard %d", drop)
	}
	got[0] = want[0]
	agree, err := enc.Verify(got)
	require.NoError(t, err)
	require.True(t, agree, "the shards are one consistent code")
}

// TestRefilledShardHeld: a data shard's new home that a switch-over
// left forwarding (switchOK told it to, then failed to tell another home
// and put it back REBUILDING) is filled again by the next rebuild; that
// fill has it stop forwarding and its clients only read it, so that the
// fill's writes are not sent to the parity shards as deltas and no client
// write races them. The shards hold their bytes afterwards.
func TestRefilledShardHeld(t *testing.T) {
	const size = 2 << 20
	rs := newRedundantSim(t, 9, size, func(oh *simHost) { oh.cfg.RebuildRate = 256 << 10 })
	sc, origin := rs.sc, rs.oh.daemon()
	victim, crashed := rs.crashShard0(t, false)
	ids := map[*simHost][]uint64{rs.oh: {rs.ecID}}
	sc.waitRebuilt(t, ids, victim, crashed, time.Minute)
	r, _ := origin.pool.redundantRecord(rs.ecID)
	h := r.Homes[0]
	held := func() (forwards, readOnly bool) { return homeHeld(t, sc, h) }
	require.Eventually(t, func() bool { // the record says OK before the switch's replicate ends
		forwards, _ := held()
		return forwards
	}, time.Minute, 5*time.Millisecond, "the rebuilt data shard does not forward")

	require.NoError(t, origin.pool.setHome(rs.ecID, 0, h, func(x *homeRef) { x.State = poolv1.HomeState_HOME_STATE_REBUILDING }))
	origin.pool.rebuildSoon(rs.ecID)
	require.Eventually(t, func() bool {
		r, _ := origin.pool.redundantRecord(rs.ecID)
		return r.Homes[0].State == poolv1.HomeState_HOME_STATE_REBUILDING && r.Homes[0].Rebuilt > 0
	}, time.Minute, 5*time.Millisecond, "the shard's second fill does not begin")
	forwards, readOnly := held()
	require.False(t, forwards, "refilled, the new home forwards the fill's writes")
	require.True(t, readOnly, "refilled, the new home takes clients' writes")
	state, _ := sc.waitRebuilt(t, ids, victim, crashed, time.Minute)
	require.Equal(t, 1, state.ok)

	r, _ = origin.pool.redundantRecord(rs.ecID)
	require.Equal(t, h.HomeID, r.Homes[0].HomeID, "the same new home, filled again")
	rs.checkShards(t)
}

// crashShard0 crashes the host of the coded segment's data shard 0 and
// says which and when; with fill, it then waits until the shard's
// rebuild has copied some bytes.
func (rs *redundantSim) crashShard0(t *testing.T, fill bool) (victim string, crashed time.Time) {
	victim, crashed = rs.ec.Homes[0].Node, time.Now()
	rs.sc.crash(rs.sc.host(victim))
	origin := rs.oh.daemon()
	require.Eventually(t, func() bool {
		r, _ := origin.pool.redundantRecord(rs.ecID)
		return !fill || r.Homes[0].State == poolv1.HomeState_HOME_STATE_REBUILDING && r.Homes[0].Rebuilt > 0
	}, time.Minute, 5*time.Millisecond, "the shard's rebuild does not begin")
	return victim, crashed
}

// checkShards checks that every shard of the coded segment holds the
// bytes written.
func (rs *redundantSim) checkShards(t *testing.T) {
	origin := rs.oh.daemon()
	r, _ := origin.pool.redundantRecord(rs.ecID)
	for i, x := range r.Homes {
		require.True(t, bytes.Equal(rs.ecWant[i], homeBytes(t.Context(), t, origin, x, rs.ec.shardSize())), "shard %d", i)
	}
}

// homeHeld reports how home h's daemon has it written: forwarding, and
// its clients only reading it.
func homeHeld(t *testing.T, sc *simCluster, h homeRef) (forwards, readOnly bool) {
	p := sc.host(h.Node).daemon().pool
	p.mu.Lock()
	defer p.mu.Unlock()
	seg := p.segs[h.HomeID]
	require.NotNil(t, seg, "the home on %s", h.Node)
	return seg.Forwards, seg.ReadOnly
}

// TestFailedSwitchHeld: a rebuild's switch-over whose replicate fails
// after telling the data shard's new home to forward (here data home 1
// refuses it as stale) puts the home back REBUILDING and has it stop
// forwarding and its clients only read it at once, not at the next fill:
// writes to the lost shard go through the origin meanwhile
// (WriteLostShard), and a client's write at the new home would send the
// parity shards a change from bytes that lack them. Data home 1 then
// takes the replicate, and the shards hold their bytes.
func TestFailedSwitchHeld(t *testing.T) {
	const size = 4 << 20
	rs := newRedundantSim(t, 9, size, func(oh *simHost) { oh.cfg.RebuildRate = 256 << 10 })
	sc, origin := rs.sc, rs.oh.daemon()
	victim, crashed := rs.crashShard0(t, true)
	d1 := rs.ec.Homes[1]
	epoch := func(e uint64) (was uint64) {
		p := sc.host(d1.Node).daemon().pool
		p.mu.Lock()
		defer p.mu.Unlock()
		was, p.segs[d1.HomeID].Epoch = p.segs[d1.HomeID].Epoch, e
		return was
	}
	was := epoch(1 << 40)
	failed := func() bool {
		var m dto.Metric
		require.NoError(t, origin.metrics.rebuilds.runs.WithLabelValues("failed").Write(&m))
		return m.GetCounter().GetValue() > 0
	}
	require.Eventually(t, failed, time.Minute, time.Millisecond, "the switch-over does not fail")
	r, _ := origin.pool.redundantRecord(rs.ecID)
	require.Equal(t, poolv1.HomeState_HOME_STATE_REBUILDING, r.Homes[0].State)
	forwards, readOnly := homeHeld(t, sc, r.Homes[0])
	require.False(t, forwards, "after the failed switch-over, the new home forwards")
	require.True(t, readOnly, "after the failed switch-over, the new home takes clients' writes")

	epoch(was)
	state, _ := sc.waitRebuilt(t, map[*simHost][]uint64{rs.oh: {rs.ecID}}, victim, crashed, time.Minute)
	require.Equal(t, 1, state.ok)
	rs.checkShards(t)
}

// TestRebuiltHomeKnowsAttachers: a copy that a rebuild or a home's move
// places is told the clients attached to the segment, not its owner alone:
// after the backup's host crashed and the copy was rebuilt elsewhere, and
// after the primary's host evacuated, each new home lets the attacher use
// it (it reads it after a failover, and the home keeps its forwarded
// answers).
func TestRebuiltHomeKnowsAttachers(t *testing.T) {
	sc := newSimCluster(t, simHostConfig{hosts: 5, leaseTTL: 10 * time.Second, timing: pushPullEverySecond})
	for _, h := range sc.hosts {
		h.cfg.GossipProfile = cluster.ProfileLocal // failure detection in about a second
	}
	oh := sc.hosts[3]
	sc.startDrainedOrigin(t, oh)
	origin := oh.daemon()
	ctx := t.Context()
	dial := func(id string) (*session.Conn, context.Context) {
		conn, err := session.Dial(ctx, "unix", oh.cfg.Socket, session.Options{ClientID: id})
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		cctx, _, err := conn.Call(ctx)
		require.NoError(t, err)
		return conn, cctx
	}
	owner, ownerCtx := dial("owner")
	seg, err := owner.API().Alloc(ownerCtx, &poolv1.AllocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_RDMA, Name: "shared-copies", Redundancy: &poolv1.Redundancy{Replicas: 2}})
	require.NoError(t, errs.FromStatus(err))
	reader, readerCtx := dial("reader")
	_, err = reader.API().Attach(readerCtx, &poolv1.AttachRequest{Name: "shared-copies"})
	require.NoError(t, errs.FromStatus(err))
	before, ok := origin.pool.redundantRecord(seg.Id)
	require.True(t, ok)
	gone := before.Homes[1].Node
	crashed := time.Now()
	sc.crash(sc.host(gone))
	sc.waitRebuilt(t, map[*simHost][]uint64{oh: {seg.Id}}, gone, crashed, 2*time.Minute)

	// newHome checks the home of the segment's record that was not among
	// was's: it lets the attacher use its copy.
	newHome := func(was record, why string) record {
		now, ok := origin.pool.redundantRecord(seg.Id)
		require.True(t, ok)
		i := slices.IndexFunc(now.Homes, func(h homeRef) bool { return !was.homedOn(h.Node) })
		require.GreaterOrEqual(t, i, 0, "a new home: %s", homesString(now.Homes))
		h := now.Homes[i]
		home := sc.host(h.Node).daemon().pool
		require.Eventually(t, func() bool {
			r, err := home.Stat(h.HomeID)
			return err == nil && slices.Contains(r.Delegates, "reader")
		}, time.Minute, 20*time.Millisecond, "the %s copy on %s lets the attacher use it", why, h.Node)
		return now
	}
	after := newHome(before, "rebuilt")

	x := sc.host(after.Homes[0].Node)
	conn, err := session.Channel("unix", x.cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = poolv1.NewPoolClient(conn).Drain(dctx, &poolv1.DrainRequest{Evacuate: true})
	cancel()
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		r, ok := origin.pool.redundantRecord(seg.Id)
		return ok && !r.homedOn(x.name) && r.redundancyState() == poolv1.RedundancyState_REDUNDANCY_STATE_OK
	}, 2*time.Minute, 20*time.Millisecond, "the primary's home moves off %s", x.name)
	newHome(after, "moved")
}
