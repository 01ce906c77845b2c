package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/stretchr/testify/require"
)

// patience bounds every wait for gossip to converge. It is a liveness bound
// (generous, for a loaded CI machine under -race), never a measurement.
const patience = 30 * time.Second

// fastConfig is the "local" profile with shorter timers so failure
// detection takes seconds, not tens of seconds. The 1 s push/pull matters
// in clusters this small: memberlist sends each broadcast only
// RetransmitMult*ceil(log10(n+1)) = 2 times, so a node can miss a join or a
// leave announcement until the next push/pull (15 s in the local profile).
func fastConfig(name string) Config {
	cfg := DefaultConfig()
	cfg.Name = name
	cfg.Profile = ProfileLocal
	cfg.ProbeInterval = 250 * time.Millisecond
	cfg.ProbeTimeout = 150 * time.Millisecond
	cfg.GossipInterval = 50 * time.Millisecond
	cfg.PushPullInterval = time.Second
	cfg.GossipToTheDeadTime = time.Minute // keep dead nodes listed for the whole test
	if os.Getenv("CLUSTER_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("test_node", name)
	}
	return cfg
}

// testMeta is what a poold with all three tiers would gossip.
func testMeta(name string) Meta {
	return Meta{
		Proto:    1,
		GRPCAddr: name + ".farm.example:7070",
		DataAddr: name + ".farm.example:7071",
		Tiers: []TierFree{
			{Name: "cxl", Capacity: 64 << 30, Free: 60 << 30},
			{Name: "local", Capacity: 16 << 30, Free: 15 << 30},
			{Name: "rdma", Capacity: 128 << 30, Free: 100 << 30},
		},
	}
}

// startMem starts one node on the in-memory network and shuts it down at
// the end of the test.
func startMem(t *testing.T, n *memnet.Network, name string) *Cluster {
	t.Helper()
	return startMemTuned(t, n, name, nil)
}

// startMemTuned is startMem with fastConfig changed by tune (nil: none).
func startMemTuned(t *testing.T, n *memnet.Network, name string, tune func(*Config)) *Cluster {
	t.Helper()
	tr, err := n.NewTransport(name)
	require.NoError(t, err)
	cfg := fastConfig(name)
	cfg.Transport = tr
	if tune != nil {
		tune(&cfg)
	}
	c, err := New(cfg, testMeta(name))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Shutdown()) })
	return c
}

// startMemCluster starts nodes n0..n(count-1) and joins them through n0.
func startMemCluster(t *testing.T, n *memnet.Network, count int) []*Cluster {
	t.Helper()
	cs := make([]*Cluster, count)
	for i := range cs {
		cs[i] = startMem(t, n, fmt.Sprintf("n%d", i))
	}
	seed := cs[0].Self().Addr
	for _, c := range cs[1:] {
		reached, err := c.Join(t.Context(), []string{seed})
		require.NoError(t, err)
		require.Equal(t, 1, reached)
	}
	waitAllAlive(t, cs)
	return cs
}

// startGossipOnlyCluster starts nodes n0..n(count-1) whose capacity
// updates travel by gossip alone: push/pull once an hour, probes rare
// enough that a lost probe (they piggyback broadcasts) does not become a
// suspicion within a test, and no compression, so that a memnet filter
// finds messages in packets. It returns once every node sees every node.
func startGossipOnlyCluster(t *testing.T, n *memnet.Network, count int) []*Cluster {
	t.Helper()
	cs := make([]*Cluster, count)
	for i := range cs {
		cs[i] = startMemTuned(t, n, fmt.Sprintf("n%d", i), func(cfg *Config) {
			cfg.NoCompression = true
			// Without push/pull, gossip alone must reach every node: the
			// lan profile's 4 (poold's default) instead of the local
			// profile's 2, with which an epidemic among 20 nodes misses
			// one every few runs.
			cfg.PushPullInterval, cfg.RetransmitMult = time.Hour, 4
			cfg.ProbeInterval, cfg.ProbeTimeout = 5*time.Second, 2*time.Second
		})
	}
	// Without push/pull a node may miss a later node's join, which gossip
	// sends only a few times: a node that does not list every node pulls
	// the seed's state again, until every one does. (Twice for each was
	// not always enough: memberlist answers a push/pull before it merges
	// the joiner's state, and about one run in ten a node's second pull
	// still missed one joiner, for good.)
	waitFor(t, "every node lists every node", func() bool {
		all := true
		for _, c := range cs[1:] {
			if c.ml.NumMembers() < count {
				all = false
				_, err := c.Join(t.Context(), []string{cs[0].Self().Addr})
				require.NoError(t, err)
			}
		}
		return all && cs[0].ml.NumMembers() == count
	})
	waitAllAlive(t, cs)
	return cs
}

// waitAllAlive waits until every node of cs sees every node alive.
func waitAllAlive(t *testing.T, cs []*Cluster) {
	t.Helper()
	waitFor(t, "every node sees every node alive", func() bool {
		for _, c := range cs {
			if c.Stats().Alive != len(cs) {
				return false
			}
		}
		return true
	})
}

// capacityMark is how every capacity update of c starts (type byte, boot,
// name), to find them in packets.
func capacityMark(c *Cluster) string {
	return string(capUpdate{name: c.name, boot: c.boot}.encode()[:1+8+1+len(c.name)])
}

// waveWatch counts, through a memnet filter, the packets that carry one
// node's capacity updates: those it dropped, and the others by sender and
// receiver, so that a test can tell a node its gossip wave never reached
// from one that lost what it was sent. Safe for concurrent use.
type waveWatch struct {
	mu      sync.Mutex
	dropped int
	sent    map[[2]string]int // (from, to) -> packets carrying an update
}

// watchWave makes n's filter drop the packets that carry a capacity update
// of origin and for which drop (nil: none) returns true, and count them
// all. Other packets pass.
func watchWave(n *memnet.Network, origin *Cluster, drop func(from, to string) bool) *waveWatch {
	w := &waveWatch{sent: make(map[[2]string]int)}
	mark := capacityMark(origin)
	n.Filter(func(from, to string, p []byte) bool {
		if !strings.Contains(string(p), mark) {
			return false
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if drop != nil && drop(from, to) {
			w.dropped++
			return true
		}
		w.sent[[2]string{from, to}]++
		return false
	})
	return w
}

// lost returns how many packets carrying an update w dropped.
func (w *waveWatch) lost() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dropped
}

// count returns how many packets carrying an update from sent to and w
// let pass; "" stands for any node.
func (w *waveWatch) count(from, to string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	total := 0
	for k, v := range w.sent {
		if (from == "" || k[0] == from) && (to == "" || k[1] == to) {
			total += v
		}
	}
	return total
}

// sees reports whether c sees origin's rdma tier with free bytes.
func sees(c, origin *Cluster, free int64) bool {
	m, _ := c.Member(origin.name)
	return m.Meta.Tiers[2].Free == free
}

// waitWave waits until every node of cs but skip sees origin's rdma tier
// with free bytes, or until the wave of origin's capacity update is over:
// the origin made all its repairs (repairs0 is its CapacityRepairs before
// the update), no node has a broadcast queued, and every node that was
// sent the update (as w counted) applied it. It returns the nodes (skip
// aside) without the change then, which no packet carrying it reached.
//
// Those are gossip's residue, not a fault: each node that applies an
// update sends it to limit random peers (12 at 20 nodes with
// RetransmitMult 4), so each node is sent about limit copies in a wave
// and misses them all with probability about e^-12: at 20 nodes about one
// wave in 8,500 misses a node. The origin's later repairs reach 3 random
// peers each and rarely that one; push/pull, which startGossipOnlyCluster
// runs once an hour, would bring it the update.
func waitWave(t *testing.T, w *waveWatch, cs []*Cluster, origin *Cluster, repairs0 uint64, skip *Cluster, free int64) (missed []*Cluster) {
	t.Helper()
	defer func() {
		if t.Failed() {
			for _, c := range cs {
				if c != skip && !sees(c, origin, free) {
					t.Logf("%s does not see the change; it was sent %d packets carrying it", c.name, w.count("", c.name))
				}
			}
			t.Logf("the origin made %d repairs", origin.Stats().CapacityRepairs-repairs0)
		}
	}()
	waitFor(t, "every node sees the change or its wave is over", func() bool {
		missed = missed[:0]
		for _, c := range cs {
			if c == skip || sees(c, origin, free) {
				continue
			}
			if w.count("", c.name) > 0 {
				return false // it got a packet carrying the update: still applying it, or lost it
			}
			missed = append(missed, c)
		}
		if len(missed) == 0 {
			return true
		}
		if origin.Stats().CapacityRepairs < repairs0+uint64(len(repairRounds)) {
			return false
		}
		for _, c := range cs {
			if queued, _ := c.bcast.stats(); queued > 0 {
				return false
			}
		}
		return true
	})
	return missed
}

// waitFor polls cond until it holds or patience runs out.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("gave up after %v waiting until %s", patience, what)
		case <-tick.C:
		}
	}
}

// stateOn returns how c sees the named node, or "absent".
func stateOn(c *Cluster, name string) string {
	m, ok := c.Member(name)
	if !ok {
		return "absent"
	}
	return StateString(m.State)
}

// nextEvent returns the next event about name, skipping others.
func nextEvent(t *testing.T, ch <-chan Event, name string) Event {
	t.Helper()
	timeout := time.NewTimer(patience)
	defer timeout.Stop()
	for {
		select {
		case e, ok := <-ch:
			require.True(t, ok, "subscription closed while waiting for an event about %s", name)
			if e.Member.Name == name {
				return e
			}
		case <-timeout.C:
			t.Fatalf("no event about %s within %v", name, patience)
		}
	}
}
