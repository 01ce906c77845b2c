package main

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/pooltest"
)

// TestTiersMeasured checks that a daemon measuring its tiers shows the
// figures in tiers -o json, per tier, with their source.
func TestTiersMeasured(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.MeasureTiers = true
	pooltest.Start(t, cfg)

	var tiers []map[string]any
	require.Eventually(t, func() bool {
		out, _, code := memctl(t, cfg.Socket, "tiers", "-o", "json")
		if code != 0 {
			return false
		}
		tiers = nil
		if json.Unmarshal([]byte(out), &tiers) != nil {
			return false
		}
		for _, ti := range tiers {
			if _, ok := ti["read_latency"]; !ok {
				return false
			}
		}
		return len(tiers) == 3
	}, 30*time.Second, 50*time.Millisecond, "tiers -o json never showed read_latency on every tier")
	for _, ti := range tiers {
		t.Run(ti["tier"].(string), func(t *testing.T) {
			for _, k := range []string{"read_latency", "write_latency"} {
				l, ok := ti[k].(map[string]any)
				require.True(t, ok, "%s is not an object: %v", k, ti[k])
				require.Equal(t, "measured", l["source"])
				require.Positive(t, l["samples"])
				require.Positive(t, l["p50_ns"])
				require.GreaterOrEqual(t, l["p99_ns"], l["p50_ns"])
			}
			require.Positive(t, ti["read_bandwidth_bps"])
		})
	}
	out, _, code := memctl(t, cfg.Socket, "tiers")
	require.Zero(t, code)
	t.Log("\n" + out)
}
