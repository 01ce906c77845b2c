package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/bench"
	"github.com/farmem/farmem/internal/bench/benchtest"
	"github.com/farmem/farmem/internal/pooltest"
)

func TestBenchCompareJSON(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	mc, rd := benchtest.Memcached(t), benchtest.Redis(t)
	plot := filepath.Join(t.TempDir(), "cdf.png")
	out, stderr, code := memctl(t, cfg.Socket, "bench", "--compare", "--memcached", mc, "--redis", rd,
		"--duration", "40ms", "--rounds", "1", "--sizes", "64,4KiB", "--depths", "1,4", "--plot", plot, "-o", "json", "--servers-in-process")
	require.Zero(t, code, stderr)

	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &rows))
	type key struct{ system, op string }
	seen := map[key]int{}
	for _, r := range rows {
		for _, k := range []string{"system", "op", "size", "depth", "ops_per_sec", "p50_ns", "p99_ns", "client_cpu_ns_per_op"} {
			require.Contains(t, r, k, "row %v", r)
		}
		require.Positive(t, r["ops_per_sec"], "row %v", r)
		sys := r["system"].(string)
		seen[key{sys, r["op"].(string)}]++
		switch sys {
		case "memcached", "redis":
			require.Contains(t, r, "server_cpu_ns_per_op", "%s runs in a process of its own", sys)
		case "memory", "tcp-raw", "grpc": // --servers-in-process
			require.NotContains(t, r, "server_cpu_ns_per_op", "%s serves from this process", sys)
		}
		if sys != "farmem-rdma" {
			require.Contains(t, r, "vs", "row %v", r)
			require.Contains(t, r, "ops_ratio", "row %v", r)
			require.Contains(t, r, "p50_ratio", "row %v", r)
		}
	}
	for _, sys := range []string{"farmem-cxl", "farmem-dram", "farmem-rdma", "memory", "tcp-raw", "grpc", "memcached", "redis"} {
		require.Equal(t, 4, seen[key{sys, "read"}], "%s: a read row per size and depth", sys)
		require.Equal(t, 4, seen[key{sys, "write"}], "%s: a write row per size and depth", sys)
	}
	for _, sys := range []string{"farmem-cxl", "farmem-dram", "farmem-rdma", "memory", "memcached", "redis"} {
		require.Equal(t, 2, seen[key{sys, "atomic"}], "%s: an atomic row per depth", sys)
	}
	require.Zero(t, seen[key{"grpc", "atomic"}])

	b, err := os.ReadFile(plot)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(b), "\x89PNG\r\n\x1a\n"), "a PNG")
}

func TestBenchTable(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	svg := filepath.Join(t.TempDir(), "cdf.svg")
	// memctl's binary here is the test binary, which cannot run
	// bench-serve: the servers run in-process (TestBenchServe covers the
	// command, internal/bench the child processes).
	out, stderr, code := memctl(t, cfg.Socket, "bench", "--compare", "--duration", "30ms",
		"--ops", "read", "--sizes", "4KiB", "--depths", "1", "--plot", svg, "--servers-in-process")
	require.Zero(t, code, stderr)
	for _, want := range []string{"SYSTEM", "farmem-cxl", "farmem-rdma", "tcp-raw", "grpc", "memory",
		"farmem-cxl ÷ farmem-rdma", "farmem-rdma ÷ grpc", svg} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "memcached", "not asked for")
	require.NotContains(t, stderr, "\r", "no progress bar when stdout is no terminal")
	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	require.Contains(t, string(b[:200]), "<svg")
}

func TestBenchErrors(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"memcached without compare", []string{"--memcached", "127.0.0.1:1"}, "--compare"},
		{"bad size", []string{"--sizes", "lots"}, "--sizes"},
		{"bad depth", []string{"--depths", "0"}, "--depths"},
		{"bad op", []string{"--ops", "scan"}, "--ops"},
		{"bad tier", []string{"--tiers", "tape"}, "--tiers"},
		{"bad duration", []string{"--duration", "0s"}, "--duration"},
		{"bad rounds", []string{"--rounds", "0"}, "--rounds"},
		{"no memcached there", []string{"--compare", "--ops", "read", "--sizes", "64", "--depths", "1", "--duration", "10ms", "--memcached", "127.0.0.1:1", "--servers-in-process"}, "memcached at 127.0.0.1:1"},
		{"bad plot file", []string{"--ops", "read", "--sizes", "64", "--depths", "1", "--duration", "10ms", "--plot", "x.gif"}, ".png or .svg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := memctl(t, cfg.Socket, append([]string{"bench"}, tc.args...)...)
			require.NotZero(t, code)
			require.Contains(t, stderr, tc.want)
		})
	}
}

func TestBenchServe(t *testing.T) {
	for _, kind := range []string{"tcp-raw", "grpc"} {
		t.Run(kind, func(t *testing.T) {
			stdinR, stdinW := io.Pipe()
			outR, outW := io.Pipe()
			root := newRoot(outW)
			root.SetArgs([]string{"bench-serve", kind, "--max-size", "4KiB"})
			root.SetIn(stdinR)
			done := make(chan error, 1)
			go func() { done <- root.Execute(); outW.Close() }()
			addr, err := bufio.NewReader(outR).ReadString('\n')
			require.NoError(t, err)
			addr = strings.TrimSpace(addr)
			var sys bench.System
			if kind == "grpc" {
				sys, err = bench.DialGRPC(addr, 0)
			} else {
				sys, err = bench.DialTCPRaw(addr, 4096, 0)
			}
			require.NoError(t, err)
			res, err := bench.Run(t.Context(), sys, bench.Case{Op: bench.Read, Size: 4096, Depth: 2, Count: 50})
			require.NoError(t, err)
			require.EqualValues(t, 50, res.Ops)
			require.NoError(t, sys.Close())
			stdinW.Close()
			require.NoError(t, <-done)
		})
	}
	_, stderr, code := memctl(t, pooltest.SocketPath(t), "bench-serve", "smtp")
	require.NotZero(t, code)
	require.Contains(t, stderr, "tcp-raw or grpc")
}

// bench frees its segments when it ends: after a run, after a run that
// failed, and after one that was interrupted (its context ended, as Ctrl-C
// ends it), none waits for the lease.
func TestBenchFreesItsSegments(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.LeaseTTL = time.Minute // a segment left behind would stay for the whole test
	pooltest.Start(t, cfg)
	segments := func() float64 {
		out, stderr, code := memctl(t, cfg.Socket, "status", "-o", "json")
		require.Zero(t, code, stderr)
		var st map[string]any
		require.NoError(t, json.Unmarshal([]byte(out), &st))
		return st["segments"].(float64)
	}
	short := []string{"bench", "--ops", "read", "--sizes", "64", "--depths", "1", "--duration", "10ms", "--rounds", "1"}

	_, stderr, code := memctl(t, cfg.Socket, short...)
	require.Zero(t, code, stderr)
	require.Zero(t, segments(), "after a run")

	_, stderr, code = memctl(t, cfg.Socket, append(short, "--compare", "--memcached", "127.0.0.1:1", "--servers-in-process")...)
	require.NotZero(t, code)
	require.Contains(t, stderr, "memcached at 127.0.0.1:1")
	require.Zero(t, segments(), "after a run that failed")

	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(300*time.Millisecond, cancel)
	var out, errOut strings.Builder
	code = runContext(ctx, []string{"--socket", cfg.Socket, "bench", "--ops", "read", "--sizes", "64", "--depths", "1", "--duration", "1m", "--rounds", "1"}, &out, &errOut)
	require.NotZero(t, code, "an interrupted run fails")
	require.Contains(t, errOut.String(), "context canceled")
	require.Zero(t, segments(), "after an interrupted run")
}
