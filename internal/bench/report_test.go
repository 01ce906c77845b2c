package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// row is a measured row with a latency distribution around p50.
func row(system string, op Op, size, depth int, ops float64, p50 int64) Row {
	h := new(Histogram)
	for i := range 100 {
		h.Record(time.Duration(p50 * int64(90+i/5) / 100))
	}
	return Row{System: system, Op: op, Size: size, Depth: depth, OpsPerSec: ops, P50Ns: p50, Latency: h}
}

func TestCompareRatios(t *testing.T) {
	rows := []Row{
		row("farmem-rdma", Read, 4096, 1, 50000, 20000),
		row("farmem-rdma", Read, 4096, 16, 200000, 80000),
		row("farmem-cxl", Read, 4096, 16, 3e6, 100),
		row("memcached", Read, 4096, 16, 40000, 400000),
		row("memcached", Read, 4096, 1, 20000, 50000),
		row("grpc", Read, 4096, 1, 10000, 100000),
		row("grpc", Write, 4096, 1, 10000, 100000), // no farmem write row
		row("memory", Read, 4096, 16, 6e6, 50),     // no farmem-dram: compared with cxl
		row("farmem-rdma", Atomic, 8, 1, 0, 0),     // a zero baseline gives no ratio
		row("redis", Atomic, 8, 1, 100, 10),
	}
	Compare(rows)
	ratio := func(i int) (string, float64, float64) {
		r := rows[i]
		if r.OpsRatio == nil {
			return r.Vs, -1, *r.P50Ratio
		}
		if r.P50Ratio == nil {
			return r.Vs, *r.OpsRatio, -1
		}
		return r.Vs, *r.OpsRatio, *r.P50Ratio
	}
	for _, tc := range []struct {
		i         int
		vs        string
		ops, p50r float64
	}{
		{2, "farmem-rdma", 15, 100.0 / 80000},
		{3, "farmem-rdma", 0.2, 5},
		{4, "farmem-rdma", 0.4, 2.5},
		{5, "farmem-rdma", 0.2, 5},
		{7, "farmem-cxl", 2, 0.5},
	} {
		vs, ops, p50r := ratio(tc.i)
		require.Equal(t, tc.vs, vs, rows[tc.i].System)
		require.InDelta(t, tc.ops, ops, 1e-9, rows[tc.i].System)
		require.InDelta(t, tc.p50r, p50r, 1e-9, rows[tc.i].System)
	}
	for _, i := range []int{0, 1, 6} {
		require.Empty(t, rows[i].Vs, rows[i].System)
		require.Nil(t, rows[i].OpsRatio)
	}
	require.Equal(t, "farmem-rdma", rows[9].Vs)
	require.Nil(t, rows[9].OpsRatio)
	require.Nil(t, rows[9].P50Ratio)

	got := map[string]Target{}
	for _, tg := range Targets(rows) {
		got[tg.Name] = tg
	}
	require.Len(t, got, 4)
	check := func(name string, v float64, ok bool) {
		t.Helper()
		tg, found := got[name]
		require.True(t, found, name)
		require.InDelta(t, v, tg.Value, 1e-9, name)
		require.Equal(t, ok, tg.OK, name)
	}
	check("farmem-rdma ÷ memcached GET, 4 KiB reads/s at 16 in flight", 5, true)
	check("memcached GET p50 ÷ farmem-rdma p50, 4 KiB at 1 in flight", 2.5, true)
	check("farmem-rdma ÷ grpc, 4 KiB reads/s at 1 in flight", 5, true)
	check("farmem-cxl ÷ farmem-rdma, 4 KiB ReadAt/s at 16 in flight", 15, true)

	rows[1].OpsPerSec = 100000 // now only 2.5× memcached
	for _, tg := range Targets(rows) {
		if tg.Name == "farmem-rdma ÷ memcached GET, 4 KiB reads/s at 16 in flight" {
			require.False(t, tg.OK)
			require.InDelta(t, 2.5, tg.Value, 1e-9)
		}
	}

	// With client and server CPU known on both sides, the CPU target:
	// farmem 3 + 2 µs per read against memcached's 4 + 6 µs.
	cpu := func(r *Row, client, server float64) { r.ClientCPUNsPerOp, r.ServerCPUNsPerOp = &client, &server }
	cpu(&rows[1], 3000, 2000)
	cpu(&rows[3], 4000, 6000)
	const cpuTarget = "farmem-rdma ÷ memcached GET, client+server CPU/read at 16"
	found := false
	for _, tg := range Targets(rows) {
		if tg.Name == cpuTarget {
			found = true
			require.InDelta(t, 0.5, tg.Value, 1e-9)
			require.True(t, tg.OK)
		}
	}
	require.True(t, found, "the CPU target is checked once both rows have CPU figures")
	cpu(&rows[1], 5000, 2500) // 0.75 of memcached's
	for _, tg := range Targets(rows) {
		if tg.Name == cpuTarget {
			require.False(t, tg.OK)
		}
	}

	var out bytes.Buffer
	require.NoError(t, WriteTable(&out, rows))
	require.Contains(t, out.String(), "NOT MET")
	require.Contains(t, out.String(), "memcached")

	b, err := json.Marshal(rows[3])
	require.NoError(t, err)
	var m map[string]any
	require.NoError(t, json.Unmarshal(b, &m))
	for _, k := range []string{"system", "op", "size", "depth", "ops_per_sec", "p50_ns", "p99_ns", "vs", "ops_ratio", "p50_ratio"} {
		require.Contains(t, m, k)
	}
	require.NotContains(t, m, "Latency")
}

func TestPlotCDF(t *testing.T) {
	rows := []Row{
		row("farmem-rdma", Read, 4096, 1, 50000, 20000),
		row("farmem-cxl", Read, 4096, 1, 3e6, 100),
		row("memcached", Read, 4096, 1, 20000, 50000),
		row("memcached", Read, 4096, 16, 20000, 50000),
	}
	dir := t.TempDir()
	for _, tc := range []struct {
		file   string
		prefix string
	}{
		{"cdf.png", "\x89PNG\r\n\x1a\n"},
		{"cdf.svg", "<?xml"},
	} {
		t.Run(tc.file, func(t *testing.T) {
			f := filepath.Join(dir, tc.file)
			require.NoError(t, PlotCDF(f, rows, Read, 4096, 1))
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			require.Greater(t, len(b), 1000)
			require.Equal(t, tc.prefix, string(b[:len(tc.prefix)]))
		})
	}
	require.ErrorIs(t, PlotCDF(filepath.Join(dir, "cdf.gif"), rows, Read, 4096, 1), ErrInvalid)
	require.ErrorIs(t, PlotCDF(filepath.Join(dir, "none.png"), rows, Write, 4096, 1), ErrInvalid)
}
