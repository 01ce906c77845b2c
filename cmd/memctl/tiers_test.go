package main

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/emulation"
	"github.com/farmem/farmem/internal/pooltest"
)

func TestReadLatencyColumn(t *testing.T) {
	measured := &poolv1.Latency{P50Ns: 300, P99Ns: 900, Samples: 400, Source: "measured"}
	hmat := &poolv1.Latency{P50Ns: 250, Source: "hmat"}
	require.Equal(t, "-", readLatency(&poolv1.TierInfo{}))
	require.Equal(t, "300ns p50 (measured)", readLatency(&poolv1.TierInfo{ReadLatency: measured}))
	require.Equal(t, "300ns p50 (measured), hmat 250ns (+20%)", readLatency(&poolv1.TierInfo{ReadLatency: measured, HmatReadLatency: hmat}))
	require.Equal(t, "-, hmat 250ns", readLatency(&poolv1.TierInfo{HmatReadLatency: hmat}))

	injected := &poolv1.Latency{P50Ns: 200, P99Ns: 200, Source: "injected"}
	require.Equal(t, "200ns (injected)", readLatency(&poolv1.TierInfo{ReadLatency: injected}))
	require.Equal(t, "200ns (injected), measured 300ns p50, hmat 250ns (+20%)",
		readLatency(&poolv1.TierInfo{ReadLatency: injected, MeasuredReadLatency: measured, HmatReadLatency: hmat}))
}

// TestTiersInjected checks memctl tiers against a daemon with latency
// emulation: injected figures are labelled injected, in the table and in
// -o json, with the measured figures of the real memory beside them, and
// --measure measures on demand.
func TestTiersInjected(t *testing.T) {
	cfg := pooltest.Config(t)
	var err error
	cfg.EmulateLatency, err = emulation.Parse("cxl=200ns,rdma=2us/12GB/s")
	require.NoError(t, err)
	pooltest.Start(t, cfg)

	out, stderr, code := memctl(t, cfg.Socket, "tiers", "--measure", "-o", "json")
	require.Zero(t, code, stderr)
	var tiers []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &tiers))
	require.Len(t, tiers, 3)
	for _, ti := range tiers {
		t.Run(ti["tier"].(string), func(t *testing.T) {
			rl := ti["read_latency"].(map[string]any)
			mr, hasMeasured := ti["measured_read_latency"].(map[string]any)
			switch ti["tier"] {
			case "local":
				require.Equal(t, "measured", rl["source"])
				require.False(t, hasMeasured)
				require.Nil(t, ti["injected"])
				return
			case "cxl":
				require.Equal(t, map[string]any{"latency_ns": float64(200)}, ti["injected"])
				require.Equal(t, float64(200), rl["p50_ns"])
			case "rdma":
				require.Equal(t, map[string]any{"latency_ns": float64(2000), "bandwidth_bps": float64(12e9)}, ti["injected"])
				require.Equal(t, float64(2005), rl["p50_ns"], "2µs + 64 B at 12 GB/s")
			}
			require.Equal(t, "injected", rl["source"])
			require.Equal(t, float64(0), rl["samples"], "an injected figure is not a measurement")
			require.Equal(t, "injected", ti["write_latency"].(map[string]any)["source"])
			require.True(t, hasMeasured)
			require.Equal(t, "measured", mr["source"])
			require.Positive(t, mr["samples"])
			require.Positive(t, ti["read_bandwidth_bps"])
		})
	}
	out, _, code = memctl(t, cfg.Socket, "tiers")
	require.Zero(t, code)
	require.Contains(t, out, "200ns (injected), measured ")
	require.Contains(t, out, "latency injected by emulation")
	require.NotContains(t, out, "200ns p50 (measured)")
	t.Log("\n" + out)
}
