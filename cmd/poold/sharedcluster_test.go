package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/coherence/lincheck"
	"github.com/farmem/farmem/internal/testcluster"
)

// TestSharedSegmentThreeHosts checks shared segments across hosts: three poolds in three
// test hosts, the segment's home on one of them, a sharer process on every
// host (each attached with alloc.Shared through the node that keeps the
// name), doing reads, writes and compare-and-swaps on four words of three
// hot pages at once. Their operations are recorded with CLOCK_MONOTONIC
// times and the history checked with porcupine against a register/CAS
// model, under each fault:
//
//   - a sharer is killed -9: its writes since its last Sync but one are of
//     unknown outcome, and the others go on within a lease;
//   - a sharer's host is cut off and healed: it reports the writes it lost
//     (ErrLeaseExpired) and goes on, and the others go on meanwhile;
//   - the home's poold is killed -9 and restarted: as the coherence package
//     documents, every open attachment fails with ErrSegmentLost, writes
//     not written back are lost, synced ones survive, and attaching again
//     continues.
//
// A failing history is written as porcupine's HTML visualization, with the
// sharers' raw output, into $FARMEM_KEEP_HISTORIES (default
// $TMPDIR/farmem-histories); the failure message names the files.
func TestSharedSegmentThreeHosts(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Hosts: 3})
	nodes := startPools(t, c)
	for i, fault := range []string{"sharer killed", "sharer partitioned", "home restarted"} {
		t.Run(fault, func(t *testing.T) {
			waitAllAlive(t, nodes)
			runSharedFault(t, nodes, fmt.Sprintf("hot%d", i), fault)
		})
	}
}

func runSharedFault(t *testing.T, nodes []*poolNode, name, fault string) {
	a := nodes[0]
	creator := startClient(t, a.host, "shared-create", a.sock, segEnv+"="+name)
	home := nodeNamed(t, nodes, readyNode(t, creator))
	require.NoError(t, creator.Wait(), creator.Output())
	require.NotEqual(t, a, home, "an rdma segment goes to a peer")

	dir := shortDir(t)
	gate, stop := filepath.Join(dir, "go"), filepath.Join(dir, "stop")
	target := "tcp://" + a.host.Addr.String() + ":7950"
	var sharers []*testcluster.Process
	for i, n := range nodes {
		sharers = append(sharers, startClient(t, n.host, "sharer", target,
			tlsEnv+"="+a.certs, segEnv+"="+name, sharerEnv+"="+strconv.Itoa(i), gateEnv+"="+gate, stopEnv+"="+stop))
	}
	for _, p := range sharers {
		line, _, _ := waitLine(t, p, 0, settle, func(l string) bool {
			return strings.HasPrefix(l, "attached ") || strings.HasPrefix(l, "error: ")
		})
		require.Equal(t, "attached "+home.name, line, p.Output())
	}
	require.NoError(t, os.WriteFile(gate, nil, 0o600))
	// memctl on the node keeping the name counts the sharers its home
	// heard from (filled in from the home's record).
	waitFor(t, 100*time.Millisecond, func() (bool, string) {
		var list []struct {
			Name    string `json:"name"`
			Sharers int    `json:"sharers"`
		}
		if err := memctlJSON(t.Context(), a.sock, &list, "segments"); err != nil {
			return false, err.Error()
		}
		for _, sg := range list {
			if sg.Name == name && sg.Sharers == len(sharers) {
				return true, ""
			}
		}
		return false, fmt.Sprintf("memctl segments on %s: %+v, want %s with %d sharers", a.name, list, name, len(sharers))
	})
	time.Sleep(time.Second) // no fault yet

	killed := -1
	var healed int64 // when the fault was over (CLOCK_MONOTONIC)
	switch fault {
	case "sharer killed":
		killed = slices.Index(nodes, home) // the sharer on the home's own host
		require.NoError(t, sharers[killed].Kill9())
		<-sharers[killed].Done()
		healed = monoNow()
	case "sharer partitioned":
		// The host that is neither the home nor the node keeping the name
		// (cutting that one off would end every sharer's peer credential).
		cut := nodes[3-slices.Index(nodes, home)]
		cut.host.LinkDown(t)
		// Past the 1 s coherence lease and, on a loaded machine, past
		// what ends the sharer's daemon's peer session at the home (about
		// 2 s here): the home then withdraws the credential the sharer's
		// link presents, and the link, dialing again after the cut, asks
		// its daemon for the one delegated over the new peer session.
		// Short of what gets the host declared dead (about 4 s).
		time.Sleep(2500 * time.Millisecond)
		cut.host.LinkUp(t)
		healed = monoNow()
	case "home restarted":
		home.kill9(t)
		home.start(t)
		for _, p := range sharers {
			lost, off, _ := waitLine(t, p, 0, settle, prefixed("LOST "))
			again, _, _ := waitLine(t, p, off, settle, prefixed("ATTACHED "))
			l, _ := strconv.ParseInt(strings.TrimPrefix(lost, "LOST "), 10, 64)
			g, _ := strconv.ParseInt(strings.TrimPrefix(again, "ATTACHED "), 10, 64)
			t.Logf("%s: ErrSegmentLost, attached again %v later", p, time.Duration(g-l))
		}
		healed = monoNow()
	}
	// The survivors go on: for 1.5 s, and until each completed an
	// operation after the fault (on a loaded machine a cut-off sharer's
	// way back, a new lease and its pages again, can take longer), or
	// settle passed and the check below says which did not.
	time.Sleep(1500 * time.Millisecond)
	wentOn := func() bool {
		for i, p := range sharers {
			if i == killed {
				continue
			}
			if l, err := parseSharer(lincheck.NewRecorder(), p.Output(), i, false); err == nil && l.after(healed) == 0 {
				return false
			}
		}
		return true
	}
	for end := time.Now().Add(settle); !wentOn() && time.Now().Before(end); {
		time.Sleep(100 * time.Millisecond)
	}
	require.NoError(t, os.WriteFile(stop, nil, 0o600))
	for i, p := range sharers {
		if i == killed {
			continue
		}
		waitLine(t, p, 0, settle, func(l string) bool { return l == "done" || strings.HasPrefix(l, "error: ") })
		require.NoError(t, p.Wait(), p.Output())
	}

	rec := lincheck.NewRecorder()
	var logs []sharerLog
	for i, p := range sharers {
		l, err := parseSharer(rec, p.Output(), i, i == killed)
		require.NoError(t, err)
		logs = append(logs, l)
	}
	kd := os.Getenv("FARMEM_KEEP_HISTORIES")
	if kd == "" {
		kd = filepath.Join(os.TempDir(), "farmem-histories")
	}
	kd = filepath.Join(kd, strings.NewReplacer(" ", "_", "/", "-").Replace(fmt.Sprintf("%s-%d", t.Name(), time.Now().UnixNano())))
	// keep writes the sharers' raw output into kd and returns it.
	keep := func() string {
		require.NoError(t, os.MkdirAll(kd, 0o755))
		for i, p := range sharers {
			require.NoError(t, os.WriteFile(filepath.Join(kd, fmt.Sprintf("sharer%d.log", i)), []byte(p.Output()), 0o644))
		}
		return kd
	}
	for i, l := range logs {
		if i == killed {
			continue
		}
		if l.after(healed) == 0 {
			t.Fatalf("sharer %d completed no operation after the fault (raw output kept in %s)", i, keep())
		}
		if restart := fault == "home restarted"; restart != (len(l.lost) > 0) {
			t.Fatalf("sharer %d saw its segment lost %d times; want at least once exactly when the home restarts (raw output kept in %s)", i, len(l.lost), keep())
		}
	}
	ops := rec.Ops()
	unknown := 0
	for _, o := range ops {
		if o.Input.(lincheck.Input).Unknown {
			unknown++
		}
	}
	t.Logf("%s: %d operations (%d of unknown outcome) from %d clients", fault, len(ops), unknown, len(sharers)*sharerWorkers)
	start := time.Now()
	ok, path, err := lincheck.Check(ops, time.Minute, kd)
	t.Logf("porcupine took %v", time.Since(start))
	if !ok {
		t.Fatalf("the history is not linearizable (or porcupine timed out): visualization %s, raw sharer output in %s (%v)", path, keep(), err)
	}
}

// sharerLog is what the test needs from a sharer's output beyond the
// operations.
type sharerLog struct {
	rets []int64 // return times of completed operations
	lost []int64 // LOST lines
}

// after counts operations that returned after t.
func (l sharerLog) after(t int64) int {
	n := 0
	for _, r := range l.rets {
		if r > t {
			n++
		}
	}
	return n
}

// parseSharer adds the operations of sharer index's output to rec: those
// that returned as completed, those that failed or never returned (a
// killed sharer's) as of unknown outcome, and those that returned where a
// FORGET line says writes may be lost as of unknown outcome too; for a
// killed sharer, everything after its last Sync but one.
func parseSharer(rec *lincheck.Recorder, out string, index int, killed bool) (sharerLog, error) {
	type call struct {
		client int
		in     lincheck.Input
		at     int64
		ended  bool
	}
	calls := map[[2]int]*call{}
	var order []*call
	var log sharerLog
	var forget [][2]int64
	var good []int64
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		n := make([]int64, len(f))
		for i := 1; i < len(f); i++ {
			n[i], _ = strconv.ParseInt(f[i], 10, 64)
		}
		u := func(i int) uint64 { v, _ := strconv.ParseUint(f[i], 10, 64); return v }
		switch f[0] {
		case "C":
			if len(f) != 9 {
				return log, fmt.Errorf("sharer %d: bad line %q", index, line)
			}
			c := &call{client: int(n[1]), at: n[8], in: lincheck.Input{Kind: lincheck.OpKind(n[3]), Key: int(n[4])}}
			switch c.in.Kind {
			case lincheck.Write:
				c.in.Value = u(5)
			case lincheck.CAS:
				c.in.Old, c.in.New = u(6), u(7)
			}
			calls[[2]int{int(n[1]), int(n[2])}] = c
			order = append(order, c)
		case "R", "F":
			c := calls[[2]int{int(n[1]), int(n[2])}]
			if c == nil || len(f) < 4 {
				return log, fmt.Errorf("sharer %d: %q answers no call", index, line)
			}
			c.ended = true
			if f[0] == "F" {
				rec.AddUnknown(c.client, c.in, c.at)
				continue
			}
			if len(f) != 6 {
				return log, fmt.Errorf("sharer %d: bad line %q", index, line)
			}
			rec.AddOp(c.client, c.in, lincheck.Output{Value: u(4), Swapped: f[5] == "true"}, c.at, n[3])
			log.rets = append(log.rets, n[3])
		case "G":
			good = append(good, n[1])
		case "FORGET":
			forget = append(forget, [2]int64{n[1], n[2]})
		case "LOST":
			log.lost = append(log.lost, n[1])
		}
	}
	for _, c := range order {
		if !c.ended {
			rec.AddUnknown(c.client, c.in, c.at)
		}
	}
	if killed {
		from := int64(0)
		if len(good) >= 2 {
			from = good[len(good)-2]
		}
		forget = append(forget, [2]int64{from, 1 << 62})
	}
	for _, w := range forget {
		for cl := range sharerWorkers {
			rec.Forget(sharerWorkers*index+cl, w[0], w[1])
		}
	}
	return log, nil
}
