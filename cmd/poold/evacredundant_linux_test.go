package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/testcluster"
)

// segmentMoving is `memctl segments -o json`'s view of a redundant
// segment with the move of its homes.
type segmentMoving struct {
	ID              uint64 `json:"id"`
	Redundancy      string `json:"redundancy"`
	RedundancyState string `json:"redundancy_state"`
	Homes           []struct {
		Node     string `json:"node"`
		Role     string `json:"role"`
		State    string `json:"state"`
		MovingTo string `json:"moving_to"`
	} `json:"homes"`
}

// nodes is the nodes of v's homes, in order.
func (v segmentMoving) nodes() []string {
	var out []string
	for _, h := range v.Homes {
		out = append(out, h.Node)
	}
	return out
}

// redundantViews is the origin's view of its redundant segments, by
// redundancy ("replicas=2", "ec=4+2").
func redundantViews(t *testing.T, origin *poolNode) map[string]segmentMoving {
	t.Helper()
	var listed []segmentMoving
	require.NoError(t, memctlJSON(t.Context(), origin.sock, &listed, "segments"))
	out := map[string]segmentMoving{}
	for _, s := range listed {
		if s.Redundancy != "" {
			out[s.Redundancy] = s
		}
	}
	return out
}

// drainOwn drains n (on) or ends its drain, and waits until n sees it:
// n's own placements follow its own view.
func drainOwn(t *testing.T, n *poolNode, on bool) {
	t.Helper()
	args := []string{"drain", n.name}
	if !on {
		args = append(args, "--undo")
	}
	_, errOut, ok := memctlText(t, n.sock, args...)
	require.True(t, ok, errOut)
	waitFor(t, 20*time.Millisecond, func() (bool, string) {
		v, err := nodeSeen(t, n.sock, n.name)
		if err != nil {
			return false, err.Error()
		}
		return v.Draining == on, fmt.Sprintf("%s sees itself %+v, want draining %v", n.name, v, on)
	})
}

// TestEvacuateRedundantHomes runs seven poolds in network namespaces. An
// application on a (an evac-load client) keeps a replicas=2 and an
// ec=4+2 segment, placed while a drained so that their homes are on b..g,
// and writes, reads and adds on both all along. memctl drain X
// --evacuate --wait, X the host of the copies' primary (and of a shard),
// moves both homes on X live: no operation fails, X holds no segment of a
// peer after, and both segments are ok with no home on X (the primary's
// role went to its replacement). Then, the load stopped, kill -9 of the
// copies' other home, and of one more shard's host: every block and
// counter reads back as acknowledged, from the replacements and the
// survivors, so the redundancy was whole again after the evacuation.
func TestEvacuateRedundantHomes(t *testing.T) {
	began := time.Now()
	c := testcluster.New(t, testcluster.Options{Hosts: 7})
	nodes := startPools(t, c, "--export-size", "16MiB")
	waitAllAlive(t, nodes)
	a := nodes[0]
	l := &evacCluster{nodes: nodes}
	drainOwn(t, a, true)
	dir := t.TempDir()
	l.gate, l.stop = filepath.Join(dir, "go"), filepath.Join(dir, "stop")
	check := filepath.Join(dir, "check")
	client := startClient(t, a.host, "evac-load", a.sock, segCountEnv+"=2", sizeEnv+"=1048576",
		gateEnv+"="+l.gate, stopEnv+"="+l.stop, evacRedundancyEnv+"=replicas=2 ec=4+2", evacCheckEnv+"="+check)
	l.clients = []*testcluster.Process{client}
	line, _, _ := waitLine(t, client, 0, 2*settle, func(s string) bool { return strings.HasPrefix(s, "ready ") || strings.HasPrefix(s, "error: ") })
	require.True(t, strings.HasPrefix(line, "ready "), "%s", client.Output())
	drainOwn(t, a, false) // a takes a replacement: the six others hold the shards
	before := redundantViews(t, a)
	rep, ec := before["replicas=2"], before["ec=4+2"]
	require.Len(t, rep.Homes, 2)
	require.Len(t, ec.Homes, 6)
	require.NotContains(t, slices.Concat(rep.nodes(), ec.nodes()), a.name, "a drained while the segments were placed")
	x := nodeNamed(t, nodes, rep.Homes[0].Node)
	require.Contains(t, ec.nodes(), x.name)
	t.Logf("setup took %v; evacuating %s: primary of %v, a shard of %v", time.Since(began).Round(time.Millisecond), x.name, rep.nodes(), ec.nodes())

	l.startWork(t)
	time.Sleep(time.Second) // the load runs before the evacuation too
	// What memctl segments shows while the homes move.
	var seen sync.Map
	watchDone := make(chan struct{})
	var watch sync.WaitGroup
	watch.Go(func() {
		for {
			select {
			case <-watchDone:
				return
			case <-time.After(20 * time.Millisecond):
			}
			var listed []segmentMoving
			if memctlJSON(t.Context(), a.sock, &listed, "segments") != nil {
				continue
			}
			for _, s := range listed {
				for _, h := range s.Homes {
					if h.MovingTo != "" {
						seen.Store(fmt.Sprintf("segment %d (%s): its %s home on %s moving to %s", s.ID, s.Redundancy, h.Role, h.Node, h.MovingTo), true)
					}
				}
			}
		}
	})
	from := time.Now()
	out := evacuate(t, a, x)
	to := time.Now()
	close(watchDone)
	watch.Wait()
	t.Logf("memctl drain %s --evacuate --wait took %v:\n%s", x.name, to.Sub(from).Round(time.Millisecond), out)
	seen.Range(func(k, _ any) bool { t.Logf("memctl segments during the move: %s", k); return true })
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Contains(t, lines[len(lines)-1], x.name+" is evacuated: no segment of a peer is left on it")

	var held []struct {
		ID    uint64 `json:"id"`
		Owner string `json:"owner"`
	}
	require.NoError(t, memctlJSON(t.Context(), x.sock, &held, "segments"))
	for _, s := range held {
		require.False(t, strings.HasPrefix(s.Owner, "poold/"), "segment %d of %s is still on %s", s.ID, s.Owner, x.name)
	}
	after := redundantViews(t, a)
	for _, v := range after {
		require.Equal(t, "ok", v.RedundancyState, "segment %d: %+v", v.ID, v)
		require.NotContains(t, v.nodes(), x.name, "segment %d", v.ID)
		for _, h := range v.Homes {
			require.Equal(t, "ok", h.State, "segment %d: %+v", v.ID, v)
		}
	}
	newRep, newEC := after["replicas=2"], after["ec=4+2"]
	require.Equal(t, rep.Homes[1].Node, newRep.Homes[1].Node, "the backup stayed")
	t.Logf("after: copies on %v, shards on %v", newRep.nodes(), newEC.nodes())

	// The load stops; the client reports what its Segment.Redundancy says.
	require.NoError(t, os.WriteFile(l.stop, fmt.Appendf(nil, "%d %d\n", from.UnixMilli(), to.UnixMilli()), 0o644))
	line, _, _ = waitLine(t, client, 0, 2*settle, func(s string) bool { return strings.HasPrefix(s, "paused ") || strings.HasPrefix(s, "error: ") })
	body, ok := strings.CutPrefix(line, "paused ")
	require.True(t, ok, "%s", client.Output())
	var statuses []alloc.RedundancyStatus
	require.NoError(t, json.Unmarshal([]byte(body), &statuses))
	require.Len(t, statuses, 2)
	for _, st := range statuses {
		require.Equal(t, "ok", st.State, "the client's view: %+v", st)
		for _, h := range st.Homes {
			require.NotEqual(t, x.name, h.Node, "the client's view: %+v", st)
		}
	}

	// The copies' other home dies: only the replacement holds them. One
	// more shard's host dies: the shards read back need the replacement.
	victims := []string{newRep.Homes[1].Node}
	for _, n := range newEC.nodes() {
		if len(victims) < 2 && n != a.name && n != victims[0] && n != newEC.Homes[slices.Index(ec.nodes(), x.name)].Node && !slices.Contains(newRep.nodes(), n) {
			victims = append(victims, n)
		}
	}
	require.Len(t, victims, 2, "two hosts to kill among %v", newEC.nodes())
	for _, v := range victims {
		nodeNamed(t, nodes, v).kill9(t)
	}
	t.Logf("killed %v", victims)
	require.NoError(t, os.WriteFile(check, nil, 0o644))
	line, _, _ = waitLine(t, client, 0, 2*settle, func(s string) bool { return strings.HasPrefix(s, "result ") || strings.HasPrefix(s, "error: ") })
	body, ok = strings.CutPrefix(line, "result ")
	require.True(t, ok, "%s", client.Output())
	var r evacResult
	require.NoError(t, json.Unmarshal([]byte(body), &r))
	t.Logf("%d operations (%d writes, %d adds), %.0f/s before the evacuation, %.0f/s during; slowest during %d µs",
		r.Ops, r.Writes, r.Adds, r.OpsBefore, r.OpsDuring, r.MaxDuringUs)
	require.Empty(t, r.Failed, "failed operations")
	require.Empty(t, r.Mismatches, "reads of other bytes than acknowledged")
	require.Empty(t, r.Lost, "acknowledged writes or adds missing")
	require.Zero(t, r.Indeterminate, "operations of unknown outcome")
	require.Positive(t, r.Writes)
	require.Positive(t, r.Adds)
	require.Positive(t, r.OpsDuring, "the application made no progress during the evacuation")
	require.NotContains(t, r.Homes, x.name)
}
