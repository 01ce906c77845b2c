package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/certs"
	"github.com/farmem/farmem/internal/testcluster"
)

// The cluster tests run one poold per test host (a network namespace of
// internal/testcluster; they skip when not root) and the applications as
// re-executions of this test binary inside the hosts (clusterclient_test.go).
// The test process itself talks to the daemons only through their unix
// sockets, which any namespace reaches; TCP to a host's address comes from
// inside the hosts only.

const (
	leaseTTL = 2 * time.Second
	// peerLeaseTTL is the daemons' --peer-lease-ttl: how long a home keeps
	// the segments of a peer daemon whose session there ended (a partition
	// or its death), longer than a client's lease as by default, and short
	// enough for the tests that wait for a home to reclaim them.
	peerLeaseTTL = 5 * leaseTTL
	exportSize   = 128 << 20
	// settle bounds how long the cluster may take for anything that needs
	// failure detection, a lease to expire or a daemon to start; generous,
	// as -race on a small shared machine is slow. The times actually taken
	// are logged.
	settle = 30 * time.Second
	// gossipPushPull is the daemons' --gossip-push-pull: a node that missed
	// a broadcast (a join, a drain; the local profile sends each only a
	// few times) learns it at its next push/pull with a peer, within this
	// long rather than the profile's 15 s.
	gossipPushPull = time.Second
)

// poolNode is one poold in a test host: its directories, its arguments and
// its current process.
type poolNode struct {
	host *testcluster.Host
	name string
	dir  string // holds data/, shm/ and the socket
	// certs is the cluster's certs.Init directory (node NAME, client app).
	certs string
	sock  string
	args  []string

	mu   sync.Mutex
	proc *testcluster.Process
	runs []*testcluster.Process // every run, for the race check
}

// startPools starts one poold per host of c, named a, b, c, ...; all but
// the first join the first. extra is appended to each poold's arguments
// (a flag given again there overrides the default above it).
func startPools(t *testing.T, c *testcluster.Cluster, extra ...string) []*poolNode {
	t.Helper()
	return startPoolsEach(t, c, nil, extra...)
}

// startPoolsEach is startPools with each(i) appended to the arguments of
// the i-th poold after extra (nil: nothing).
func startPoolsEach(t *testing.T, c *testcluster.Cluster, each func(i int) []string, extra ...string) []*poolNode {
	t.Helper()
	seed := c.Hosts[0].Addr.String()
	// One CA per cluster: node certificates with each host's address (peers
	// dial each other by IP) and a client certificate for tcp:// clients.
	certDir := shortDir(t)
	var certNodes []certs.Node
	for i, h := range c.Hosts {
		certNodes = append(certNodes, certs.Node{Name: string(rune('a' + i)), IPs: []net.IP{h.Addr.AsSlice()}})
	}
	_, err := certs.Init(certDir, certs.InitOptions{Nodes: certNodes, Clients: []string{"app"}})
	require.NoError(t, err)
	var nodes []*poolNode
	for i, h := range c.Hosts {
		n := &poolNode{host: h, name: string(rune('a' + i)), dir: shortDir(t), certs: certDir}
		n.sock = filepath.Join(n.dir, "p.sock")
		ip := h.Addr.String()
		n.args = []string{
			"--node", n.name, "--data-dir", filepath.Join(n.dir, "data"), "--socket", n.sock,
			"--shm-dir", shmDir(t, n.dir),
			"--listen", ip + ":7950", "--gossip", ip + ":7946", "--data-listen", ip + ":7960",
			"--gossip-profile", "local", "--gossip-push-pull", gossipPushPull.String(), "--lease-ttl", leaseTTL.String(),
			"--peer-lease-ttl", peerLeaseTTL.String(),
			"--emulate-cxl", "64MiB", "--local-size", "16MiB", "--export-size", "128MiB",
			"--sysfs-root", "../../cxl/testdata/plain", "--measure-tiers=false",
			"--tls-cert", certs.CertFile(certDir, n.name), "--tls-key", certs.KeyFile(certDir, n.name), "--tls-ca", certs.CAFile(certDir),
			"--gossip-key-file", certs.GossipKeyFile(certDir),
			"--zone", zoneOf(i),
		}
		// FARMEM_TEST_LOG_LEVEL=debug shows sessions and gossip in the
		// daemons' output, which a failing test prints.
		if lv := os.Getenv("FARMEM_TEST_LOG_LEVEL"); lv != "" {
			n.args = append(n.args, "--log-level", lv)
		}
		n.args = append(n.args, extra...)
		if each != nil {
			n.args = append(n.args, each(i)...)
		}
		if i > 0 {
			n.args = append(n.args, "--join", seed+":7946")
		}
		n.start(t)
		nodes = append(nodes, n)
	}
	t.Cleanup(func() { checkNoRace(t, nodes) })
	return nodes
}

// zoneOf is the zone startPools gives the i-th node: two racks.
func zoneOf(i int) string { return fmt.Sprintf("rack-%d", i%2) }

// start runs the node's poold and waits until its socket answers.
func (n *poolNode) start(t *testing.T) {
	t.Helper()
	p := n.host.Start(t, poold, n.args...)
	n.mu.Lock()
	n.proc = p
	n.runs = append(n.runs, p)
	n.mu.Unlock()
	ctx, cancel := context.WithTimeout(t.Context(), settle)
	defer cancel()
	require.NoError(t, p.WaitOutput(ctx, "poold serving"))
	waitFor(t, 20*time.Millisecond, func() (bool, string) {
		c, err := net.Dial("unix", n.sock)
		if err != nil {
			return false, fmt.Sprintf("poold %s does not answer on %s: %v; its output:\n%s", n.name, n.sock, err, p.Output())
		}
		c.Close()
		return true, ""
	})
}

// waitFor calls cond every interval until it reports true and returns how
// long that took; after settle it fails the test with cond's last account
// of what it saw.
func waitFor(t *testing.T, interval time.Duration, cond func() (ok bool, saw string)) time.Duration {
	t.Helper()
	return waitWithin(t, settle, interval, cond)
}

// waitWithin is waitFor with bound in place of settle.
func waitWithin(t *testing.T, bound, interval time.Duration, cond func() (ok bool, saw string)) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		ok, saw := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > bound {
			t.Fatalf("not so after %v: %s", bound, saw)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("test ended while waiting: %s", saw)
		case <-time.After(interval):
		}
	}
}

// output is what the node's current poold printed so far.
func (n *poolNode) output() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proc.Output()
}

// kill9 kills the node's poold as a power loss would and waits for it.
func (n *poolNode) kill9(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	p := n.proc
	n.mu.Unlock()
	require.NoError(t, p.Kill9())
	<-p.Done()
}

// checkNoRace fails the test if a poold run reported a data race.
func checkNoRace(t *testing.T, nodes []*poolNode) {
	for _, n := range nodes {
		n.mu.Lock()
		runs := n.runs
		n.mu.Unlock()
		for _, p := range runs {
			if out := p.Output(); strings.Contains(out, "DATA RACE") {
				t.Errorf("poold %s reported a data race:\n%s", n.name, out)
			}
		}
	}
}

// memctlJSON runs `memctl --socket sock args... -o json` and decodes its
// output into v.
func memctlJSON(ctx context.Context, sock string, v any, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := memctlCommand(ctx, append(append([]string{"--socket", sock}, args...), "-o", "json")...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("memctl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	if err := json.Unmarshal(out, v); err != nil {
		return fmt.Errorf("memctl %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// nodeView is a node as `memctl nodes -o json` prints it.
type nodeView struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Zone  string `json:"zone"`
	Tiers []struct {
		Tier     string `json:"tier"`
		Capacity int64  `json:"capacity"`
		Free     int64  `json:"free"`
	} `json:"tiers"`
}

// states returns each node's state as n's poold sees it.
func (n *poolNode) states(ctx context.Context) (map[string]string, error) {
	var nodes []nodeView
	if err := memctlJSON(ctx, n.sock, &nodes, "nodes"); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, v := range nodes {
		out[v.Name] = v.State
	}
	return out, nil
}

// waitStates waits until n sees every node of want in its state
// ("alive", or "!alive" for any other) and returns how long it took.
func (n *poolNode) waitStates(t *testing.T, want map[string]string) time.Duration {
	t.Helper()
	return waitFor(t, 100*time.Millisecond, func() (bool, string) { return n.seesStates(t, want) })
}

// seesStates reports whether n sees the nodes of want in their states
// ("!alive": any but alive), and what it sees.
func (n *poolNode) seesStates(t *testing.T, want map[string]string) (bool, string) {
	got, err := n.states(t.Context())
	if err != nil {
		return false, err.Error()
	}
	for name, w := range want {
		if s := got[name]; w == "!alive" && s == "alive" || w != "!alive" && s != w {
			return false, fmt.Sprintf("node %s sees %v, want %v", n.name, got, want)
		}
	}
	return true, ""
}

// exportFree returns the capacity and free bytes of the memory n's poold
// itself lends as the rdma tier (not its peers').
func (n *poolNode) exportFree(ctx context.Context) (capacity, free int64, err error) {
	return ownRDMA(ctx, n.sock, n.name)
}

// ownRDMA returns the capacity and free bytes of the memory the poold on
// sock (node name) itself lends as the rdma tier.
func ownRDMA(ctx context.Context, sock, name string) (capacity, free int64, err error) {
	var tiers []struct {
		Tier     string `json:"tier"`
		Kind     string `json:"kind"`
		Capacity int64  `json:"capacity"`
		Free     int64  `json:"free"`
	}
	if err := memctlJSON(ctx, sock, &tiers, "tiers"); err != nil {
		return 0, 0, err
	}
	for _, ti := range tiers {
		if ti.Tier == "rdma" && ti.Kind != "tcp" {
			return ti.Capacity, ti.Free, nil
		}
	}
	return 0, 0, fmt.Errorf("node %s lists no rdma tier of its own: %+v", name, tiers)
}

// waitExportFree waits until n's own rdma tier has want bytes free and
// returns how long it took.
func (n *poolNode) waitExportFree(t *testing.T, want int64) time.Duration {
	t.Helper()
	return waitFor(t, 50*time.Millisecond, func() (bool, string) {
		_, free, err := n.exportFree(t.Context())
		if err != nil {
			return false, err.Error()
		}
		return free == want, fmt.Sprintf("node %s has %d bytes of its rdma tier free, want %d", n.name, free, want)
	})
}

// startClient runs the test binary in role inside h, dialing target.
func startClient(t *testing.T, h *testcluster.Host, role, target string, env ...string) *testcluster.Process {
	t.Helper()
	cmd := h.Command(context.Background(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{roleEnv + "=" + role, targetEnv + "=" + target}, env...)...)
	p := h.StartCmd(t, cmd)
	t.Cleanup(func() {
		if out := p.Output(); strings.Contains(out, "DATA RACE") {
			t.Errorf("client %s reported a data race:\n%s", role, out)
		}
	})
	return p
}

// waitLine waits until p prints a line, at or after byte from of its
// output, for which match is true; it returns the line, the offset past it
// and how long the wait took.
func waitLine(t *testing.T, p *testcluster.Process, from int, timeout time.Duration, match func(string) bool) (string, int, time.Duration) {
	t.Helper()
	start := time.Now()
	deadline := start.Add(timeout)
	exited := false // seen exited: its output is complete, and was read once more
	for {
		out := p.Output()
		if from > len(out) {
			from = len(out)
		}
		off := from
		for _, line := range strings.SplitAfter(out[from:], "\n") {
			if !strings.HasSuffix(line, "\n") {
				break // not complete yet
			}
			off += len(line)
			if l := strings.TrimSuffix(line, "\n"); match(l) {
				return l, off, time.Since(start)
			}
		}
		select {
		case <-p.Done():
			if exited {
				t.Fatalf("%s exited (%v) before the line the test waits for; its output:\n%s", p, p.Wait(), p.Output())
			}
			exited = true // it may have printed the line just before it exited
			continue
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not print the line the test waits for within %v; its output from byte %d:\n%s", p, timeout, from, out[min(from, len(out)):])
		}
	}
}

func prefixed(p string) func(string) bool {
	return func(l string) bool { return strings.HasPrefix(l, p) }
}

func exactly(s string) func(string) bool { return func(l string) bool { return l == s } }

// readyNode waits for a client's "ready <node>" line and returns the node.
func readyNode(t *testing.T, p *testcluster.Process) string {
	t.Helper()
	line, _, _ := waitLine(t, p, 0, settle, func(l string) bool {
		return strings.HasPrefix(l, "ready ") || strings.HasPrefix(l, "error: ")
	})
	node, ok := strings.CutPrefix(line, "ready ")
	require.True(t, ok, "%s: %s", p, p.Output())
	return node
}

// nodeNamed returns the node called name.
func nodeNamed(t *testing.T, nodes []*poolNode, name string) *poolNode {
	t.Helper()
	for _, n := range nodes {
		if n.name == name {
			return n
		}
	}
	t.Fatalf("no node %q", name)
	return nil
}

// waitAllAlive waits until every node sees every node alive. A node that
// missed a join's gossip (a wave misses a node now and then) learns it at
// its next push/pull with a peer, every gossipPushPull: settle is many of
// them.
func waitAllAlive(t *testing.T, nodes []*poolNode) {
	t.Helper()
	want := map[string]string{}
	for _, n := range nodes {
		want[n.name] = "alive"
	}
	for _, n := range nodes {
		waitFor(t, 100*time.Millisecond, func() (bool, string) { return n.seesStates(t, want) })
	}
}

func TestClusterJoinAndRemoteOps(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Hosts: 3})
	nodes := startPools(t, c)
	a, cc := nodes[0], nodes[2]
	waitAllAlive(t, nodes)
	var views []nodeView
	require.NoError(t, memctlJSON(t.Context(), a.sock, &views, "nodes"))
	require.Len(t, views, len(nodes))
	for i, v := range views {
		require.Equal(t, zoneOf(i), v.Zone, "node %s's zone, gossiped", v.Name)
	}

	creator := startClient(t, a.host, "alloc-shared", a.sock)
	home := readyNode(t, creator)
	require.Contains(t, []string{"b", "c"}, home, "an rdma segment goes to a peer, not the local node")
	require.NoError(t, creator.Wait(), creator.Output())

	gate := filepath.Join(shortDir(t), "go")
	counters := []*testcluster.Process{
		startClient(t, a.host, "counter", a.sock, gateEnv+"="+gate),
		startClient(t, cc.host, "counter", "tcp://"+a.host.Addr.String()+":7950", gateEnv+"="+gate, tlsEnv+"="+a.certs),
	}
	for _, p := range counters {
		line, _, _ := waitLine(t, p, 0, settle, func(l string) bool {
			return strings.HasPrefix(l, "attached ") || strings.HasPrefix(l, "error: ")
		})
		require.Equal(t, "attached "+home, line, p.Output())
	}
	require.NoError(t, os.WriteFile(gate, nil, 0o600))
	for _, p := range counters {
		waitLine(t, p, 0, settle, func(l string) bool { return l == "done" || strings.HasPrefix(l, "error: ") })
		require.NoError(t, p.Wait(), p.Output())
		require.Contains(t, p.Output(), "done\n")
	}

	check := startClient(t, a.host, "check", a.sock)
	line, _, _ := waitLine(t, check, 0, settle, func(l string) bool {
		return strings.HasPrefix(l, "values ") || strings.HasPrefix(l, "error: ")
	})
	require.Equal(t, fmt.Sprintf("values %d %d pattern ok", 2*counterAdds, 2*counterCASes), line, check.Output())
	require.NoError(t, check.Wait())
}

func TestHomeDiesAndReturns(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Hosts: 3})
	nodes := startPools(t, c)
	a := nodes[0]
	waitAllAlive(t, nodes)

	watch := startClient(t, a.host, "watch", a.sock)
	h := nodeNamed(t, nodes, readyNode(t, watch))
	require.NotEqual(t, a, h, "an rdma segment goes to a peer")
	_, off, _ := waitLine(t, watch, 0, settle, exactly("ok"))

	h.kill9(t)
	_, off, lostAfter := waitLine(t, watch, off, settle, exactly("lost"))
	t.Logf("home %s killed: the client saw its segment lost after %v", h.name, lostAfter)
	// A's poold is the one that declares H dead and tells the client.
	a.waitStates(t, map[string]string{h.name: "!alive"})

	h.start(t)
	_, _, backAfter := waitLine(t, watch, off, settle, exactly("ok"))
	t.Logf("home %s restarted: the client read the same bytes again after %v", h.name, backAfter)
	a.waitStates(t, map[string]string{h.name: "alive"})

	// Every read either matched, was reported lost, or waited for the home
	// (a read in flight at the kill): never other bytes, never another error.
	for _, l := range strings.Split(strings.TrimSpace(watch.Output()), "\n") {
		if l == "ok" || l == "lost" || strings.HasPrefix(l, "ready ") {
			continue
		}
		t.Errorf("unexpected client line %q", l)
	}
}

func TestClientDeathReturnsCapacity(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Hosts: 3})
	nodes := startPools(t, c)
	a := nodes[0]
	waitAllAlive(t, nodes)
	const size = 32 << 20
	sizeVar := sizeEnv + "=" + strconv.Itoa(size)

	// The client dies: A's lease on its segment ends, A frees it on H.
	holder := startClient(t, a.host, "hold", a.sock, sizeVar)
	h := nodeNamed(t, nodes, readyNode(t, holder))
	require.NotEqual(t, a, h, "an rdma segment goes to a peer")
	capacity, free, err := h.exportFree(t.Context())
	require.NoError(t, err)
	require.Equal(t, int64(exportSize), capacity)
	require.Equal(t, int64(exportSize-size), free, "the segment is carved from %s's rdma tier", h.name)
	require.NoError(t, holder.Kill9())
	<-holder.Done()
	back := h.waitExportFree(t, exportSize)
	t.Logf("client killed: %s's rdma tier was full again after %v (lease TTL %v)", h.name, back, leaseTTL)

	// A's poold dies: H's lease for A ends, H reclaims A's segment itself,
	// one peer lease (not a client's) after A's session there ended, which
	// was after the kill.
	holder = startClient(t, a.host, "hold", a.sock, sizeVar)
	h = nodeNamed(t, nodes, readyNode(t, holder))
	require.NotEqual(t, a, h, "an rdma segment goes to a peer")
	h.waitExportFree(t, exportSize-size)
	a.kill9(t)
	back = h.waitExportFree(t, exportSize)
	t.Logf("poold %s killed: %s reclaimed its segment after %v (lease TTL %v, peer lease TTL %v)", a.name, h.name, back, leaseTTL, peerLeaseTTL)
	require.GreaterOrEqual(t, back, peerLeaseTTL-time.Second, "a peer daemon's segments outlive a client's lease")
}

// TestPartition: the home of a's named rdma segment is cut off from the
// others past memberlist's memory of dead nodes and far past the clients'
// lease, then comes back: the cluster heals, and a serves the segment
// again with its bytes, since the home keeps a peer daemon's segments for
// the peer lease (here two minutes), not a client's.
func TestPartition(t *testing.T) {
	c := testcluster.New(t, testcluster.Options{Hosts: 3})
	nodes := startPools(t, c, "--peer-lease-ttl", "2m")
	a := nodes[0]
	waitAllAlive(t, nodes)
	creator := startClient(t, a.host, "alloc-shared", a.sock)
	b := nodeNamed(t, nodes, readyNode(t, creator))
	require.NotEqual(t, a, b, "an rdma segment goes to a peer")
	require.NoError(t, creator.Wait(), creator.Output())
	other := map[string]string{"b": "c", "c": "b"}[b.name]

	b.host.LinkDown(t)
	down := a.waitStates(t, map[string]string{b.name: "!alive", other: "alive"})
	t.Logf("link of %s down: %s saw it not alive after %v", b.name, a.name, down)
	// Stay partitioned past the time memberlist remembers dead nodes (15 s
	// with the local profile): healing must not depend on being remembered.
	time.Sleep(16 * time.Second)

	b.host.LinkUp(t)
	up := a.waitStates(t, map[string]string{b.name: "alive", other: "alive"})
	t.Logf("link of %s up: %s saw it alive again after %v", b.name, a.name, up)
	waitAllAlive(t, nodes)
	// a restores the segment once it hears from its home again.
	var line string
	waitFor(t, 200*time.Millisecond, func() (bool, string) {
		check := startClient(t, a.host, "check", a.sock)
		line, _, _ = waitLine(t, check, 0, settle, func(l string) bool {
			return strings.HasPrefix(l, "values ") || strings.HasPrefix(l, "error: ")
		})
		check.Wait()
		return strings.HasPrefix(line, "values "), line
	})
	require.Equal(t, "values 0 0 pattern ok", line, "the segment's bytes after the partition")
}
