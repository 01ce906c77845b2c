package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/probe"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/testcluster"
)

// evacSizeEnv sets the bytes TestEvacuateUnderLoad moves, in all (64
// segments); the default keeps the test short, FARMEM_TEST_EVAC_BYTES=1GiB
// is the measurement the README quotes.
const evacSizeEnv = "FARMEM_TEST_EVAC_BYTES"

// evacRateEnv and evacMovesEnv, when set, are TestEvacuateUnderLoad's
// poold --move-rate (default: poold's, unlimited: the origins pace the
// moves) and --evacuate-moves (default: poold's, 4).
const (
	evacRateEnv  = "FARMEM_TEST_EVAC_RATE"
	evacMovesEnv = "FARMEM_TEST_EVAC_MOVES"
)

// evacSegments is how many segments TestEvacuateUnderLoad moves.
const evacSegments = 64

// evacCluster is a cluster whose applications keep rdma segments on one node
// (the one to evacuate) and work on them.
type evacCluster struct {
	nodes   []*poolNode
	target  *poolNode // the node to evacuate
	clients []*testcluster.Process
	gate    string // the file that starts the clients' work
	stop    string // the file that ends it
}

// startEvacLoad starts one poold per host of c (the last is the one to
// evacuate), and an evac-load client on each of the others with per[i]
// segments of size bytes. Their segments land on the last node: the others
// drain while the clients allocate, and take placements again after.
func startEvacLoad(t *testing.T, c *testcluster.Cluster, per []int, size int64, poolArgs ...string) *evacCluster {
	t.Helper()
	l := &evacCluster{nodes: startPools(t, c, poolArgs...)}
	l.target = l.nodes[len(l.nodes)-1]
	dir := t.TempDir()
	l.gate, l.stop = filepath.Join(dir, "go"), filepath.Join(dir, "stop")
	alive := map[string]string{}
	for _, n := range l.nodes {
		alive[n.name] = "alive"
	}
	for _, n := range l.nodes {
		n.waitStates(t, alive) // else a client's daemon may not know the target yet
	}
	others := l.nodes[:len(l.nodes)-1]
	l.setDrained(t, others, true)
	for i, n := range others {
		l.clients = append(l.clients, startClient(t, n.host, "evac-load", n.sock,
			segCountEnv+"="+strconv.Itoa(per[i]), sizeEnv+"="+strconv.FormatInt(size, 10), gateEnv+"="+l.gate, stopEnv+"="+l.stop))
	}
	for _, p := range l.clients {
		line, _, _ := waitLine(t, p, 0, 2*settle, func(s string) bool { return strings.HasPrefix(s, "ready ") || strings.HasPrefix(s, "error: ") })
		homes, ok := strings.CutPrefix(line, "ready ")
		require.True(t, ok, "%s: %s", p, p.Output())
		for _, h := range strings.Split(homes, ",") {
			require.Equal(t, l.target.name, h, "a segment landed elsewhere than on the node to evacuate")
		}
	}
	l.setDrained(t, others, false)
	return l
}

// setDrained drains or undrains nodes (through the node to evacuate) and
// waits until every node sees it.
func (l *evacCluster) setDrained(t *testing.T, nodes []*poolNode, on bool) {
	t.Helper()
	for _, n := range nodes {
		args := []string{"drain", n.name}
		if !on {
			args = append(args, "--undo")
		}
		_, errOut, ok := memctlText(t, l.target.sock, args...)
		require.True(t, ok, errOut)
	}
	for _, viewer := range l.nodes {
		waitFor(t, 50*time.Millisecond, func() (bool, string) {
			var seen []drainNodeView
			if err := memctlJSON(t.Context(), viewer.sock, &seen, "nodes"); err != nil {
				return false, err.Error()
			}
			for _, n := range nodes {
				if !slices.ContainsFunc(seen, func(v drainNodeView) bool { return v.Name == n.name && v.Draining == on }) {
					return false, fmt.Sprintf("%s sees %+v, want %s draining %v", viewer.name, seen, n.name, on)
				}
			}
			return true, ""
		})
	}
}

// startWork opens the gate: each client streams its segments once, then
// runs its load; it returns when all have streamed.
func (l *evacCluster) startWork(t *testing.T) {
	t.Helper()
	require.NoError(t, os.WriteFile(l.gate, nil, 0o644))
	for _, p := range l.clients {
		waitLine(t, p, 0, 2*settle, func(s string) bool { return s == "streamed" })
	}
}

// results ends the clients' work, telling them the evacuation's window,
// and returns what each found.
func (l *evacCluster) results(t *testing.T, from, to time.Time) []evacResult {
	t.Helper()
	require.NoError(t, os.WriteFile(l.stop, fmt.Appendf(nil, "%d %d\n", from.UnixMilli(), to.UnixMilli()), 0o644))
	var out []evacResult
	for _, p := range l.clients {
		line, _, _ := waitLine(t, p, 0, 2*settle, func(s string) bool { return strings.HasPrefix(s, "result ") || strings.HasPrefix(s, "error: ") })
		body, ok := strings.CutPrefix(line, "result ")
		require.True(t, ok, "%s: %s", p, p.Output())
		var r evacResult
		require.NoError(t, json.Unmarshal([]byte(body), &r))
		out = append(out, r)
	}
	return out
}

// checkNothingLost fails the test for any failed operation, read of other
// bytes, lost write or add, or segment still homed on the evacuated node.
func (l *evacCluster) checkNothingLost(t *testing.T, rs []evacResult, allowIndeterminate bool) {
	t.Helper()
	for i, r := range rs {
		require.Empty(t, r.Failed, "client %d: failed operations", i)
		require.Empty(t, r.Mismatches, "client %d: reads of other bytes than acknowledged", i)
		require.Empty(t, r.Lost, "client %d: acknowledged writes or adds missing", i)
		if !allowIndeterminate {
			require.Zero(t, r.Indeterminate, "client %d: operations of unknown outcome", i)
		}
		require.Positive(t, r.Writes, "client %d wrote nothing", i)
		require.Positive(t, r.Adds, "client %d added nothing", i)
		require.NotContains(t, r.Homes, l.target.name, "client %d: a segment is still homed on the evacuated node", i)
	}
	var segs []struct {
		ID    uint64 `json:"id"`
		Owner string `json:"owner"`
	}
	require.NoError(t, memctlJSON(t.Context(), l.target.sock, &segs, "segments"))
	for _, s := range segs {
		require.False(t, strings.HasPrefix(s.Owner, "poold/"), "segment %d of %s is still on %s", s.ID, s.Owner, l.target.name)
	}
}

// evacStatus is the evacuation in `memctl status -o json`.
type evacStatus struct {
	Evacuating bool `json:"evacuating"`
	Evacuation *struct {
		SegmentsMoved  int     `json:"segments_moved"`
		SegmentsLeft   int     `json:"segments_left"`
		BytesMoved     int64   `json:"bytes_moved"`
		BytesPerSecond float64 `json:"bytes_per_second"`
		Done           bool    `json:"done"`
		Stuck          string  `json:"stuck"`
	} `json:"evacuation"`
}

// evacuate runs `memctl drain NODE --evacuate --wait` through via and
// returns its output; the command must succeed.
func evacuate(t *testing.T, via, node *poolNode) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	cmd := memctlCommand(ctx, "--socket", via.sock, "drain", node.name, "--evacuate", "--wait", "--stuck-grace", "20s")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "memctl drain --evacuate --wait: %s", out)
	return string(out)
}

// TestEvacuateUnderLoad runs four real poolds in network namespaces; the
// applications on a, b and c (one client process each, two workers) keep
// 64 rdma segments on d and write, read and add on them all along. memctl
// drain d --evacuate --wait, sent to a, moves every segment off d while the
// load runs: no operation fails, every read sees the last acknowledged
// write, every acknowledged write and add is there at the end, and d holds
// no segment of a peer. It logs the evacuation's rate beside the
// streaming rate from d measured in the same run, and the applications'
// operation rate and latency during the evacuation beside before it.
func TestEvacuateUnderLoad(t *testing.T) {
	total := int64(64 << 20)
	if s := os.Getenv(evacSizeEnv); s != "" {
		v, err := size.Parse(s)
		require.NoError(t, err, evacSizeEnv)
		total = int64(v)
	}
	segSize := total / evacSegments / evacSlot * evacSlot
	export := max(int64(128<<20), 2*total)
	began := time.Now()
	c := testcluster.New(t, testcluster.Options{Hosts: 4})
	args := []string{"--export-size", strconv.FormatInt(export, 10)}
	if r := os.Getenv(evacRateEnv); r != "" {
		args = append(args, "--move-rate", r)
	}
	if n := os.Getenv(evacMovesEnv); n != "" {
		args = append(args, "--evacuate-moves", n)
	}
	l := startEvacLoad(t, c, []int{22, 21, 21}, segSize, args...)
	t.Logf("setup took %v", time.Since(began).Round(time.Millisecond))
	l.startWork(t)
	time.Sleep(2 * time.Second) // the baseline

	from := time.Now()
	out := evacuate(t, l.nodes[0], l.target)
	to := time.Now()
	time.Sleep(500 * time.Millisecond)
	rs := l.results(t, from, to)
	t.Logf("memctl drain %s --evacuate --wait:\n%s", l.target.name, out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Contains(t, lines[len(lines)-1], l.target.name+" is evacuated: no segment of a peer is left on it")
	l.checkNothingLost(t, rs, false)

	var st evacStatus
	require.NoError(t, memctlJSON(t.Context(), l.target.sock, &st, "status"))
	require.True(t, st.Evacuating)
	require.NotNil(t, st.Evacuation)
	require.True(t, st.Evacuation.Done)
	require.Zero(t, st.Evacuation.SegmentsLeft)
	require.EqualValues(t, evacSegments, st.Evacuation.SegmentsMoved)
	require.Equal(t, evacSegments*segSize, st.Evacuation.BytesMoved)

	var stream, before, during float64
	var p99Before, p99During, maxDuring int64
	var follows []time.Duration
	var connects, ahead, handovers int64
	for _, r := range rs {
		connects, ahead, handovers = connects+r.DataConnects, ahead+r.MovePreconnects, handovers+r.MoveHandovers
		for _, us := range r.FollowUs {
			follows = append(follows, time.Duration(us)*time.Microsecond)
		}
		require.Positive(t, r.OpsDuring, "the applications made no progress during the evacuation: %+v", r)
		stream += r.StreamBytesPerSec
		before += r.OpsBefore
		during += r.OpsDuring
		p99Before, p99During, maxDuring = max(p99Before, r.P99BeforeUs), max(p99During, r.P99DuringUs), max(maxDuring, r.MaxDuringUs)
	}
	evacRate := float64(evacSegments*segSize) / to.Sub(from).Seconds()
	t.Logf("evacuated %d segments, %d MiB in %v: %.1f MB/s (daemon's rate %.1f MB/s); streaming from %s before: %.1f MB/s; ratio %.2f",
		evacSegments, evacSegments*segSize>>20, to.Sub(from).Round(time.Millisecond), evacRate/1e6, st.Evacuation.BytesPerSecond/1e6,
		l.target.name, stream/1e6, evacRate/stream)
	t.Logf("applications: %.0f ops/s before, %.0f ops/s during (ratio %.2f); p99 %d µs before, %d µs during; slowest op during %d µs",
		before, during, during/before, p99Before, p99During, maxDuring)
	// The switch-overs' pauses, as the origins measured them, from the
	// evacuating daemon's last line about it.
	var pauses []string
	waitFor(t, 50*time.Millisecond, func() (bool, string) {
		pauses = pauseRE.FindStringSubmatch(l.target.output())
		return pauses != nil, "no 'evacuation done' line with the pauses in the output of " + l.target.name
	})
	t.Logf("switch-over pauses (writes waiting): p50 %s, p99 %s, max %s", pauses[1], pauses[2], pauses[3])
	seen := probe.Summarize(follows)
	t.Logf("pauses the applications saw (%d operations that followed a moved segment): p50 %s, p99 %s, max %s",
		len(follows), seen.P50, seen.P99, slices.Max(append(follows, 0)))
	t.Logf("the applications opened %d data-plane connections, %d of them to a new home ahead of its switch-over; %d operations went to a new home on its old home's handover", connects, ahead, handovers)
}

// pauseRE finds the pauses in the evacuator's "evacuation done" log line.
var pauseRE = regexp.MustCompile(`evacuation done.* pause-p50=(\S+) pause-p99=(\S+) pause-max=(\S+)`)

// TestEvacuateResumesAfterKill9: the evacuating poold is killed with
// SIGKILL once it has moved a segment, and started again: the evacuation
// resumes from its store and completes, while the applications run on;
// nothing acknowledged is lost (operations in flight at the kill may end
// indeterminate, as any restart of a home makes them).
func TestEvacuateResumesAfterKill9(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Hosts: 3})
	l := startEvacLoad(t, c, []int{24, 24}, 1<<20)
	l.startWork(t)

	from := time.Now()
	_, errOut, ok := memctlText(t, l.nodes[0].sock, "drain", l.target.name, "--evacuate")
	require.True(t, ok, errOut)
	waitFor(t, 5*time.Millisecond, func() (bool, string) {
		var st evacStatus
		if err := memctlJSON(t.Context(), l.target.sock, &st, "status"); err != nil {
			return false, err.Error()
		}
		ev := st.Evacuation
		if ev != nil && ev.Done {
			t.Fatalf("the evacuation was done before the test could kill it mid-way: %+v", ev)
		}
		return ev != nil && ev.SegmentsMoved >= 1, fmt.Sprintf("%+v", ev)
	})
	l.target.kill9(t)
	l.target.start(t)
	out := evacuate(t, l.nodes[0], l.target)
	to := time.Now()
	t.Logf("after the restart:\n%s", out)
	rs := l.results(t, from, to)
	for i, r := range rs {
		t.Logf("client %d: %d operations, %d of unknown outcome (in flight at the kill)", i, r.Ops, r.Indeterminate)
	}
	l.checkNothingLost(t, rs, true)
}
