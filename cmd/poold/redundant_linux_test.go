package main

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/coherence/lincheck"
	"github.com/farmem/farmem/internal/certs"
)

// redCluster is real poolds on loopback for the redundancy tests: a, whose
// clients allocate and which lends nothing, and lenders b, c, ..., each
// lending export bytes: one distinct host per copy or shard.
type redCluster struct {
	na      gossipNode
	a       *daemon
	lenders map[string]*daemon
	started []*daemon
}

// startRedCluster starts a and n lenders (extra: more flags of each) and waits until every one of
// them sees every lender alive with memory to lend.
func startRedCluster(t *testing.T, n int, export string, extra ...string) *redCluster {
	rc := &redCluster{na: tlsGossip(t, "a"), lenders: map[string]*daemon{}}
	key := certs.GossipKeyFile(certDir(t))
	t.Cleanup(func() {
		for _, d := range rc.started {
			if strings.Contains(d.log.String(), "DATA RACE") {
				t.Errorf("poold %s reported a data race", d.socket)
			}
		}
	})
	// The origin rebuilds no lost home (TestRebuildAfterHostLoss checks
	// rebuilds): the kills' degraded states stay for the tests to see.
	rc.a = rc.start(t, rc.na, slices.Concat(rc.na.args(), []string{"--gossip-key-file", key, "--export-size", "0", "--rebuild=false"}, extra)...)
	for i := range n {
		ln := tlsGossip(t, string(rune('b'+i)))
		rc.lenders[ln.name] = rc.start(t, ln, slices.Concat(ln.args(), []string{"--gossip-key-file", key, "--export-size", export, "--join", rc.na.gossip}, extra)...)
	}
	names := make([]string, 0, n)
	for name := range rc.lenders {
		names = append(names, name)
	}
	for _, d := range rc.started { // each homes copies and forwards to the others
		waitLenders(t, d.socket, names...)
	}
	return rc
}

// waitLenders waits until the daemon on sock sees every node of names
// alive with rdma memory to lend.
func waitLenders(t *testing.T, sock string, names ...string) {
	require.Eventually(t, func() bool {
		var nodes []nodeView
		if memctlJSON(t.Context(), sock, &nodes, "nodes") != nil {
			return false
		}
		lending := 0
		for _, nv := range nodes {
			for _, ti := range nv.Tiers {
				if nv.State == "alive" && slices.Contains(names, nv.Name) && ti.Tier == "rdma" && ti.Free > 0 {
					lending++
				}
			}
		}
		return lending == len(names)
	}, 30*time.Second, 50*time.Millisecond, "the daemon on %s never saw %v lend memory", sock, names)
}

func (rc *redCluster) start(t *testing.T, n gossipNode, args ...string) *daemon {
	d := startDaemon(t, n.data, n.sock, args...)
	rc.started = append(rc.started, d)
	return d
}

// client dials a as client id, closed when the test ends.
func (rc *redCluster) client(t *testing.T, id string) *alloc.Client {
	c, err := alloc.Dial(t.Context(), rc.na.sock, alloc.WithClientID(id), alloc.WithFailoverTimeout(time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// detectionBound is how long, at most, the gossip profile these daemons
// run (--gossip-profile local) takes for one member of a cluster of n to
// declare a killed member dead on its own: until it probes the member
// (memberlist probes its members in turn, in an order it shuffles at each
// pass, so within 2(n-1) probe intervals), the probe's timeout, and
// memberlist's longest suspicion timeout (SuspicionMaxTimeoutMult ×
// SuspicionMult × max(1, log10 n) × probe interval), the one a suspicion
// no other member confirms runs to. Others' suspicions and death notices
// usually come sooner, but not always: a member ignores those that carry
// an older incarnation of the dead member than it knows (it saw a
// refutation they missed), and under load gossip can be late (a CI run
// saw the origin declare a killed member dead 23.5 s after the kill, on
// its own, 13 s after the others). A bound from the configuration, not a
// measurement.
func detectionBound(n int) time.Duration {
	c := memberlist.DefaultLocalConfig()
	scale := math.Max(1, math.Log10(float64(n)))
	suspicion := time.Duration(float64(c.SuspicionMaxTimeoutMult*c.SuspicionMult) * scale * float64(c.ProbeInterval))
	return time.Duration(2*(n-1))*c.ProbeInterval + c.ProbeTimeout + suspicion
}

// homeNodes are the nodes of seg's homes, in order.
func homeNodes(seg *alloc.Segment) []string {
	var out []string
	for _, h := range seg.Redundancy().Homes {
		out = append(out, h.Node)
	}
	return out
}

// blockLoad writes 4 KiB blocks of a segment at random, one goroutine,
// each write followed by a read of the block, and keeps the account the
// final check needs: the last acknowledged fill of each block, the fills
// of later writes that failed (they may or may not have landed), and the
// longest operation.
type blockLoad struct {
	seg    *alloc.Segment
	acked  map[int64]byte
	maybe  map[int64][]byte
	ops    int
	failed int
	maxOp  time.Duration
	errs   []error // reads that failed or saw bytes no write left
	mu     sync.Mutex
}

const blockSize = 4096

// run writes and reads until stop; fail says whether a failed write is an
// error of the test (true) or an unacknowledged write to account for.
func (l *blockLoad) run(stop <-chan struct{}, seed uint64, failWrite func(error) bool) {
	rnd := rand.New(rand.NewPCG(seed, 3))
	buf, got := make([]byte, blockSize), make([]byte, blockSize)
	blocks := int(l.seg.Size() / blockSize)
	for fill := byte(1); ; fill = fill%250 + 1 {
		select {
		case <-stop:
			return
		default:
		}
		off := int64(rnd.IntN(blocks)) * blockSize
		for i := range buf {
			buf[i] = fill
		}
		start := time.Now()
		_, err := l.seg.WriteAt(buf, off)
		l.took(start)
		l.mu.Lock()
		if err != nil {
			if failWrite(err) {
				l.errs = append(l.errs, fmt.Errorf("write at %d: %w", off, err))
			}
			l.maybe[off] = append(l.maybe[off], fill)
			l.failed++
		} else {
			l.acked[off] = fill
			delete(l.maybe, off)
		}
		l.mu.Unlock()
		start = time.Now()
		_, err = l.seg.ReadAt(got, off)
		l.took(start)
		l.mu.Lock()
		if err == nil {
			err = l.holds(off, got)
		}
		if err != nil {
			l.errs = append(l.errs, fmt.Errorf("read at %d: %w", off, err))
		}
		l.ops += 2
		l.mu.Unlock()
	}
}

// took notes an operation that started at start.
func (l *blockLoad) took(start time.Time) {
	d := time.Since(start)
	l.mu.Lock()
	l.maxOp = max(l.maxOp, d)
	l.mu.Unlock()
}

// holds checks that a block read as got: its last acknowledged fill (zero
// if none), or a fill of a failed write after it. l.mu is held.
func (l *blockLoad) holds(off int64, got []byte) error {
	ok := append([]byte{l.acked[off]}, l.maybe[off]...)
	if bytes.Count(got, got[:1]) != len(got) || !slices.Contains(ok, got[0]) {
		return fmt.Errorf("block at %d holds %d..%d; the acknowledged fill is %d, failed writes since: %v", off, got[0], got[len(got)-1], l.acked[off], l.maybe[off])
	}
	return nil
}

// String is the load's account so far, for a failing test's message.
func (l *blockLoad) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprintf("segment %d: %d operations, %d writes failed, longest %v, errors %v", l.seg.ID(), l.ops, l.failed, l.maxOp, l.errs[max(0, len(l.errs)-3):])
}

// count is how many operations ran so far.
func (l *blockLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.ops
}

// check reads every block back after the load stopped.
func (l *blockLoad) check(t *testing.T) {
	l.mu.Lock()
	defer l.mu.Unlock()
	require.Empty(t, l.errs, "segment %d: operations failed or read bytes never written", l.seg.ID())
	got := make([]byte, blockSize)
	for off := int64(0); off < l.seg.Size(); off += blockSize {
		_, err := l.seg.ReadAt(got, off)
		require.NoError(t, err)
		require.NoError(t, l.holds(off, got))
	}
}

// TestRedundantSegmentsSurviveKill9: a Replicas(2) and an
// ErasureCoded(4, 2) segment on six lenders, each written and read by a
// loop of its own; mid-loop kill -9 of the replicated segment's primary's
// daemon and of one more home of the coded one (two of its six homes
// gone, one of them a data shard's). Every read succeeds and sees the last acknowledged write (copies
// fail over, the coded segment decodes lost shards); a write to the
// copies cut off by the kill is retried at the promoted primary and
// succeeds, or fails with ErrIndeterminate when that primary holds no
// answer for it; a write to a coded chunk whose data home is gone fails
// at once with ErrUnavailable. Failed writes are accounted as
// maybe-applied. Afterwards every block holds its last
// acknowledged write, both segments report "degraded" with the killed
// homes lost, and no operation took longer than the gossip's
// failure-detection bound plus 1 s.
func TestRedundantSegmentsSurviveKill9(t *testing.T) {
	rc := startRedCluster(t, 6, "32MiB")
	c := rc.client(t, "redundant-kill")
	ctx := t.Context()
	rep, err := c.Alloc(ctx, 1<<20, alloc.WithRedundancy(alloc.Replicas(2)))
	require.NoError(t, err)
	ec, err := c.Alloc(ctx, 1<<20-100, alloc.WithRedundancy(alloc.ErasureCoded(4, 2)))
	require.NoError(t, err)
	require.Equal(t, int64(1<<20), ec.Size(), "padded to whole stripes of 4 chunks of 4 KiB")
	for _, tc := range []struct {
		seg   *alloc.Segment
		asked string
		homes int
	}{{rep, "replicas=2", 2}, {ec, "ec=4+2", 6}} {
		st := tc.seg.Redundancy()
		require.Equal(t, tc.asked, st.Asked.String())
		require.Equal(t, "ok", st.State)
		nodes := homeNodes(tc.seg)
		require.Len(t, nodes, tc.homes)
		slices.Sort(nodes)
		require.Len(t, slices.Compact(nodes), tc.homes, "one home per host: %v", homeNodes(tc.seg))
	}

	loads := []*blockLoad{
		{seg: rep, acked: map[int64]byte{}, maybe: map[int64][]byte{}},
		{seg: ec, acked: map[int64]byte{}, maybe: map[int64][]byte{}},
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		loads[0].run(stop, 1, func(err error) bool { return !errors.Is(err, alloc.ErrIndeterminate) })
	})
	wg.Go(func() {
		loads[1].run(stop, 2, func(err error) bool { return !errors.Is(err, alloc.ErrUnavailable) })
	})
	stopped := false
	halt := func() {
		if !stopped {
			stopped = true
			close(stop)
			wg.Wait()
		}
	}
	defer halt()
	progress := func(what string) {
		before := []int{loads[0].count(), loads[1].count()}
		require.Eventually(t, func() bool { return loads[0].count() > before[0]+100 && loads[1].count() > before[1]+100 },
			30*time.Second, 5*time.Millisecond, "the loads run %s: %s; %s", what, loads[0], loads[1])
	}
	progress("before the kills")

	// One of the two homes killed is a data home of the coded segment (its
	// chunks are then decoded), the other a parity home: a data home killed
	// mid-write may have updated one parity shard and not the other, and
	// decoding a second lost data shard from both would go wrong for those
	// bytes (the write hole Redundancy's documentation names).
	primary := homeNodes(rep)[0]
	want := "parity"
	for _, h := range ec.Redundancy().Homes {
		if h.Node == primary && h.Role == "parity" {
			want = "data"
		}
	}
	var second string
	for _, h := range ec.Redundancy().Homes {
		if second == "" && h.Role == want && !slices.Contains(homeNodes(rep), h.Node) {
			second = h.Node
		}
	}
	require.NotEmpty(t, second, "a %s home of the coded segment that holds no copy: %v", want, ec.Redundancy().Homes)
	killed := time.Now()
	rc.lenders[primary].kill9(t)
	rc.lenders[second].kill9(t)
	t.Logf("killed %s (primary of the copies, a home of the shards) and %s (a home of the shards)", primary, second)
	progress("after the kills")
	for _, seg := range []*alloc.Segment{rep, ec} {
		require.Eventually(t, func() bool { return seg.Redundancy().State == "degraded" }, 30*time.Second, 50*time.Millisecond,
			"segment %d is reported degraded: %+v", seg.ID(), seg.Redundancy())
		for _, h := range seg.Redundancy().Homes {
			require.Equal(t, h.Node == primary || h.Node == second, h.State == "lost", "segment %d home %+v", seg.ID(), h)
		}
	}
	t.Logf("both segments degraded %v after the kills", time.Since(killed))
	progress("degraded")
	halt()
	bound := detectionBound(len(rc.lenders)+1) + time.Second
	for _, l := range loads {
		l.check(t)
		t.Logf("segment %d (%s): %d operations, %d writes failed, longest %v (bound %v)", l.seg.ID(), l.seg.Redundancy().Asked, l.ops, l.failed, l.maxOp, bound)
		require.LessOrEqual(t, l.maxOp, bound, "segment %d: an operation blocked past failure detection + 1 s", l.seg.ID())
	}
}

// TestCodedWritesAfterDataHomeLoss: an ErasureCoded(4, 2) segment on six
// lenders, every block written, loses a data home's daemon to kill -9
// while idle (no host is left to rebuild on, so it stays degraded). The
// block loop then writes and reads across the whole segment: writes to
// the lost shard's chunks go through the daemon holding the record, which
// sends the parity shards the change, and none fails; every read sees the
// last write, decoded for the lost shard; afterwards every block holds
// its last write, and adds and a compare-and-swap on a word of the lost
// shard hold too.
func TestCodedWritesAfterDataHomeLoss(t *testing.T) {
	rc := startRedCluster(t, 6, "32MiB")
	c := rc.client(t, "coded-lost-writes")
	ctx := t.Context()
	seg, err := c.Alloc(ctx, 1<<20, alloc.WithRedundancy(alloc.ErasureCoded(4, 2)))
	require.NoError(t, err)
	l := &blockLoad{seg: seg, acked: map[int64]byte{}, maybe: map[int64][]byte{}}
	block := make([]byte, blockSize)
	for off := int64(0); off < seg.Size(); off += blockSize {
		for i := range block {
			block[i] = 251
		}
		_, err := seg.WriteAt(block, off)
		require.NoError(t, err)
		l.acked[off] = 251
	}
	var victim string
	for _, h := range seg.Redundancy().Homes {
		if victim == "" && h.Role == "data" {
			victim = h.Node
		}
	}
	rc.lenders[victim].kill9(t)
	require.Eventually(t, func() bool { return seg.Redundancy().State == "degraded" }, 30*time.Second, 50*time.Millisecond,
		"segment %d is reported degraded: %+v", seg.ID(), seg.Redundancy())

	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() { l.run(stop, 3, func(error) bool { return true }) })
	require.Eventually(t, func() bool { return l.count() > 400 }, 30*time.Second, 5*time.Millisecond, "the load runs: %s", l)
	close(stop)
	wg.Wait()
	l.check(t)
	require.Zero(t, l.failed, "writes failed: %s", l)
	t.Logf("%s, the data home on %s lost", l, victim)

	// Atomics on the lost shard's first word (the segment's, chunk 0 being
	// data shard 0's) go through the daemon too.
	v0, err := seg.Add64(0, 0)
	require.NoError(t, err)
	for range 50 {
		_, err := seg.Add64(0, 1)
		require.NoError(t, err)
	}
	swapped, err := seg.CompareAndSwap64(0, v0+50, 7)
	require.NoError(t, err)
	require.True(t, swapped, "the word holds the 50 adds")
	got, err := seg.Add64(0, 0)
	require.NoError(t, err)
	require.Equal(t, uint64(7), got)

	// What a write to the lost shard costs beside one to a live shard
	// (chunk 1 is data shard 1's), alternating: logged, a degraded path.
	var lost, live time.Duration
	for i := range 400 {
		off := int64(i%2) * blockSize
		start := time.Now()
		_, err := seg.WriteAt(block, off)
		require.NoError(t, err)
		if off == 0 {
			lost += time.Since(start)
		} else {
			live += time.Since(start)
		}
	}
	t.Logf("4 KiB write, mean of 200: %v to the lost shard, %v to a live one (%.1fx)", lost/200, live/200, float64(lost)/float64(live))
}

// TestReplicasLinearizableAcrossFailover: three clients share a named
// Replicas(2) segment: counters add, registers read, write and
// compare-and-swap, writers write blocks (moveLoad's workload), while the
// primary's daemon is killed with kill -9. No operation fails but with
// ErrIndeterminate (a write or atomic cut off by the kill whose retry the
// promoted primary had no answer for), the counter holds the acknowledged
// adds and at most the indeterminate ones besides (none applied twice by
// a retry at the promoted primary), every block its last acknowledged
// write or a later indeterminate one, and the history of the registers,
// indeterminate operations as unknown outcomes, is linearizable
// (porcupine).
func TestReplicasLinearizableAcrossFailover(t *testing.T) {
	rc := startRedCluster(t, 3, "32MiB")
	ctx := t.Context()
	seg, err := rc.client(t, "lin-0").Alloc(ctx, 4<<20, alloc.WithRedundancy(alloc.Replicas(2)), alloc.WithName("lin"))
	require.NoError(t, err)
	l := &moveLoad{seg: seg, rec: lincheck.NewRecorder(), tolerate: true}
	for i := range 3 {
		s := seg
		if i > 0 {
			s, err = rc.client(t, fmt.Sprintf("lin-%d", i)).Attach(ctx, "lin")
			require.NoError(t, err)
		}
		l.segs = append(l.segs, s)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	l.run(&wg, stop)
	defer func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	}()
	before := l.ops.Load()
	require.Eventually(t, func() bool { return l.ops.Load() > before+200 }, 20*time.Second, time.Millisecond, "the load runs")
	primary := homeNodes(seg)[0]
	rc.lenders[primary].kill9(t)
	require.Eventually(t, func() bool { return seg.Redundancy().State == "degraded" }, 30*time.Second, 50*time.Millisecond, "the segment is degraded")
	require.NotEqual(t, primary, seg.Node(), "a backup was promoted")
	before = l.ops.Load()
	require.Eventually(t, func() bool { return l.ops.Load() > before+200 }, 20*time.Second, time.Millisecond, "the load runs after the failover")
	close(stop)
	wg.Wait()
	l.check(t)
	t.Logf("%d operations, %d adds (%d indeterminate), %d register operations checked; primary %s killed, now %s",
		l.ops.Load(), l.adds.Load(), l.maybeAdds.Load(), len(l.rec.Ops()), primary, seg.Node())
}

// TestRedundancyRefusals: with three lenders, ErasureCoded(4, 2) is
// ErrNoCapacity naming the six hosts it needs and the three there are;
// Replicas(5).OrFewer gets three copies on three hosts and says so;
// Replicas(3) gets them; redundancy on the cxl tier and numbers out of
// range are ErrInvalid.
func TestRedundancyRefusals(t *testing.T) {
	rc := startRedCluster(t, 3, "16MiB")
	c := rc.client(t, "refusals")
	ctx := t.Context()
	_, err := c.Alloc(ctx, 1<<20, alloc.WithRedundancy(alloc.ErasureCoded(4, 2)))
	require.ErrorIs(t, err, alloc.ErrNoCapacity)
	require.Regexp(t, `needs 6 distinct hosts .* and 3 have them \(b, c, d\)`, err.Error())
	seg, err := c.Alloc(ctx, 1<<20, alloc.WithRedundancy(alloc.Replicas(5).OrFewer()))
	require.NoError(t, err)
	st := seg.Redundancy()
	require.Equal(t, 2, st.Asked.Survives(), "three copies: %+v", st)
	require.Len(t, st.Homes, 3)
	_, err = seg.WriteAt([]byte("three copies"), 0)
	require.NoError(t, err)
	seg, err = c.Alloc(ctx, 1<<20, alloc.WithRedundancy(alloc.Replicas(3)))
	require.NoError(t, err)
	require.Equal(t, "replicas=3", seg.Redundancy().Asked.String())
	for _, opts := range [][]alloc.AllocOption{
		{alloc.WithTier(alloc.TierCXL), alloc.WithRedundancy(alloc.Replicas(2))},
		{alloc.WithRedundancy(alloc.Replicas(0))},
		{alloc.WithRedundancy(alloc.ErasureCoded(4, 0))},
	} {
		_, err = c.Alloc(ctx, 1<<20, opts...)
		require.ErrorIs(t, err, alloc.ErrInvalid)
	}
}
