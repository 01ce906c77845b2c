package cluster

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/stretchr/testify/require"
)

// TestSimulationScale starts CLUSTER_SIM_NODES nodes (default: skipped) on
// one memnet network with the plain "local" profile, joins them all through
// node 0, and reports what a node costs: goroutines, heap, and the time
// until every node lists every other alive. It is opt-in because it is a
// measurement, not a check:
//
//	CLUSTER_SIM_NODES=200 go test -run TestSimulationScale -v ./internal/cluster
func TestSimulationScale(t *testing.T) {
	nodes, _ := strconv.Atoi(os.Getenv("CLUSTER_SIM_NODES"))
	if nodes < 2 {
		t.Skip("set CLUSTER_SIM_NODES=N (N >= 2) to measure an N-node simulation")
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	g0 := runtime.NumGoroutine()

	n := memnet.New(0)
	cs := make([]*Cluster, nodes)
	for i := range cs {
		name := fmt.Sprintf("sim%04d", i)
		tr, err := n.NewTransport(name)
		require.NoError(t, err)
		cfg := DefaultConfig()
		cfg.Name, cfg.Profile, cfg.Transport = name, ProfileLocal, tr
		c, err := New(cfg, testMeta(name))
		require.NoError(t, err)
		cs[i] = c
	}
	defer func() {
		for _, c := range cs {
			require.NoError(t, c.Shutdown())
		}
	}()
	start := time.Now()
	for _, c := range cs[1:] {
		_, err := c.Join(t.Context(), []string{cs[0].Self().Addr})
		require.NoError(t, err)
	}
	joined := time.Since(start)
	deadline := time.Now().Add(5 * time.Minute)
	for {
		done := 0
		for _, c := range cs {
			if c.Stats().Alive == nodes {
				done++
			}
		}
		if done == nodes {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d of %d nodes see everyone after 5 minutes", done, nodes)
		time.Sleep(100 * time.Millisecond)
	}
	converged := time.Since(start)
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	g := runtime.NumGoroutine() - g0
	ns := n.Stats()
	t.Logf("%d nodes: joins took %v, all see all alive after %v", nodes, joined.Round(time.Millisecond), converged.Round(time.Millisecond))
	t.Logf("goroutines: %d (%.1f per node); heap in use: %.1f MiB (%.1f KiB per node, %.0f bytes per member entry incl. memberlist's)",
		g, float64(g)/float64(nodes), float64(after.HeapInuse-before.HeapInuse)/(1<<20),
		float64(after.HeapInuse-before.HeapInuse)/1024/float64(nodes), float64(after.HeapInuse-before.HeapInuse)/float64(nodes*nodes))
	t.Logf("network: %d packets (%d bytes), %d dropped, %d streams", ns.Packets, ns.PacketBytes, ns.Dropped, ns.Streams)
}
