package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/bench"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/rdma/tcp"
)

// benchFlags are memctl bench's options.
type benchFlags struct {
	duration  time.Duration
	sizes     []string
	depths    []int
	ops       []string
	tiers     []string
	compare   bool
	memcached string
	redis     string
	plot      string
	plotSize  size.Size
	plotDepth int
	plotOp    string
	inProcess bool
	rounds    int
	busyPoll  time.Duration
}

// benchTier is a farmem tier and the system name its rows show.
type benchTier struct {
	system string
	tier   alloc.Tier
}

// benchTiers names farmem's tiers as bench rows show them.
var benchTiers = []benchTier{
	{"farmem-cxl", alloc.TierCXL},
	{"farmem-dram", alloc.TierLocal},
	{"farmem-rdma", alloc.TierRDMA},
}

func newBenchCmd(g *globals) *cobra.Command {
	f := benchFlags{plotSize: 4 * size.KiB}
	cmd := &cobra.Command{
		Use:   "bench [--compare [--memcached ADDR] [--redis ADDR]] [--plot FILE.png]",
		Short: "Measure each tier's latency, throughput and CPU per op, optionally beside memcached, Redis, gRPC and raw TCP",
		Long: `bench allocates a segment on each tier of the running poold and drives it with
reads and writes of each size and a 64-bit atomic, at each in-flight depth,
through the same ReadAt/WriteAt/Add64 an application uses. It reports
operations per second, bandwidth, p50 and p99 latency, and CPU time per
operation in this process and in the serving daemon. Each case runs in
--rounds rounds with every system in turn in each round, so load from
elsewhere on the machine hits all systems alike and the ratios hold.

The rdma tier is a peer's memory when the pool has peers; on a single host
it is the daemon's own memory reached through its data plane over loopback
TCP (the tier 'memctl tiers' shows as loopback), so the daemon serves it.
The serving daemon's CPU is shown for a peer home too when it runs on this
host (its data plane on a loopback address).

--compare adds, driven by the same load generator in the same run: a plain
[]byte in this process (memory), a raw pipelined TCP server (tcp-raw) and a
plain gRPC unary service (grpc), both on 127.0.0.1 in a child process of
memctl (as poold, memcached and Redis run in processes of their own), and
memcached and Redis when their addresses are given. Each row is shown as a
ratio to farmem's matching tier: network servers to farmem-rdma, memory to
farmem-dram, and farmem-cxl and farmem-dram to farmem-rdma.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Ctrl-C ends the run early, and the segments are still freed.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runBench(ctx, g, &f, cmd.ErrOrStderr())
		},
	}
	fl := cmd.Flags()
	fl.DurationVar(&f.duration, "duration", 500*time.Millisecond, "how long each case is timed on each system, in total over the rounds")
	fl.IntVar(&f.rounds, "rounds", 3, "split each case into this many rounds, all systems in turn in each, so load from elsewhere hits them alike (each round warms up for a tenth of its time, at least 20ms)")
	fl.StringSliceVar(&f.sizes, "sizes", []string{"64", "4KiB", "64KiB"}, "read and write sizes")
	fl.IntSliceVar(&f.depths, "depths", []int{1, 16}, "operations in flight")
	fl.StringSliceVar(&f.ops, "ops", []string{"read", "write", "atomic"}, "operations: read, write, atomic")
	fl.StringSliceVar(&f.tiers, "tiers", []string{"cxl", "local", "rdma"}, "farmem tiers to measure: cxl, local, rdma")
	fl.BoolVar(&f.compare, "compare", false, "also measure memory, tcp-raw, grpc (and memcached, redis when given)")
	fl.StringVar(&f.memcached, "memcached", "", "with --compare: a memcached to compare with, e.g. 127.0.0.1:11211")
	fl.StringVar(&f.redis, "redis", "", "with --compare: a Redis to compare with, e.g. 127.0.0.1:6379")
	fl.StringVar(&f.plot, "plot", "", "write the latency CDFs of every system to this .png or .svg")
	fl.Var(&f.plotSize, "plot-size", "the size whose CDFs --plot draws")
	fl.IntVar(&f.plotDepth, "plot-depth", 1, "the depth whose CDFs --plot draws")
	fl.StringVar(&f.plotOp, "plot-op", "read", "the op whose CDFs --plot draws")
	fl.DurationVar(&f.busyPoll, "busy-poll", tcp.DefaultBusyPoll, "how long the rdma tier's ops over TCP busy-poll for their answer before sleeping (0: off; poold's --data-busy-poll is the daemon's side)")
	fl.BoolVar(&f.inProcess, "servers-in-process", false, "run the tcp-raw and grpc servers inside memctl instead of in a process of their own (faster for them: no cross-process wake-ups; their CPU then counts as the client's)")
	return cmd
}

// newBenchServeCmd is the hidden command memctl bench runs in a child
// process for the tcp-raw and grpc servers: it prints the server's address
// and serves until its stdin closes.
func newBenchServeCmd() *cobra.Command {
	maxSize := 64 * size.KiB
	cmd := &cobra.Command{
		Use:    "bench-serve tcp-raw|grpc",
		Short:  "Serve a comparison server for memctl bench until stdin closes",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return bench.Serve(args[0], int(maxSize), cmd.OutOrStdout(), func() { io.Copy(io.Discard, cmd.InOrStdin()) })
		},
	}
	cmd.Flags().Var(&maxSize, "max-size", "the largest value tcp-raw serves")
	return cmd
}

// benchCases expands the flags into cases, atomics once per depth.
func benchCases(f *benchFlags) ([]bench.Case, int, error) {
	var sizes []int
	maxSize := 8
	for _, s := range f.sizes {
		n, err := size.Parse(s)
		if err != nil || n <= 0 || n > 16*size.MiB {
			return nil, 0, fmt.Errorf("--sizes %q: give sizes from 1 B to 16 MiB, e.g. 64,4KiB,64KiB", s)
		}
		sizes = append(sizes, int(n))
		maxSize = max(maxSize, int(n))
	}
	for _, d := range f.depths {
		if d < 1 || d > bench.Keys {
			return nil, 0, fmt.Errorf("--depths %d: give depths from 1 to %d", d, bench.Keys)
		}
	}
	var cases []bench.Case
	for _, o := range f.ops {
		op := bench.Op(o)
		opSizes := sizes
		switch op {
		case bench.Atomic:
			opSizes = []int{8}
		case bench.Read, bench.Write:
		default:
			return nil, 0, fmt.Errorf("--ops %q: use read, write or atomic", o)
		}
		for _, n := range opSizes {
			for _, d := range f.depths {
				cases = append(cases, bench.Case{Op: op, Size: n, Depth: d, Duration: f.duration})
			}
		}
	}
	if len(cases) == 0 {
		return nil, 0, errors.New("nothing to run: give --ops, --sizes and --depths")
	}
	return cases, maxSize, nil
}

func runBench(ctx context.Context, g *globals, f *benchFlags, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	if f.duration <= 0 {
		return fmt.Errorf("--duration %s: give a positive duration, e.g. 500ms", f.duration)
	}
	if f.rounds < 1 || time.Duration(f.rounds) > f.duration/time.Millisecond {
		return fmt.Errorf("--rounds %d: give 1 to one per millisecond of --duration", f.rounds)
	}
	if (f.memcached != "" || f.redis != "") && !f.compare {
		return errors.New("--memcached and --redis need --compare")
	}
	cases, maxSize, err := benchCases(f)
	if err != nil {
		return err
	}
	var st *poolv1.StatusResponse
	if err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
		st, err = c.Status(ctx, &poolv1.StatusRequest{})
		return err
	}); err != nil {
		return err
	}
	network, addr, err := g.target()
	if err != nil {
		return err
	}
	target := network + "://" + addr
	opts, err := g.allocTLS()
	if err != nil {
		return err
	}
	dctx, cancel := context.WithTimeout(ctx, g.timeout)
	// Read-ahead off: a case cycles through its keys in order, which the
	// detector would serve from the client's buffer instead of the tier.
	client, err := alloc.Dial(dctx, target, append(opts, alloc.WithClientName("memctl-bench"), alloc.WithBusyPoll(f.busyPoll), alloc.WithReadAhead(false))...)
	cancel()
	if err != nil {
		return err
	}
	defer client.Close()

	systems, segs, err := benchSystems(ctx, g, f, client, st, maxSize, stderr)
	defer func() {
		for _, s := range systems {
			s.Close()
		}
		freeSegments(segs, g.timeout, stderr)
	}()
	if err != nil {
		return err
	}
	rows, err := measure(ctx, systems, cases, f.rounds, progressTo(g.out, stderr))
	if err != nil {
		return err
	}
	bench.Compare(rows)
	if f.plot != "" {
		if err := bench.PlotCDF(f.plot, rows, bench.Op(f.plotOp), int(f.plotSize), f.plotDepth); err != nil {
			return err
		}
	}
	if g.output == "json" {
		if rows == nil {
			rows = []bench.Row{}
		}
		return g.printJSON(rows)
	}
	if err := bench.WriteTable(g.out, rows); err != nil {
		return err
	}
	if f.plot != "" {
		fmt.Fprintf(g.out, "\nlatency CDFs of %s %s at depth %d: %s\n", size.Size(f.plotSize), f.plotOp, f.plotDepth, f.plot)
	}
	return nil
}

// benchSystems allocates a segment per tier and starts the systems to
// compare with. It returns what it started and allocated also with an
// error: the caller closes the systems and frees the segments.
func benchSystems(ctx context.Context, g *globals, f *benchFlags, client *alloc.Client, st *poolv1.StatusResponse, maxSize int, stderr io.Writer) ([]bench.System, []*alloc.Segment, error) {
	var systems []bench.System
	var segs []*alloc.Segment
	for _, name := range f.tiers {
		t, err := alloc.ParseTier(name)
		i := slices.IndexFunc(benchTiers, func(bt benchTier) bool { return bt.tier == t })
		if err != nil || i < 0 {
			return systems, segs, fmt.Errorf("--tiers %q: use cxl, local or rdma", name)
		}
		bt := benchTiers[i]
		seg, err := client.Alloc(ctx, int64(bench.Keys*maxSize), alloc.WithTier(bt.tier))
		if err != nil {
			fmt.Fprintf(stderr, "memctl bench: skipping the %s tier: %v\n", bt.tier, err)
			continue
		}
		segs = append(segs, seg)
		systems = append(systems, bench.NewFarmem(bt.system, seg, daemonPID(g, st, seg)))
	}
	if !f.compare {
		return systems, segs, nil
	}
	systems = append(systems, bench.NewMemory())
	servers, err := startServers(f.inProcess, maxSize)
	systems = append(systems, servers...)
	if err != nil {
		return systems, segs, err
	}
	maxDepth := slices.Max(f.depths)
	if f.memcached != "" {
		m, err := bench.NewMemcached(ctx, f.memcached, maxDepth)
		if err != nil {
			return systems, segs, err
		}
		systems = append(systems, m)
	}
	if f.redis != "" {
		r, err := bench.NewRedis(ctx, f.redis, maxDepth)
		if err != nil {
			return systems, segs, err
		}
		systems = append(systems, r)
	}
	return systems, segs, nil
}

// freeSegments frees the bench's segments at once rather than leave them
// to the lease, within timeout even when the run was interrupted; what it
// cannot free it names (the lease reclaims it).
func freeSegments(segs []*alloc.Segment, timeout time.Duration, stderr io.Writer) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for _, s := range segs {
		if err := s.Free(ctx); err != nil {
			fmt.Fprintf(stderr, "memctl bench: free segment %d: %v (its lease reclaims it)\n", s.ID(), err)
		}
	}
}

// startServers starts tcp-raw and grpc, each in a child process running
// this binary's bench-serve, or inside this process.
func startServers(inProcess bool, maxSize int) ([]bench.System, error) {
	if inProcess {
		raw, err := bench.NewTCPRaw(maxSize)
		if err != nil {
			return nil, err
		}
		gs, err := bench.NewGRPC()
		if err != nil {
			return []bench.System{raw}, err
		}
		return []bench.System{raw, gs}, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find memctl's own binary to run the comparison servers: %w (or pass --servers-in-process)", err)
	}
	var out []bench.System
	for _, kind := range []string{"tcp-raw", "grpc"} {
		child, err := bench.StartChild(exec.Command(exe, "bench-serve", kind, "--max-size", strconv.Itoa(maxSize)))
		if err != nil {
			return out, err
		}
		var sys bench.System
		if kind == "grpc" {
			sys, err = bench.DialGRPC(child.Addr, child.PID)
		} else {
			sys, err = bench.DialTCPRaw(child.Addr, maxSize, child.PID)
		}
		if err != nil {
			child.Close()
			return out, err
		}
		out = append(out, childSystem{sys, child})
	}
	return out, nil
}

// childSystem is a system whose server runs in a child process, stopped
// on Close.
type childSystem struct {
	bench.System
	child *bench.Child
}

func (c childSystem) Close() error { return errors.Join(c.System.Close(), c.child.Close()) }

// daemonPID is the process whose CPU time counts as a segment's server:
// the local poold for its own tiers and the loopback rdma tier, the home
// poold for a segment homed on a peer on this host, none for a home
// elsewhere or a daemon reached over the network, and none when the
// daemon runs inside this process (its CPU is then the client's).
func daemonPID(g *globals, st *poolv1.StatusResponse, seg *alloc.Segment) int {
	if g.addr != "" && !loopback(g.addr) {
		return 0
	}
	pid := int(st.Pid)
	if seg.Node() != st.Node {
		pid = homePID(g, seg.Node())
	}
	if pid == os.Getpid() {
		return 0
	}
	return pid
}

// homePID is the process of the peer poold named node when it runs on
// this host: the one listening on its data-plane address, a loopback one.
// 0 when it is elsewhere or cannot be found (then no server CPU is shown).
func homePID(g *globals, node string) int {
	var nodes *poolv1.NodesResponse
	if err := g.call(func(ctx context.Context, c poolv1.PoolClient) (err error) {
		nodes, err = c.Nodes(ctx, &poolv1.NodesRequest{})
		return err
	}); err != nil {
		return 0
	}
	for _, n := range nodes.Nodes {
		if n.Name == node && loopback(n.DataAddr) {
			if pid, err := bench.ListenerPID(n.DataAddr); err == nil {
				return pid
			}
		}
	}
	return 0
}

// loopback reports whether addr (host:port) is on this host's loopback.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	ip := net.ParseIP(host)
	return err == nil && (host == "localhost" || ip != nil && ip.IsLoopback())
}

// measure runs every case on every system in rounds: each round runs
// every case on every system for 1/rounds of the duration, so that
// whatever else the machine does meanwhile hits all systems alike. It
// returns the rows ordered by system, then case.
func measure(ctx context.Context, systems []bench.System, cases []bench.Case, rounds int, progress func(done, total int, what string)) ([]bench.Row, error) {
	total := rounds * len(cases) * len(systems)
	results := make([][]*bench.Result, len(systems)) // [system][case]; nil: not supported
	for i := range results {
		results[i] = make([]*bench.Result, len(cases))
	}
	skip := map[[2]int]bool{}
	done := 0
	for round := range rounds {
		for ci, c := range cases {
			c.Duration /= time.Duration(rounds)
			for si, s := range systems {
				progress(done, total, fmt.Sprintf("round %d/%d: %s %s %s ×%d", round+1, rounds, s.Name(), c.Op, size.Size(c.Size), c.Depth))
				done++
				if skip[[2]int{si, ci}] {
					continue
				}
				res, err := bench.Run(ctx, s, c)
				if errors.Is(err, bench.ErrNotSupported) {
					skip[[2]int{si, ci}] = true
					continue
				}
				if err != nil {
					return nil, err
				}
				if prev := results[si][ci]; prev != nil {
					prev.Add(res)
				} else {
					res.Case.Duration *= time.Duration(rounds)
					results[si][ci] = res
				}
			}
		}
	}
	progress(total, total, "")
	var rows []bench.Row
	for si := range systems {
		for _, res := range results[si] {
			if res != nil {
				rows = append(rows, bench.NewRow(res))
			}
		}
	}
	return rows, nil
}

// progressTo returns a progress bar drawn on stderr when stdout and stderr
// are both terminals, else one that draws nothing.
func progressTo(stdout, stderr io.Writer) func(done, total int, what string) {
	if ok, _ := terminal(stdout); !ok {
		return func(int, int, string) {}
	}
	if ok, _ := terminal(stderr); !ok {
		return func(int, int, string) {}
	}
	const width = 30
	return func(done, total int, what string) {
		if done >= total {
			fmt.Fprint(stderr, "\r"+ansiClearLine)
			return
		}
		fill := done * width / max(total, 1)
		fmt.Fprintf(stderr, "\r[%s%s] %d/%d %s%s", strings.Repeat("#", fill), strings.Repeat(".", width-fill), done, total, what, ansiClearLine)
	}
}
