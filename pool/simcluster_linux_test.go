package pool

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/internal/size"
)

// This file is the harness of the scale simulation (scale_linux_test.go):
// hundreds of real daemons in one process. Gossip runs on an in-memory
// network (memnet, through the simHooks.cluster hook), so partitions and
// crashes are exact; the control plane (gRPC) and data plane stay on
// 127.0.0.1 sockets, each daemon listening on 127.0.0.1:0 — see
// docs/scale.md for why, and for what a gossip-only partition does and does
// not model.

// simHostConfig is what every simulated host runs with; the rdma tier's
// size varies per host (simExportSizes) so that placement must balance
// used fractions, not bytes.
type simHostConfig struct {
	hosts    int
	leaseTTL time.Duration
	timing   func(*cluster.Config) // gossip timing overrides; nil keeps the lan profile
}

// simExportSizes are the rdma-tier capacities hosts take in turn: racks
// bought in different years.
var simExportSizes = []size.Size{24 * size.MiB, 32 * size.MiB, 48 * size.MiB}

// simCluster is N daemons on one memnet network.
type simCluster struct {
	t      testing.TB
	net    *memnet.Network
	root   string // shared-memory root: data and segment directories
	sock   string // directory of the unix sockets (short paths)
	seeds  []string
	calls  *simCalls
	hosts  []*simHost
	gossip time.Duration // gossip interval in force
	probe  time.Duration // probe interval in force
	susp   int           // suspicion multiplier in force
}

// simHost is one simulated host; d is nil while it is down.
type simHost struct {
	i    int
	name string
	cfg  Config
	mu   sync.Mutex
	d    *Daemon
}

func (h *simHost) daemon() *Daemon {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.d
}

// simCalls counts control-plane calls by method and by listener (unix:
// a client and its own daemon; tcp: daemon to daemon). Safe for
// concurrent use.
type simCalls struct {
	mu sync.Mutex
	n  map[string]uint64 // "unix /farmem.pool.v1.Pool/Alloc" -> calls
}

func (c *simCalls) add(ctx context.Context, method string) {
	kind := "tcp"
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil && p.Addr.Network() == "unix" {
		kind = "unix"
	}
	method = method[strings.LastIndexByte(method, '/')+1:]
	c.mu.Lock()
	c.n[kind+" "+method]++
	c.mu.Unlock()
}

func (c *simCalls) snapshot() map[string]uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]uint64, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

func (c *simCalls) options() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			c.add(ctx, info.FullMethod)
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			c.add(ss.Context(), info.FullMethod)
			return h(srv, ss)
		}),
	}
}

// raiseFileLimit lifts RLIMIT_NOFILE as far as the hard limit allows
// (further only with CAP_SYS_RESOURCE) and returns the limit in force:
// every host holds a few sockets, and every pair of hosts with a placement
// between them one TCP connection (two descriptors in this process).
func raiseFileLimit(t testing.TB, want uint64) uint64 {
	var old syscall.Rlimit
	require.NoError(t, syscall.Getrlimit(syscall.RLIMIT_NOFILE, &old))
	lim := old
	if lim.Max < want {
		lim.Max = want // allowed to root (CAP_SYS_RESOURCE); else keep the hard limit
		if syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: want, Max: want}) != nil {
			lim.Max = old.Max
		}
	}
	lim.Cur = min(want, lim.Max)
	require.NoError(t, syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim))
	t.Cleanup(func() { _ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &old) })
	return lim.Cur
}

// pushPullEverySecond has the hosts sync their whole state with a peer
// every second: the local profile sends a broadcast (a drain) only twice,
// and a host it missed would otherwise learn it at the next 15 s
// push-pull, which a test waiting for every host to see it runs into.
func pushPullEverySecond(c *cluster.Config) { c.PushPullInterval = time.Second }

// newSimCluster prepares n hosts (none started).
func newSimCluster(t testing.TB, hc simHostConfig) *simCluster {
	root, err := os.MkdirTemp(shmBase(), "farmem-scale")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(root) })
	sock, err := os.MkdirTemp("", "fms")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(sock) })
	sc := &simCluster{t: t, net: memnet.New(1024), root: root, sock: sock, calls: &simCalls{n: map[string]uint64{}}}
	ml := cluster.Config{}
	if hc.timing != nil {
		hc.timing(&ml)
	}
	// The lan profile (poold's default) unless overridden.
	sc.gossip, sc.probe, sc.susp = 200*time.Millisecond, time.Second, 4
	if ml.GossipInterval > 0 {
		sc.gossip = ml.GossipInterval
	}
	if ml.ProbeInterval > 0 {
		sc.probe = ml.ProbeInterval
	}
	if ml.SuspicionMult > 0 {
		sc.susp = ml.SuspicionMult
	}
	for i := range hc.hosts {
		name := fmt.Sprintf("h%04d", i)
		// Reserve the name's address now (memnet hands them out in order
		// and keeps them), so that every host can list the seeds.
		tr, err := sc.net.NewTransport(name)
		require.NoError(t, err)
		addr := tr.Addr()
		require.NoError(t, tr.Shutdown())
		if i < 3 {
			sc.seeds = append(sc.seeds, addr)
		}
		dir := filepath.Join(root, name)
		cfg := DefaultConfig()
		cfg.Node = name
		cfg.DataDir = filepath.Join(dir, "data")
		cfg.ShmDir = filepath.Join(dir, "shm")
		cfg.SysfsRoot = filepath.Join(dir, "no-sysfs")
		cfg.Socket = filepath.Join(sock, name+".sock")
		cfg.EmulateCXL = 4 * size.MiB
		cfg.LocalSize = 4 * size.MiB
		cfg.ExportSize = simExportSizes[i%len(simExportSizes)]
		cfg.LeaseTTL = hc.leaseTTL
		cfg.MeasureTiers = false
		cfg.MetadataFsync = false // tmpfs; and the simulation is about the cluster, not the disk
		cfg.Listen = "127.0.0.1:0"
		cfg.Insecure = true // hundreds of daemons in one process: no TLS handshakes (TLS is tested in tls_test.go)
		cfg.DataListen = "127.0.0.1:0"
		cfg.DataBusyPoll = 0 // busy polling spends a host's idle core; here hundreds of daemons share two
		cfg.Gossip = addr
		cfg.Join = sc.seeds
		timing := hc.timing
		cfg.sim.grpc = sc.calls.options()
		h := &simHost{i: i, name: name, cfg: cfg}
		h.cfg.sim.cluster = func(cc *cluster.Config) error {
			tr, err := sc.net.NewTransport(h.name)
			if err != nil {
				return err
			}
			cc.Transport = tr
			// Every host's gossip runs in this one process: memberlist's
			// packet compression (a fresh 64 KiB LZW table per packet sent
			// and received) kept about one core busy in allocation and GC at
			// 200 hosts, gossip ticks came late, probes timed out and a
			// capacity change needed 50-85 rounds to reach every host. It
			// does not change what a packet carries (memberlist fills packets
			// before compressing them), only the bytes on the wire, so the
			// simulation turns it off; see cluster.Config.NoCompression and
			// docs/scale.md.
			cc.NoCompression = true
			if timing != nil {
				timing(cc)
			}
			return nil
		}
		sc.hosts = append(sc.hosts, h)
	}
	t.Cleanup(sc.close)
	return sc
}

func shmBase() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return ""
}

// start starts h; a restarted host comes back at its previous control
// and data plane ports, as a real host would.
func (sc *simCluster) start(h *simHost) error {
	d, err := Start(h.cfg, simLog(h.name))
	if err != nil && h.cfg.Listen != "127.0.0.1:0" {
		// The old port was taken meanwhile (an outgoing connection's
		// ephemeral port): take any.
		h.cfg.Listen, h.cfg.DataListen = "127.0.0.1:0", "127.0.0.1:0"
		d, err = Start(h.cfg, simLog(h.name))
	}
	if err != nil {
		return fmt.Errorf("start %s: %w", h.name, err)
	}
	h.cfg.Listen = d.ListenAddr()
	if d.pool.dp != nil {
		h.cfg.DataListen = d.pool.dp.addr
	}
	h.mu.Lock()
	h.d = d
	h.mu.Unlock()
	return nil
}

// startAll starts every host, a few at a time.
func (sc *simCluster) startAll() {
	var g errgroup.Group
	g.SetLimit(8)
	for _, h := range sc.hosts {
		g.Go(func() error { return sc.start(h) })
	}
	require.NoError(sc.t, g.Wait())
}

// crash takes h off the network at once (no leave reaches anyone) and
// stops its daemon, as a host losing power would.
func (sc *simCluster) crash(h *simHost) {
	others := make([]string, 0, len(sc.hosts))
	for _, o := range sc.hosts {
		if o != h {
			others = append(others, o.name)
		}
	}
	sc.net.Cut(h.name, others...)
	h.mu.Lock()
	d := h.d
	h.d = nil
	h.mu.Unlock()
	if d != nil {
		require.NoError(sc.t, d.Close())
	}
}

// reboot brings a crashed host back: its shared memory did not survive
// (the segment files are gone), its metadata store did. It heals every
// cut, the crashed host's included.
func (sc *simCluster) reboot(h *simHost) error {
	if err := os.RemoveAll(h.cfg.ShmDir); err != nil {
		return err
	}
	sc.net.Heal()
	return sc.start(h)
}

// partition cuts gossip between the hosts of a and those of b.
func (sc *simCluster) partition(a, b []*simHost) {
	names := make([]string, len(b))
	for i, h := range b {
		names[i] = h.name
	}
	for _, h := range a {
		sc.net.Cut(h.name, names...)
	}
}

func (sc *simCluster) close() {
	var g errgroup.Group
	g.SetLimit(64)
	for _, h := range sc.hosts {
		g.Go(func() error {
			h.mu.Lock()
			d := h.d
			h.d = nil
			h.mu.Unlock()
			if d == nil {
				return nil
			}
			return d.Close()
		})
	}
	if err := g.Wait(); err != nil {
		sc.t.Errorf("close hosts: %v", err)
	}
}

// up returns the running hosts.
func (sc *simCluster) up() []*simHost {
	var out []*simHost
	for _, h := range sc.hosts {
		if h.daemon() != nil {
			out = append(out, h)
		}
	}
	return out
}

// waitConverged waits until every running host lists every running host
// alive with its control-plane address, and returns how long that took.
func (sc *simCluster) waitConverged(timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		up := sc.up()
		done := 0
		for _, h := range up {
			cl := h.daemon().pool.cl
			ok := true
			for _, o := range up {
				m, found := cl.Member(o.name)
				if !found || m.State != cluster.StateAlive || m.Meta.GRPCAddr == "" {
					ok = false
					break
				}
			}
			if ok {
				done++
			}
		}
		if done == len(up) {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("%d of %d hosts list every running host alive after %v", done, len(up), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// membershipGaps says, for each running host that some running host does
// not list alive with metadata, how it is listed instead and by how many
// (with up to three of those hosts, and how long ago the oldest saw the
// state change): what waitConverged's error leaves out, for a failure's
// message. Empty when every host lists every host alive.
func (sc *simCluster) membershipGaps() string {
	type gap struct {
		viewers []string
		oldest  time.Duration
	}
	gaps := map[string]map[string]*gap{} // subject, how it is listed
	up := sc.up()
	now := time.Now()
	for _, h := range up {
		cl := h.daemon().pool.cl
		for _, o := range up {
			m, found := cl.Member(o.name)
			how := ""
			switch {
			case !found:
				how = "unknown"
			case m.State != cluster.StateAlive:
				how = cluster.StateString(m.State)
			case m.Meta.GRPCAddr == "":
				how = fmt.Sprintf("alive without metadata (%v)", m.MetaErr)
			default:
				continue
			}
			if gaps[o.name] == nil {
				gaps[o.name] = map[string]*gap{}
			}
			g := gaps[o.name][how]
			if g == nil {
				g = &gap{}
				gaps[o.name][how] = g
			}
			g.viewers = append(g.viewers, h.name)
			if found {
				g.oldest = max(g.oldest, now.Sub(m.Since))
			}
		}
	}
	var b strings.Builder
	for _, subject := range slices.Sorted(maps.Keys(gaps)) {
		fmt.Fprintf(&b, "%s is listed", subject)
		for _, how := range slices.Sorted(maps.Keys(gaps[subject])) {
			g := gaps[subject][how]
			fmt.Fprintf(&b, " %s by %d hosts (%s", how, len(g.viewers), strings.Join(g.viewers[:min(3, len(g.viewers))], ", "))
			if len(g.viewers) > 3 {
				b.WriteString(", ...")
			}
			if g.oldest > 0 {
				fmt.Fprintf(&b, "; for up to %.0fs", g.oldest.Seconds())
			}
			b.WriteString(")")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// gossipTotals sums every running host's gossip counters: bytes sent
// (packets and streams) and packets sent.
func (sc *simCluster) gossipTotals() (bytes, packets uint64) {
	for _, h := range sc.up() {
		s := h.daemon().pool.cl.Stats()
		bytes += s.PacketBytesSent + s.StreamBytesSent
		packets += s.PacketsSent
	}
	return bytes, packets
}

// rdmaUse is h's rdma tier: capacity and used bytes, from its extent
// allocator (the truth, not gossip).
func rdmaUse(d *Daemon) (capacity, used int64) {
	for _, t := range d.pool.gossipTiers() {
		if t.Name == "rdma" {
			return t.Capacity, t.Capacity - t.Free
		}
	}
	return 0, 0
}

// simConvergence is one capacity change and when each host saw it.
type simConvergence struct {
	all  time.Duration   // until the last host saw it
	each []time.Duration // per observing host, sorted
	// The changed host's gossip until every host saw the change: how
	// often its capacity updates went out, and how often memberlist
	// offered room for them in a packet and how much on average.
	sends, offers, room uint64
	// Meanwhile in the whole cluster: gossip messages memberlists dropped
	// on receipt, the resyncs that followed, and the packets the hosts'
	// overflow lanes sent while memberlist's own messages crowded theirs.
	drops, resyncs, lanes uint64
}

// measureConvergence changes h's cxl capacity (clients of the simulation
// only use the rdma tier, so nothing else moves it) and waits until every
// other running host's view shows the new free bytes.
func (sc *simCluster) measureConvergence(h *simHost, timeout time.Duration) (simConvergence, error) {
	d := h.daemon()
	var observers []*simHost
	for _, o := range sc.up() {
		if o != h {
			observers = append(observers, o)
		}
	}
	// Each observer's view before the change: a view counts once it has
	// been applied since (its MetaAt moved) and shows the new free bytes.
	// (Views were once all updated before the Alloc returned, on a busy
	// machine; a view that shows the same free bytes from an older change
	// of the host must not count.)
	before := make([]time.Time, len(observers))
	for i, o := range observers {
		if od := o.daemon(); od != nil {
			if m, ok := od.pool.cl.Member(h.name); ok {
				before[i] = m.MetaAt
			}
		}
	}
	g0 := sc.gossipSnapshot(h)
	// Timed from the start of the Alloc (normally a millisecond), so a
	// slow Alloc is counted, not hidden.
	start := time.Now()
	r, err := d.pool.Alloc(context.Background(), caller{}, allocRequest{Size: 256 << 10, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	if err != nil {
		return simConvergence{}, err
	}
	defer func() { _ = d.pool.Free(caller{}, r.ID, "") }()
	want := gossipFree(d.pool, "cxl")
	seen := make([]time.Duration, len(observers))
	left := len(observers)
	for left > 0 {
		for i, o := range observers {
			if seen[i] != 0 {
				continue
			}
			od := o.daemon()
			if od == nil {
				seen[i] = -1
				left--
				continue
			}
			m, ok := od.pool.cl.Member(h.name)
			if !ok {
				continue
			}
			// A view counts once it shows the new free bytes and was
			// applied since the snapshot.
			if t, ok := m.Meta.Tier("cxl"); ok && t.Free == want && m.MetaAt.After(before[i]) {
				// When the observer applied it (MetaAt), not when this
				// loop got to look: with 200 daemons on 2 cores the loop
				// is sometimes not scheduled for a second, and one sample
				// read 8.4 rounds, half the hosts at 8.3. A later change
				// of another tier moves MetaAt on, so it is an upper
				// bound too, never later than the look.
				seen[i] = max(min(m.MetaAt.Sub(start), time.Since(start)), 1)
				left--
			}
		}
		if left > 0 && time.Since(start) > timeout {
			return simConvergence{}, fmt.Errorf("%d of %d hosts have not seen %s's capacity change after %v: %s",
				left, len(observers), h.name, timeout, sc.explainUnseen(h, observers, seen, want, before, g0))
		}
		time.Sleep(2 * time.Millisecond)
	}
	seen = slices.DeleteFunc(seen, func(d time.Duration) bool { return d < 0 })
	slices.Sort(seen)
	c := simConvergence{all: seen[len(seen)-1], each: seen}
	g1 := sc.gossipSnapshot(h)
	c.sends, c.offers = g1.host.CapacitySends-g0.host.CapacitySends, g1.host.BroadcastCalls-g0.host.BroadcastCalls
	if c.offers > 0 {
		c.room = (g1.host.BroadcastRoom - g0.host.BroadcastRoom) / c.offers
	}
	c.drops = g1.handoffDrops - g0.handoffDrops
	for name, s := range g1.each {
		c.resyncs += s.Resyncs - g0.each[name].Resyncs
		c.lanes += s.LanePackets - g0.each[name].LanePackets
	}
	return c, nil
}

// simGossip is what a capacity change's diagnosis compares before and
// after: the changed host's gossip counters, the network's drops, and the
// messages every running host's memberlist dropped on receipt.
type simGossip struct {
	host         cluster.Stats
	net          memnet.Stats
	handoffDrops uint64
	each         map[string]cluster.Stats // every running host's
}

func (sc *simCluster) gossipSnapshot(h *simHost) simGossip {
	g := simGossip{host: h.daemon().pool.cl.Stats(), net: sc.net.Stats(), each: map[string]cluster.Stats{}}
	for _, o := range sc.up() {
		s := o.daemon().pool.cl.Stats()
		g.handoffDrops += s.HandoffDrops
		g.each[o.name] = s
	}
	return g
}

// explainUnseen says, for a capacity change that did not spread, what the
// changed host gossips of itself and what the observers that did not see
// it show instead: the host's state and cxl free bytes in their views, and
// whether they applied a change since the snapshot before it. It says
// since the change (g0) how often the host's own capacity updates went
// out, how often memberlist offered room for them and how much, what its
// queue holds, and what the network and the receivers dropped: an update
// that never left, one starved by memberlist's own messages, and a wave
// lost to drops read differently.
func (sc *simCluster) explainUnseen(h *simHost, observers []*simHost, seen []time.Duration, want int64, before []time.Time, g0 simGossip) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s gossips cxl free %d (want %d)", h.name, gossipFree(h.daemon().pool, "cxl"), want)
	if m, ok := h.daemon().pool.cl.Member(h.name); ok {
		t, _ := m.Meta.Tier("cxl")
		fmt.Fprintf(&b, "; its own view: state %v, cxl free %d", m.State, t.Free)
	}
	g1 := sc.gossipSnapshot(h)
	calls := g1.host.BroadcastCalls - g0.host.BroadcastCalls
	room := uint64(0)
	if calls > 0 {
		room = (g1.host.BroadcastRoom - g0.host.BroadcastRoom) / calls
	}
	fmt.Fprintf(&b, "; since the change it sent its capacity updates %d times, memberlist offered room %d times (%d bytes on average), its queue holds %d (health score %d); the network dropped %d of %d packets, memberlists dropped %d on receipt",
		g1.host.CapacitySends-g0.host.CapacitySends, calls, room, g1.host.Broadcasts, g1.host.HealthScore,
		g1.net.Dropped-g0.net.Dropped, g1.net.Packets-g0.net.Packets, g1.handoffDrops-g0.handoffDrops)
	views := map[string]int{}
	for i, o := range observers {
		od := o.daemon()
		if seen[i] != 0 || od == nil {
			continue
		}
		m, ok := od.pool.cl.Member(h.name)
		if !ok {
			views["not a member"]++
			continue
		}
		t, _ := m.Meta.Tier("cxl")
		views[fmt.Sprintf("state %v, cxl free %d, applied since the change: %v", m.State, t.Free, m.MetaAt.After(before[i]))]++
	}
	b.WriteString("; the views that did not see it:\n")
	b.WriteString(kindLines(views, 5))
	// A few hosts that missed it: what their own memberlist dropped, and
	// whether they resynced.
	var few []string
	for i, o := range observers {
		if seen[i] == 0 && len(few) < 5 {
			s0, s1 := g0.each[o.name], g1.each[o.name]
			few = append(few, fmt.Sprintf("%s dropped %d on receipt and resynced %d times", o.name, s1.HandoffDrops-s0.HandoffDrops, s1.Resyncs-s0.Resyncs))
		}
	}
	b.WriteString("\n" + strings.Join(few, "; "))
	return b.String()
}

// kindLines lists counted kinds, most frequent first, one line each, at
// most max of them.
func kindLines(kinds map[string]int, max int) string {
	keys := slices.Sorted(maps.Keys(kinds))
	slices.SortStableFunc(keys, func(a, b string) int { return kinds[b] - kinds[a] })
	var lines []string
	for i, k := range keys {
		if i == max {
			lines = append(lines, fmt.Sprintf("... and %d more kinds", len(keys)-i))
			break
		}
		lines = append(lines, fmt.Sprintf("%5d %s", kinds[k], k))
	}
	return strings.Join(lines, "\n")
}

// simClient is one application on a host: a session with its daemon and
// the rdma segments it holds.
type simClient struct {
	host *simHost
	id   string // its ClientID, the owner of its segments' records
	conn *session.Conn
	segs []simSeg
	// reclaimed collects the ids its daemon said it reclaimed when the
	// client's lease ran out (Welcome.reclaimed, on its next session).
	reclaimed *simReclaimed
	// dead: its host crashed, and the application with it.
	dead atomic.Bool
	// unsure: an Alloc failed (a timeout may have been allocated all the
	// same), so the daemon may hold a segment for it that segs lacks;
	// freeLostOf then adopts such segments, as an application would that
	// lists its own.
	unsure bool
}

type simSeg struct {
	id   uint64
	size int64
	home string
	// freeFailed: a free of it failed; it may have been applied all the
	// same, its answer lost. vanished: its daemon was found without a
	// record of it, with no free of it tried (counted once).
	freeFailed, vanished bool
}

// simReclaimed holds what a client's session was told its lease's expiry
// reclaimed until the client drops those segments (take); safe for
// concurrent use (the session's goroutine adds).
type simReclaimed struct {
	mu  sync.Mutex
	ids map[uint64]bool
}

func (r *simReclaimed) add(ids []uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = map[uint64]bool{}
	}
	for _, id := range ids {
		r.ids[id] = true
	}
}

// take returns the ids told since the last take (nil: none).
func (r *simReclaimed) take() map[uint64]bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := r.ids
	r.ids = nil
	return ids
}

// simWorkload drives clients that allocate, free and die on random hosts
// (of the first clientHosts hosts).
type simWorkload struct {
	sc          *simCluster
	clientHosts int
	quota       int           // segments a client holds before it starts to churn
	repShare    float64       // share of allocations with replicas=2
	ecShare     float64       // share of allocations with ec=4+2
	minSize     int64         // smallest segment (bytes)
	maxSize     int64         // largest segment (bytes)
	tokens      chan struct{} // one per operation: the global rate
	rate        float64       // operations per second in all
	lostGen     atomic.Uint64 // bumped to have every worker free what its daemon reports lost
	stop        chan struct{}
	wg          sync.WaitGroup

	allocs, allocFails, frees, deaths, exits atomic.Uint64
	// reclaimed counts segments clients dropped because their daemon
	// said their lease's expiry reclaimed them (a client cut off its
	// daemon for longer than the lease TTL).
	reclaimed    atomic.Uint64
	lastAllocErr atomic.Pointer[error] // the last failed allocation's
	// phantoms counts segments a client listed although its daemon had
	// none after a failed free of them: frees applied whose answers were
	// lost (freeLostOf).
	phantoms atomic.Uint64

	mu      sync.Mutex
	clients []*simClient // one per worker, the live ones at the end
	// vanishedOf counts, per client id, the segments a client listed that
	// its daemon had no record of without a free of them (freeLostOf).
	vanishedOf map[string]int
}

// run starts workers workers at rate operations per second in all.
func (w *simWorkload) run(workers int, rate float64) {
	w.tokens = make(chan struct{}, workers)
	w.rate = rate
	w.stop = make(chan struct{})
	w.clients = make([]*simClient, workers)
	w.vanishedOf = map[string]int{}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		t := time.NewTicker(time.Duration(float64(time.Second) / rate))
		defer t.Stop()
		for {
			select {
			case <-w.stop:
				return
			case <-t.C:
				select {
				case w.tokens <- struct{}{}:
				default:
				}
			}
		}
	}()
	for i := range workers {
		w.wg.Add(1)
		go func() {
			defer w.wg.Done()
			w.worker(i, rand.New(rand.NewPCG(uint64(i), 9)))
		}()
	}
}

// halt stops the workers; each leaves its last client alive with its
// segments (the population whose placement is measured).
func (w *simWorkload) halt() {
	close(w.stop)
	w.wg.Wait()
}

// closeClients ends every remaining client's session.
func (w *simWorkload) closeClients() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, c := range w.clients {
		if c != nil {
			c.conn.Close()
			w.clients[i] = nil
		}
	}
}

// halted reports whether halt was called.
func (w *simWorkload) halted() bool {
	select {
	case <-w.stop:
		return true
	default:
		return false
	}
}

func (w *simWorkload) wait() bool {
	select {
	case <-w.stop:
		return false
	case <-w.tokens:
		return true
	}
}

func (w *simWorkload) worker(slot int, rnd *rand.Rand) {
	for gen := 0; ; gen++ {
		h := w.sc.hosts[rnd.IntN(w.clientHosts)]
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		id := fmt.Sprintf("sim-%d-%d", slot, gen)
		reclaimed := &simReclaimed{}
		conn, err := session.Dial(ctx, "unix", h.cfg.Socket, session.Options{
			ClientID: id, ClientName: "scale simulation client", OnReclaimed: reclaimed.add,
		})
		cancel()
		if err != nil { // the host went down meanwhile
			if !w.wait() {
				return
			}
			continue
		}
		c := &simClient{host: h, id: id, conn: conn, reclaimed: reclaimed}
		w.mu.Lock()
		w.clients[slot] = c
		if h.daemon() == nil { // its host crashed since the dial
			c.dead.Store(true)
		}
		w.mu.Unlock()
		life := w.quota + rnd.IntN(2*w.quota) // operations before it exits or dies
		seenLost := w.lostGen.Load()
		for op := 0; op < life; op++ {
			if !w.wait() {
				return // stays alive: part of the final population
			}
			if c.dead.Load() {
				break
			}
			w.dropReclaimed(c)
			if g := w.lostGen.Load(); g != seenLost {
				seenLost = g
				w.freeLostOf(c)
			}
			if len(c.segs) < w.quota || len(c.segs) == 0 || rnd.IntN(2) == 0 {
				w.alloc(c, rnd)
			} else {
				w.free(c, rnd.IntN(len(c.segs)), false)
			}
		}
		if rnd.IntN(2) == 0 && !c.dead.Load() { // a clean exit frees first
			// Each Free may wait out its timeout when daemons do not
			// answer; once the workload halts (a failed check ends the
			// test) the client stops freeing and dies instead.
			for len(c.segs) > 0 && !w.halted() && !c.dead.Load() {
				w.free(c, len(c.segs)-1, true)
			}
		}
		if len(c.segs) == 0 {
			w.exits.Add(1)
		} else { // dies: its lease runs out and its daemon reclaims
			w.deaths.Add(1)
		}
		w.mu.Lock()
		w.clients[slot] = nil
		w.mu.Unlock()
		conn.Close()
	}
}

// hostCrashed ends the applications of host h, which crashed: they die
// with it (their workers start new ones). Their segments' records survive
// in the host's store; with no application coming back for them, the
// rebooted host reclaims them when their lease runs out.
func (w *simWorkload) hostCrashed(h *simHost) {
	w.mu.Lock()
	var dying []*simClient
	for i, c := range w.clients {
		if c != nil && c.host == h {
			c.dead.Store(true)
			w.clients[i] = nil
			dying = append(dying, c)
		}
	}
	w.mu.Unlock()
	for _, c := range dying {
		c.conn.Close()
	}
}

// dropReclaimed drops from c's list the segments its daemon said it
// reclaimed when c's lease ran out, as an application told so would. The
// caller owns c.
func (w *simWorkload) dropReclaimed(c *simClient) {
	gone := c.reclaimed.take()
	if gone == nil {
		return // the common case, at every operation
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := len(c.segs)
	c.segs = slices.DeleteFunc(c.segs, func(s simSeg) bool {
		if !gone[s.id] {
			return false
		}
		if s.vanished { // counted before the notice came
			if w.vanishedOf[c.id]--; w.vanishedOf[c.id] == 0 {
				delete(w.vanishedOf, c.id)
			}
		}
		return true
	})
	w.reclaimed.Add(uint64(n - len(c.segs)))
}

// topUp has every live client allocate until it holds the quota, at the
// workload's rate: the last phase of the workload, which also fills hosts
// that came back empty. (At full speed, a burst of a thousand allocations
// in a second or two, placement decided on views that gossip had not
// updated yet, and the used fraction max/mean went from 1.05 to 1.25.)
func (w *simWorkload) topUp() {
	w.mu.Lock()
	clients := slices.Clone(w.clients)
	w.mu.Unlock()
	pace := time.NewTicker(time.Duration(float64(time.Second) / w.rate))
	defer pace.Stop()
	var wg sync.WaitGroup
	for i, c := range clients {
		if c == nil || c.host.daemon() == nil {
			continue
		}
		wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(i), 10))
			for tries := 0; len(c.segs) < w.quota && tries < 2*w.quota; tries++ {
				<-pace.C
				w.alloc(c, rnd)
			}
		})
	}
	wg.Wait()
}

func (w *simWorkload) alloc(c *simClient, rnd *rand.Rand) {
	sz := (w.minSize + rnd.Int64N(w.maxSize-w.minSize+1)) &^ 4095
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cctx, _, err := c.conn.Call(ctx)
	if err != nil {
		w.allocFails.Add(1)
		w.lastAllocErr.Store(&err)
		return
	}
	seg, err := c.conn.API().Alloc(cctx, &poolv1.AllocRequest{Size: sz, Tier: poolv1.Tier_TIER_RDMA, Redundancy: simRedundancy(rnd, w.repShare, w.ecShare)})
	if err != nil {
		w.allocFails.Add(1)
		w.lastAllocErr.Store(&err)
		w.mu.Lock()
		c.unsure = true // a timeout may have been allocated all the same
		w.mu.Unlock()
		return
	}
	w.allocs.Add(1)
	w.mu.Lock()
	c.segs = append(c.segs, simSeg{id: seg.Id, size: sz, home: seg.Node})
	w.mu.Unlock()
}

// free frees c's i-th segment. A Free that fails (the daemon did not
// answer in time) leaves the segment with the client, which tries again
// later, as an application would; at exit (dropAnyway) it is dropped, and
// the client's lease reclaims it.
func (w *simWorkload) free(c *simClient, i int, dropAnyway bool) {
	s := c.segs[i]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cctx, _, err := c.conn.Call(ctx)
	if err == nil {
		_, err = c.conn.API().Free(cctx, &poolv1.FreeRequest{Id: s.id})
		err = errs.FromStatus(err)
	}
	if err == nil {
		w.frees.Add(1)
	}
	w.mu.Lock()
	if err == nil || errors.Is(err, errs.ErrNotFound) || dropAnyway {
		c.segs = slices.Delete(c.segs, i, i+1)
	} else {
		c.segs[i].freeFailed = true
	}
	w.mu.Unlock()
}

// allocErr is the last failed allocation's error, for a report ("none").
func (w *simWorkload) allocErr() string {
	if e := w.lastAllocErr.Load(); e != nil {
		return (*e).Error()
	}
	return "none"
}

// vanished returns how many segments clients listed that their daemons
// had no record of without a free of them, and the count per client.
func (w *simWorkload) vanished() (int, map[string]int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, k := range w.vanishedOf {
		n += k
	}
	return n, maps.Clone(w.vanishedOf)
}

// held returns how many segments the live clients hold.
func (w *simWorkload) held() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, c := range w.clients {
		if c != nil {
			n += len(c.segs)
		}
	}
	return n
}

// freeLost frees, for every live client, the segments its daemon reports
// lost: what an application does on a lost notice. Only while the workers
// are halted; a running worker does it itself when lostGen moves.
func (w *simWorkload) freeLost() int {
	w.mu.Lock()
	clients := slices.Clone(w.clients)
	w.mu.Unlock()
	n := 0
	for _, c := range clients {
		if c != nil {
			n += w.freeLostOf(c)
		}
	}
	return n
}

// freeLostOf frees the segments of c that its daemon reports lost and
// returns how many. A record lost by mistake (its running home still holds
// the segment for its owner) is kept: the test waits for its restore
// rather than hide the mistake. The caller owns c (its worker, or any caller once the
// workers are halted).
func (w *simWorkload) freeLostOf(c *simClient) int {
	d := c.host.daemon()
	if d == nil {
		return 0
	}
	w.dropReclaimed(c)
	if c.unsure { // adopt what an unanswered Alloc left it, once per failure
		c.unsure = false
		for _, r := range d.pool.List() {
			if r.Owner == c.id && !slices.ContainsFunc(c.segs, func(s simSeg) bool { return s.id == r.ID }) {
				w.mu.Lock()
				c.segs = append(c.segs, simSeg{id: r.ID, size: r.Size, home: r.Home})
				w.mu.Unlock()
			}
		}
	}
	n := 0
	for i := len(c.segs) - 1; i >= 0; i-- {
		switch r, err := d.pool.Stat(c.segs[i].id); {
		case errors.Is(err, errs.ErrNotFound):
			// Its daemon holds no record of it. After a failed free,
			// that free was applied all the same, its answer lost (a
			// timeout while the daemons were short of CPU); counting
			// the segment would have the top-up allocate that much
			// less. Otherwise the daemon dropped a segment its
			// application holds: counted, for the test to judge.
			w.mu.Lock()
			switch {
			case c.segs[i].freeFailed:
				c.segs = slices.Delete(c.segs, i, i+1)
				w.phantoms.Add(1)
			case !c.segs[i].vanished:
				c.segs[i].vanished = true
				w.vanishedOf[c.id]++
			}
			w.mu.Unlock()
		case err == nil && r.Lost && !w.sc.heldAtHome(c.host.name, r):
			w.free(c, i, false)
			n++
		}
	}
	return n
}

// orphans counts rdma segments that a running host holds for an owner
// that no longer has a record of them (a peer) or no longer exists (a
// local client): capacity that leases and reconciliation must return.
func (sc *simCluster) orphans() int {
	owned := map[string]map[uint64]bool{} // home -> home ids some running owner records
	clients := map[string]map[string]bool{}
	for _, h := range sc.up() {
		p := h.daemon().pool
		p.mu.Lock()
		for _, r := range p.segs {
			homes := r.Homes // a redundant segment's copies or shards
			if r.Home != "" {
				homes = append(homes[:len(homes):len(homes)], homeRef{Node: r.Home, HomeID: r.HomeID})
			}
			for _, x := range homes {
				if owned[x.Node] == nil {
					owned[x.Node] = map[uint64]bool{}
				}
				owned[x.Node][x.HomeID] = true
			}
		}
		clients[h.name] = map[string]bool{}
		for id := range p.clients {
			clients[h.name][id] = true
		}
		p.mu.Unlock()
	}
	n := 0
	for _, h := range sc.up() {
		p := h.daemon().pool
		p.mu.Lock()
		for _, r := range p.segs {
			if r.Home != "" || r.Tier != poolv1.Tier_TIER_RDMA || r.pinned() {
				continue
			}
			if peerName, ok := strings.CutPrefix(r.Owner, peerClientPrefix); ok {
				if !owned[h.name][r.ID] && clients[h.name][r.Owner] && sc.hostUp(peerName) {
					n++
				}
				continue
			}
			if !clients[h.name][r.Owner] {
				n++
			}
		}
		p.mu.Unlock()
	}
	return n
}

func (sc *simCluster) hostUp(name string) bool {
	h := sc.host(name)
	return h != nil && h.daemon() != nil
}

// lostOutside is a record lost on a running host although its home is
// not the crashed host (or it has none), with what its owner's view
// shows.
type lostOutside struct {
	host *simHost
	id   uint64
	// judged: the owner's failure detector declared the home dead since
	// the crash began (it lists the home dead or left now, or alive again
	// since then). Segments on a dead node are lost until its return is
	// reconciled (homeChanged), so such a record is lost as designed, and
	// restored once its home is back; a home falsely declared dead by one
	// owner (it missed the home's refutation of a suspicion: memberlist
	// then declares the death on its own) does this to that owner alone.
	judged bool
	// evidence says how the owner lists the home, since when, and what the
	// home holds; for a redundant record also each home's state in it and
	// how the owner lists that home's node.
	evidence string
}

func (l lostOutside) String() string { return fmt.Sprintf("%s:%d(%s)", l.host.name, l.id, l.evidence) }

// lostElsewhere lists the records on running hosts other than except that
// are lost although their home is not except (or they are not homed at
// all), in two lists: those whose owner declared their home dead at or
// after since (lostOutside.judged), and the others, which nothing
// explains. A redundant record is never judged: its loss is that of its
// homes together, not of its first home.
func (sc *simCluster) lostElsewhere(except string, since time.Time) (judged, unexplained []lostOutside) {
	for _, h := range sc.up() {
		if h.name == except {
			continue
		}
		p := h.daemon().pool
		for _, r := range p.List() {
			if !r.Lost || r.Home == except {
				continue
			}
			l := lostOutside{host: h, id: r.ID, evidence: "no home: lost on this host"}
			if r.Home != "" {
				view := "does not list it"
				if m, ok := p.cl.Member(r.Home); ok {
					view = fmt.Sprintf("lists it %s since %+.2fs from the crash", cluster.StateString(m.State), m.Since.Sub(since).Seconds())
					l.judged = !r.redundant() && (m.State != cluster.StateAlive || m.Since.After(since))
				}
				l.evidence = fmt.Sprintf("home %q: the owner %s; at home: %s", r.Home, view, sc.atHome(h, &r))
			}
			if r.redundant() {
				l.evidence += "; redundant " + r.Redundancy.spec().String() + ", homes:"
				for _, hr := range r.Homes {
					view := "not listed"
					if m, ok := p.cl.Member(hr.Node); ok {
						view = fmt.Sprintf("%s since %+.2fs", cluster.StateString(m.State), m.Since.Sub(since).Seconds())
					}
					l.evidence += fmt.Sprintf(" %s %s (owner: %s)", hr.Node, strings.ToLower(strings.TrimPrefix(hr.State.String(), "HOME_STATE_")), view)
				}
			}
			if l.judged {
				judged = append(judged, l)
			} else {
				unexplained = append(unexplained, l)
			}
		}
	}
	byName := func(a, b lostOutside) int { return strings.Compare(a.String(), b.String()) }
	slices.SortFunc(judged, byName)
	slices.SortFunc(unexplained, byName)
	return judged, unexplained
}

// atHome says what the home of r, a record of h's, holds for it: "down",
// "gone", "held for" another owner, "lost too" or "held intact".
func (sc *simCluster) atHome(h *simHost, r *record) string {
	home := sc.host(r.Home)
	if home == nil || home.daemon() == nil {
		return "down"
	}
	switch hr, err := home.daemon().pool.Stat(r.HomeID); {
	case err != nil:
		return "gone"
	case hr.Owner != peerClientPrefix+h.name:
		return "held for " + hr.Owner
	case hr.Lost:
		return "lost too"
	default:
		return "held intact"
	}
}

// awaitRestored waits up to within until every record of ls is no longer
// lost (or freed) and returns those still lost then.
func (sc *simCluster) awaitRestored(ls []lostOutside, within time.Duration) []lostOutside {
	deadline := time.Now().Add(within)
	for {
		left := slices.DeleteFunc(slices.Clone(ls), func(l lostOutside) bool {
			d := l.host.daemon()
			if d == nil {
				return true
			}
			r, err := d.pool.Stat(l.id)
			return err != nil || !r.Lost
		})
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// homedOn lists, per running host, the ids of its records homed on node,
// redundant ones aside (they survive the loss of a home: redundantOn).
func (sc *simCluster) homedOn(node string) map[*simHost][]uint64 {
	out := map[*simHost][]uint64{}
	for _, h := range sc.up() {
		p := h.daemon().pool
		p.mu.Lock()
		for _, r := range p.segs {
			if r.Home == node && !r.redundant() {
				out[h] = append(out[h], r.ID)
			}
		}
		p.mu.Unlock()
	}
	return out
}

// allLost reports whether every id of ids on h is lost (or gone).
func allLost(h *simHost, ids []uint64) bool {
	d := h.daemon()
	if d == nil {
		return true
	}
	d.pool.mu.Lock()
	defer d.pool.mu.Unlock()
	for _, id := range ids {
		if r := d.pool.segs[id]; r != nil && !r.Lost {
			return false
		}
	}
	return true
}

// lostCount counts lost records on running hosts.
func (sc *simCluster) lostCount() int {
	n := 0
	for _, h := range sc.up() {
		p := h.daemon().pool
		p.mu.Lock()
		for _, r := range p.segs {
			if r.Lost {
				n++
			}
		}
		p.mu.Unlock()
	}
	return n
}

// lostAtHome splits the lost records on running hosts: wrong counts those
// whose home is running and still holds the segment for the owner (the
// owner will or should restore it), gone those whose running home no longer
// holds it (it reclaimed them when the owner's lease there ran out: lost
// for real, and rightly reported so).
func (sc *simCluster) lostAtHome() (wrong, gone int) {
	for _, h := range sc.up() {
		var lost []record
		for _, r := range h.daemon().pool.List() {
			if r.Lost {
				lost = append(lost, r)
			}
		}
		for _, r := range lost {
			switch home := sc.host(r.Home); {
			case home == nil || home.daemon() == nil:
				// its home is down (or it is this host's own memory): lost
				// until it returns
			case sc.heldAtHome(h.name, r):
				wrong++
			default:
				gone++
			}
		}
	}
	return wrong, gone
}

// heldAtHome reports whether r, a record on host owner, names a segment
// that its running home still holds for owner, contents intact (a home
// that rebooted keeps its records, lost). A redundant record's segment is
// held while it can be served again: enough of its copies or shards (one
// copy, k shards), OK or kept unreachable, are held so at their homes, or
// its origin is rebuilding a home of it. One with fewer is lost for real
// (its origin's lease at the other homes ran out while it was down, say),
// whichever home its first one is.
func (sc *simCluster) heldAtHome(owner string, r record) bool {
	if !r.redundant() {
		return sc.holds(owner, r.Home, r.HomeID)
	}
	n := 0
	for _, h := range r.Homes {
		if (h.State == poolv1.HomeState_HOME_STATE_OK || h.State == poolv1.HomeState_HOME_STATE_UNREACHABLE) && sc.holds(owner, h.Node, h.HomeID) {
			n++
		}
	}
	if n >= max(1, r.Redundancy.Data) {
		return true
	}
	o := sc.host(owner)
	if o == nil || o.daemon() == nil || o.daemon().pool.rb == nil {
		return false
	}
	rb := o.daemon().pool.rb
	rb.mu.Lock()
	defer rb.mu.Unlock()
	return rb.busy[r.ID]
}

// holds reports whether node is running and holds its segment id for
// owner, contents intact.
func (sc *simCluster) holds(owner, node string, id uint64) bool {
	home := sc.host(node)
	if home == nil {
		return false
	}
	d := home.daemon()
	if d == nil {
		return false
	}
	hr, err := d.pool.Stat(id)
	return err == nil && hr.Owner == peerClientPrefix+owner && !hr.Lost
}

func (sc *simCluster) host(name string) *simHost {
	for _, h := range sc.hosts {
		if h.name == name {
			return h
		}
	}
	return nil
}

// drain sets or clears h's draining flag through its control plane, as
// memctl drain does.
func (sc *simCluster) drain(h *simHost, undo bool) error {
	conn, err := session.Channel("unix", h.cfg.Socket)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = poolv1.NewPoolClient(conn).Drain(ctx, &poolv1.DrainRequest{Undo: undo})
	return err
}

// explainLost is the diagnosis a test prints when lost records remain:
// they are counted by what explains them (the host holding the record,
// the home it names or its own memory, the owner and its session there,
// the home in the holder's view, what the home holds), one line a kind,
// the 40 most frequent kinds.
func (sc *simCluster) explainLost() string {
	kinds := map[string]int{}
	for _, h := range sc.up() {
		p := h.daemon().pool
		for _, r := range p.List() {
			if !r.Lost {
				continue
			}
			owner := "a local client"
			if strings.HasPrefix(r.Owner, peerClientPrefix) {
				owner = "a peer"
			}
			p.mu.Lock()
			switch c := p.clients[r.Owner]; {
			case c == nil:
				owner += " without a lease"
			case c.sessions > 0:
				owner += " in session"
			default:
				owner += fmt.Sprintf(" whose lease ends in %v", time.Until(c.expires).Round(time.Second))
			}
			p.mu.Unlock()
			where := "its own memory"
			if r.Home != "" {
				view := "unknown"
				if m, ok := p.cl.Member(r.Home); ok {
					view = cluster.StateString(m.State)
				}
				where = fmt.Sprintf("homed on %s (%s in its view; at home: %s)", r.Home, view, sc.atHome(h, &r))
			}
			if r.redundant() {
				var homes []string
				for _, x := range r.Homes {
					homes = append(homes, x.Node+" "+strings.TrimPrefix(x.State.String(), "HOME_STATE_"))
				}
				where = fmt.Sprintf("redundant %s (homes %s)", r.Redundancy.spec(), strings.Join(homes, ", "))
			}
			kinds[fmt.Sprintf("on %s, %s, owned by %s", h.name, where, owner)]++
		}
	}
	return kindLines(kinds, 40)
}

// simLogPath is -sim.log: where the simulated daemons log, for a look at
// what they did in a failed run (TestScale's included).
var simLogPath = flag.String("sim.log", "", "simulated hosts: append every daemon's log (text, info and up, with its host) to this file; none if empty")

// simLogFile is -sim.log opened once, shared by every simulated daemon.
var simLogFile = sync.OnceValue(func() *os.File {
	if *simLogPath == "" {
		return nil
	}
	f, err := os.OpenFile(*simLogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		panic(fmt.Sprintf("-sim.log: %v", err))
	}
	return f
})

// simLog is the logger of the simulated daemon of host name: nil (none)
// without -sim.log.
func simLog(name string) *slog.Logger {
	f := simLogFile()
	if f == nil {
		return nil
	}
	return slog.New(slog.NewTextHandler(f, &slog.HandlerOptions{Level: slog.LevelInfo})).With("host", name)
}

// firstLines is s cut after n lines, saying how many more there were.
func firstLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) <= n {
		return s
	}
	return strings.Join(lines[:n], "") + fmt.Sprintf("(%d more)\n", len(lines)-n)
}

// appSession opens a session of client "app" on oh's daemon, closed at the
// test's end, and returns it with call, which begins a call on it.
func appSession(t *testing.T, oh *simHost) (conn *session.Conn, call func() context.Context) {
	conn, err := session.Dial(t.Context(), "unix", oh.cfg.Socket, session.Options{ClientID: "app"})
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn, func() context.Context {
		cctx, _, err := conn.Call(t.Context())
		require.NoError(t, err)
		return cctx
	}
}
