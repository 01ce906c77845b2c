package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/probe"
	"github.com/farmem/farmem/rdma/tcp"
)

// runRedundancyFigures turns TestRedundancyFigures on: it measures, it checks
// nothing a busy machine could fail.
var runRedundancyFigures = flag.Bool("redundancy-figures", false, "run TestRedundancyFigures, which prints the costs of redundant segments (README, Redundant segments)")

// TestRedundancyFigures prints what redundancy costs, as ratios against an
// unreplicated rdma segment on the copies' primary home, each op measured
// in turn with the same op there: 4 KiB WriteAt and ReadAt p50 of a
// Replicas(2) and an ErasureCoded(4, 2) segment; the far memory each holds
// per byte of data (from the lenders' free bytes); and, after kill -9 of
// one data home, the p50 of a degraded 4 KiB read (decoded from the other
// shards) against a read of a live shard. Beside them, rows with no
// redundancy that show where the costs come from: "none, 4 homes", four
// unreplicated segments on the coded segment's four data homes, each 4 KiB
// chunk on the home its shard is on (the coded segment's pattern of
// daemons without its code); and the floors under any protocol of
// redundancy, which must get a write's bytes to every copy, or to a data
// home and every parity home, and hear back: "none, 2 at once", a 4 KiB
// WriteAt to each of two unreplicated segments on the copies' two homes in
// parallel (one on the calling goroutine, one on another), done when both
// are, and "none, 2 in turn", the same two writes one after the other;
// "none, 3 at once", the same to the chunk's data home and the two
// parity homes; and, beside the degraded read, 4 KiB ReadAt of
// unreplicated segments on the five live homes at once (a degraded read
// reads the same five shards). One client of a lender-less daemon, six
// lending daemons on loopback, read-ahead off; once with busy polling as
// by default (client and daemons), once with it off everywhere: seven
// daemons polling on a small machine take its cores from each other.
//
//	go test -run TestRedundancyFigures -v ./cmd/poold -args -redundancy-figures
func TestRedundancyFigures(t *testing.T) {
	if !*runRedundancyFigures {
		t.Skip("measures rather than checks: run with -args -redundancy-figures")
	}
	t.Run("busy-poll", func(t *testing.T) { redundancyFigures(t, tcp.DefaultBusyPoll) })
	t.Run("no-busy-poll", func(t *testing.T) { redundancyFigures(t, 0) })
}

// redundancyFigures measures and prints the figures with poll as the
// client's and the daemons' busy polling.
func redundancyFigures(t *testing.T, poll time.Duration) {
	rc := startRedCluster(t, 6, "64MiB", "--data-busy-poll", poll.String())
	ctx := t.Context()
	c, err := alloc.Dial(ctx, rc.na.sock, alloc.WithReadAhead(false), alloc.WithBusyPoll(poll))
	require.NoError(t, err)
	defer c.Close()
	const size = 8 << 20
	before := rc.lentBytes(t)
	rep, err := c.Alloc(ctx, size, alloc.WithRedundancy(alloc.Replicas(2)))
	require.NoError(t, err)
	repHeld := float64(rc.lentBytes(t)-before) / float64(rep.Size())
	// The unreplicated segment on the copies' primary home, where the
	// replicated segment's reads go: which host a segment lands on is not
	// what its redundancy costs.
	plain := allocOn(t, c, size, rep.Redundancy().Homes[0].Node)
	beforeEC := rc.lentBytes(t)
	ec, err := c.Alloc(ctx, size, alloc.WithRedundancy(alloc.ErasureCoded(4, 2)))
	require.NoError(t, err)
	held := float64(rc.lentBytes(t)-beforeEC) / float64(ec.Size())
	// The same access pattern as the coded segment's without its code: a
	// quarter of the data on each of its four data homes, unreplicated, so
	// that each 4 KiB operation goes to one of the same four daemons.
	var spread [4]*alloc.Segment
	for i := range spread {
		spread[i] = allocOn(t, c, size/4, ec.Redundancy().Homes[i].Node)
	}
	// Unreplicated segments on the copies' homes (the primary's is plain)
	// and on the parity homes, for the floors.
	pair := [2]*alloc.Segment{plain, allocOn(t, c, size, rep.Redundancy().Homes[1].Node)}
	var parity [2]*alloc.Segment
	for i := range parity {
		parity[i] = allocOn(t, c, size/4, ec.Redundancy().Homes[4+i].Node)
	}
	for _, s := range slices.Concat([]*alloc.Segment{plain, rep, ec, pair[1]}, spread[:], parity[:]) {
		_, err := s.WriteAt(make([]byte, s.Size()), 0) // every page touched at every home
		require.NoError(t, err)
	}
	onSpread := func(op func(*alloc.Segment) func([]byte, int64) (int, error)) func([]byte, int64) (int, error) {
		return func(p []byte, off int64) (int, error) {
			chunk := off / 4096
			return op(spread[chunk%4])(p, chunk/4*4096)
		}
	}

	// The floors write the same bytes to several segments at once: each
	// chunk to the segments of the pair, or to its data home's quarter and
	// to the two parity homes' segments at the chunk's stripe.
	twoAtOnce := func(p []byte, off int64) (int, error) {
		return len(p), atOnce(func() error { _, err := pair[0].WriteAt(p, off); return err },
			func() error { _, err := pair[1].WriteAt(p, off); return err })
	}
	twoInTurn := func(p []byte, off int64) (int, error) {
		if _, err := pair[0].WriteAt(p, off); err != nil {
			return 0, err
		}
		return pair[1].WriteAt(p, off)
	}
	threeAtOnce := func(p []byte, off int64) (int, error) {
		chunk := off / 4096
		at := chunk / 4 * 4096
		return len(p), atOnce(func() error { _, err := spread[chunk%4].WriteAt(p, at); return err },
			func() error { _, err := parity[0].WriteAt(p, at); return err },
			func() error { _, err := parity[1].WriteAt(p, at); return err })
	}

	// Each row is measured against an unreplicated segment on the same
	// home, op by op in turn with it (the row's op and the same op
	// there), in rounds of 100 writes and 100 reads per row: a daemon that
	// slept since its last op pays for waking up, so what comes before an
	// op weighs as much as the op, and in turn both see the same. The
	// copies' against the segment on their primary's home; the coded
	// segment's against the quarter of the spread segments on the chunk's
	// data home, and against the segment on one home too.
	type ops struct {
		write, read func([]byte, int64) (int, error)
	}
	onePlain := ops{plain.WriteAt, plain.ReadAt}
	dataHome := ops{onSpread(func(s *alloc.Segment) func([]byte, int64) (int, error) { return s.WriteAt }),
		onSpread(func(s *alloc.Segment) func([]byte, int64) (int, error) { return s.ReadAt })}
	type row struct {
		name, vs  string
		ops, base ops
	}
	rows := []row{{"replicas=2", "same home", ops{rep.WriteAt, rep.ReadAt}, onePlain},
		{"ec=4+2", "same home", ops{ec.WriteAt, ec.ReadAt}, dataHome},
		{"ec=4+2", "one home", ops{ec.WriteAt, ec.ReadAt}, onePlain},
		{"none, 2 at once", "same home", ops{twoAtOnce, nil}, onePlain},
		{"none, 2 in turn", "same home", ops{twoInTurn, nil}, onePlain},
		{"none, 3 at once", "same home", ops{threeAtOnce, nil}, dataHome}}
	type samples struct{ write, read, baseWrite, baseRead []time.Duration }
	got := make([]samples, len(rows))
	buf := make([]byte, 4096)
	rnd := rand.New(rand.NewPCG(5, 6))
	timed := func(into *[]time.Duration, op func([]byte, int64) (int, error), off int64) {
		start := time.Now()
		_, err := op(buf, off)
		*into = append(*into, time.Since(start))
		require.NoError(t, err)
	}
	// Which of the two goes first alternates too: the second op of a pair
	// finds its daemon awake when both go to the same one.
	inTurn := func(j int, into, baseInto *[]time.Duration, op, base func([]byte, int64) (int, error)) {
		off := int64(rnd.IntN(size/4096)) * 4096
		if j%2 == 0 {
			timed(into, op, off)
			timed(baseInto, base, off)
		} else {
			timed(baseInto, base, off)
			timed(into, op, off)
		}
	}
	for range 20 {
		for i, r := range rows {
			for j := range 100 {
				inTurn(j, &got[i].write, &got[i].baseWrite, r.ops.write, r.base.write)
			}
			for j := range 100 {
				if r.ops.read == nil { // a floor of writes only
					break
				}
				inTurn(j, &got[i].read, &got[i].baseRead, r.ops.read, r.base.read)
			}
		}
	}

	// Degraded: a data shard's home gone, its chunks decoded from the
	// others; chunks of live data shards read as before.
	lost := ec.Redundancy().Homes[1].Node
	rc.lenders[lost].kill9(t)
	live := []*alloc.Segment{spread[0], spread[2], spread[3], parity[0], parity[1]}
	bufs := make([][]byte, len(live))
	reads5 := make([]func() error, len(live))
	for i := range live {
		bufs[i] = make([]byte, 4096)
	}
	var normal, degraded, floor []time.Duration
	for j := range 2000 {
		stripe := int64(rnd.IntN(size / (4 * 4096)))
		shard := rnd.IntN(4)
		read := func() time.Duration {
			start := time.Now()
			_, err := ec.ReadAt(buf, (stripe*4+int64(shard))*4096)
			require.NoError(t, err)
			return time.Since(start)
		}
		if shard != 1 {
			normal = append(normal, read())
			continue
		}
		// The degraded read and its floor in turn, which first
		// alternating: the second finds the same five daemons awake.
		for i, s := range live {
			reads5[i] = func() error { _, err := s.ReadAt(bufs[i], stripe*4096); return err }
		}
		atFloor := func() {
			start := time.Now()
			err := atOnce(reads5...)
			floor = append(floor, time.Since(start))
			require.NoError(t, err)
		}
		if j%2 == 1 {
			atFloor()
		}
		degraded = append(degraded, read())
		if j%2 == 0 {
			atFloor()
		}
	}
	n, dg, fl := probe.Summarize(normal), probe.Summarize(degraded), probe.Summarize(floor)

	var out strings.Builder
	fmt.Fprintf(&out, "4 KiB p50 (µs), each against an unreplicated segment   write    none   ratio     read    none   ratio\n")
	for i, r := range rows {
		w, bw := probe.Summarize(got[i].write), probe.Summarize(got[i].baseWrite)
		fmt.Fprintf(&out, "%-18s on the %-9s                         %8.1f %7.1f %7.2f", r.name, r.vs, us(w.P50), us(bw.P50), ratio(w.P50, bw.P50))
		if r.ops.read == nil {
			fmt.Fprintf(&out, " %8s %7s %7s\n", "-", "-", "-")
			continue
		}
		rd, br := probe.Summarize(got[i].read), probe.Summarize(got[i].baseRead)
		fmt.Fprintf(&out, " %8.1f %7.1f %7.2f\n", us(rd.P50), us(br.P50), ratio(rd.P50, br.P50))
	}
	fmt.Fprintf(&out, "far memory held per byte: replicas=2 %.2f, ec=4+2 %.2f\n", repHeld, held)
	fmt.Fprintf(&out, "ec=4+2 with data shard 1's home killed: degraded read p50 %.1f µs, live-shard read p50 %.1f µs, ratio %.2f (%d and %d reads)\n",
		us(dg.P50), us(n.P50), ratio(dg.P50, n.P50), dg.Samples, n.Samples)
	fmt.Fprintf(&out, "none, 5 reads at once on the five live homes: p50 %.1f µs, ratio %.2f to the live-shard read\n", us(fl.P50), ratio(fl.P50, n.P50))
	t.Log("\n" + out.String())
}

// lentBytes is how many bytes the lenders lend now, each asked for its
// own rdma tier.
func (rc *redCluster) lentBytes(t *testing.T) int64 {
	var used int64
	names := make([]string, 0, len(rc.lenders))
	for name := range rc.lenders {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		capacity, free, err := ownRDMA(t.Context(), rc.lenders[name].socket, name)
		require.NoError(t, err)
		used += capacity - free
	}
	return used
}

// allocOn allocates an unreplicated rdma segment of size on node.
func allocOn(t *testing.T, c *alloc.Client, size int64, node string) *alloc.Segment {
	s, err := c.Alloc(t.Context(), size, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	if s.Node() != node {
		require.NoError(t, c.Move(t.Context(), s, alloc.ToNode(node)))
	}
	return s
}

// atOnce runs ops in parallel, the first on the calling goroutine, and
// returns when all have, with the first error.
func atOnce(ops ...func() error) error {
	errc := make(chan error, len(ops)-1)
	for _, op := range ops[1:] {
		go func() { errc <- op() }()
	}
	err := ops[0]()
	for range ops[1:] {
		if e := <-errc; err == nil {
			err = e
		}
	}
	return err
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }
