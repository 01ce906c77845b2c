package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/pooltest"
)

// TestAllocMaxLatency runs memctl alloc with a latency budget against a
// daemon that measured its tiers (memctl tiers --measure): 2us lands on
// cxl or local (the loopback rdma tier reads in tens of µs over TCP),
// judged by the measured figure; 1ns is refused with a message about
// latency that names the best tier; zero and negative budgets are invalid.
func TestAllocMaxLatency(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	s := cfg.Socket
	_, stderr, code := memctl(t, s, "tiers", "--measure")
	require.Zero(t, code, stderr)

	out, stderr, code := memctl(t, s, "alloc", "--size", "4KiB", "--max-latency", "2us", "-o", "json")
	require.Zero(t, code, stderr)
	var seg struct {
		Tier      string `json:"tier"`
		Placement struct {
			ReadLatency      latencyJSON `json:"read_latency"`
			MaxReadLatencyNs int64       `json:"max_read_latency_ns"`
			Reason           string      `json:"reason"`
		} `json:"placement"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &seg), out)
	require.Contains(t, []string{"cxl", "local"}, seg.Tier, seg.Placement.Reason)
	require.Equal(t, "measured", seg.Placement.ReadLatency.Source)
	require.LessOrEqual(t, seg.Placement.ReadLatency.P50Ns, int64(2000))
	require.Equal(t, int64(2000), seg.Placement.MaxReadLatencyNs)
	t.Logf("--max-latency 2us: %s; %s", seg.Tier, seg.Placement.Reason)

	out, stderr, code = memctl(t, s, "alloc", "--size", "4KiB", "--max-latency", "2us")
	require.Zero(t, code, stderr)
	require.Regexp(t, `allocated segment \d+: 4.0 KiB on (cxl|local) `, out)
	require.Contains(t, out, "placed by: the cheapest tier (rdma, cxl, local) with read latency ≤ 2µs")

	_, stderr, code = memctl(t, s, "alloc", "--size", "4KiB", "--max-latency", "1ns")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "read latency ≤ 1ns: over budget")
	require.Regexp(t, `the best tier, (cxl|local|rdma), reads in \S+ p50 \(measured\), over 1ns`, stderr)

	_, stderr, code = memctl(t, s, "alloc", "--size", "4KiB", "--min-bandwidth", "1000TB/s")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "read bandwidth ≥ 1000.00 TB/s: over budget")

	for _, args := range [][]string{
		{"--max-latency", "0"}, {"--max-latency", "-2us"}, {"--min-bandwidth", "0"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			_, stderr, code := memctl(t, s, append([]string{"alloc", "--size", "4KiB"}, args...)...)
			require.Equal(t, 1, code)
			require.Contains(t, stderr, args[0])
			require.Contains(t, stderr, "invalid argument: a ")
			require.Contains(t, stderr, "budget must be positive")
		})
	}
	_, stderr, code = memctl(t, s, "alloc", "--size", "4KiB", "--min-bandwidth", "fast")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "bytes per second such as 1GB/s")

	// Nothing but the two segments that fit was allocated.
	out, stderr, code = memctl(t, s, "segments", "-o", "json")
	require.Zero(t, code, stderr)
	var segs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &segs))
	require.Len(t, segs, 2)
}

// TestAllocRedundancy: memctl alloc --redundancy is parsed as poold
// parses it (a malformed spec is refused before any call, with the forms
// it accepts); a daemon in no cluster refuses replicas=2 naming the hosts
// it needs, places one plain copy with or-fewer (its redundancy none), and
// refuses redundancy on a load/store tier; memctl segments has the
// REDUNDANCY column.
func TestAllocRedundancy(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	s := cfg.Socket
	_, stderr, code := memctl(t, s, "alloc", "--size", "4KiB", "--tier", "rdma", "--redundancy", "ec=4")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "--redundancy: invalid argument")
	require.Contains(t, stderr, "ec=K+M")

	_, stderr, code = memctl(t, s, "alloc", "--size", "4KiB", "--tier", "rdma", "--redundancy", "replicas=2")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "needs 2 distinct hosts")
	require.Contains(t, stderr, "no cluster")

	_, stderr, code = memctl(t, s, "alloc", "--size", "4KiB", "--tier", "cxl", "--redundancy", "replicas=2")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "for the rdma tier only")

	out, stderr, code := memctl(t, s, "alloc", "--size", "4KiB", "--tier", "rdma", "--redundancy", "replicas=2,or-fewer", "-o", "json")
	require.Zero(t, code, stderr)
	var seg map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &seg), out)
	require.Equal(t, "rdma", seg["tier"])
	require.NotContains(t, seg, "redundancy", "one copy: no redundancy")

	out, stderr, code = memctl(t, s, "segments")
	require.Zero(t, code, stderr)
	require.Contains(t, out, "REDUNDANCY")
}

// FuzzRateFlag: --min-bandwidth reads any text without panicking, never
// to a negative rate, and reads what it prints back to the same rate.
// Seeds: testdata/fuzz/FuzzRateFlag.
func FuzzRateFlag(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		var r rateFlag
		if r.Set(s) != nil {
			return
		}
		require.GreaterOrEqual(t, int64(r), int64(0))
		if r == 0 {
			return
		}
		var back rateFlag
		require.NoError(t, back.Set(r.String()))
		require.Equal(t, r, back)
	})
}
