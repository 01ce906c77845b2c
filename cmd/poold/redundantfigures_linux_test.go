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
// unreplicated rdma segment measured in the same run: 4 KiB WriteAt and
// ReadAt p50 of a Replicas(2) and an ErasureCoded(4, 2) segment, the far
// memory the coded segment holds per byte of data (from the lenders' free
// bytes), and, after kill -9 of one data home, the p50 of a degraded 4 KiB
// read (decoded from four shards) against a read of a live shard. Beside
// them, "none, 4 homes": four unreplicated segments on the coded segment's
// four data homes, each 4 KiB chunk on the home its shard is on, which
// sends each operation to one of the same four daemons with no code of
// redundancy in the way. The segments are measured in turns of 100
// writes and then 100 reads each, so that the machine's other load falls
// on all of them alike. One client of a lender-less daemon, six lending
// daemons on loopback, read-ahead off; once with busy polling as by
// default (client and daemons), once with it off everywhere: seven
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
	plain, err := c.Alloc(ctx, size, alloc.WithTier(alloc.TierRDMA))
	require.NoError(t, err)
	rep, err := c.Alloc(ctx, size, alloc.WithRedundancy(alloc.Replicas(2)))
	require.NoError(t, err)
	afterRep := rc.lentBytes(t)
	ec, err := c.Alloc(ctx, size, alloc.WithRedundancy(alloc.ErasureCoded(4, 2)))
	require.NoError(t, err)
	held := float64(rc.lentBytes(t)-afterRep) / float64(ec.Size())
	repHeld := float64(afterRep-before-plain.Size()) / float64(rep.Size())
	// The same access pattern as the coded segment's without its code: a
	// quarter of the data on each of its four data homes, unreplicated, so
	// that each 4 KiB operation goes to one of the same four daemons.
	var spread [4]*alloc.Segment
	for i := range spread {
		spread[i], err = c.Alloc(ctx, size/4, alloc.WithTier(alloc.TierRDMA))
		require.NoError(t, err)
		if home := ec.Redundancy().Homes[i].Node; spread[i].Node() != home {
			require.NoError(t, c.Move(ctx, spread[i], alloc.ToNode(home)))
		}
	}
	for _, s := range append([]*alloc.Segment{plain, rep, ec}, spread[:]...) {
		_, err := s.WriteAt(make([]byte, s.Size()), 0) // every page touched at every home
		require.NoError(t, err)
	}
	onSpread := func(op func(*alloc.Segment) func([]byte, int64) (int, error)) func([]byte, int64) (int, error) {
		return func(p []byte, off int64) (int, error) {
			chunk := off / 4096
			return op(spread[chunk%4])(p, chunk/4*4096)
		}
	}

	type measured struct {
		write, read func([]byte, int64) (int, error)
	}
	segs := []measured{{plain.WriteAt, plain.ReadAt}, {rep.WriteAt, rep.ReadAt}, {ec.WriteAt, ec.ReadAt},
		{onSpread(func(s *alloc.Segment) func([]byte, int64) (int, error) { return s.WriteAt }),
			onSpread(func(s *alloc.Segment) func([]byte, int64) (int, error) { return s.ReadAt })}}
	writes, reads := make([][]time.Duration, len(segs)), make([][]time.Duration, len(segs))
	buf := make([]byte, 4096)
	rnd := rand.New(rand.NewPCG(5, 6))
	timed := func(into *[]time.Duration, op func([]byte, int64) (int, error)) {
		off := int64(rnd.IntN(size/4096)) * 4096
		start := time.Now()
		_, err := op(buf, off)
		*into = append(*into, time.Since(start))
		require.NoError(t, err)
	}
	for range 20 {
		for i, s := range segs {
			for range 100 {
				timed(&writes[i], s.write)
			}
			for range 100 {
				timed(&reads[i], s.read)
			}
		}
	}
	w, r := summarize(writes), summarize(reads)

	// Degraded: a data shard's home gone, its chunks decoded from the
	// others; chunks of live data shards read as before.
	lost := ec.Redundancy().Homes[1].Node
	rc.lenders[lost].kill9(t)
	var normal, degraded []time.Duration
	for range 2000 {
		stripe := int64(rnd.IntN(size / (4 * 4096)))
		shard := rnd.IntN(4)
		start := time.Now()
		_, err := ec.ReadAt(buf, (stripe*4+int64(shard))*4096)
		d := time.Since(start)
		require.NoError(t, err)
		if shard == 1 {
			degraded = append(degraded, d)
		} else {
			normal = append(normal, d)
		}
	}
	n, dg := probe.Summarize(normal), probe.Summarize(degraded)

	var out strings.Builder
	fmt.Fprintf(&out, "4 KiB p50 (µs)         write   ratio   read   ratio\n")
	for i, name := range []string{"none", "replicas=2", "ec=4+2", "none, 4 homes"} {
		fmt.Fprintf(&out, "%-20s %8.1f %7.2f %6.1f %7.2f\n", name, us(w[i].P50), ratio(w[i].P50, w[0].P50), us(r[i].P50), ratio(r[i].P50, r[0].P50))
	}
	fmt.Fprintf(&out, "far memory held per byte: replicas=2 %.2f, ec=4+2 %.2f\n", repHeld, held)
	fmt.Fprintf(&out, "ec=4+2 with data shard 1's home killed: degraded read p50 %.1f µs, live-shard read p50 %.1f µs, ratio %.2f (%d and %d reads)\n",
		us(dg.P50), us(n.P50), ratio(dg.P50, n.P50), dg.Samples, n.Samples)
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

func summarize(runs [][]time.Duration) []probe.Result {
	out := make([]probe.Result, len(runs))
	for i, ds := range runs {
		out[i] = probe.Summarize(ds)
	}
	return out
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }
