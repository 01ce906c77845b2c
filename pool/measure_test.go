package pool_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/pool"
)

// measuredTiers waits (bounded) until every tier named in want reports a
// measured read latency, and returns the tiers.
func measuredTiers(t *testing.T, socket string, want ...poolv1.Tier) map[poolv1.Tier]*poolv1.TierInfo {
	t.Helper()
	var got map[poolv1.Tier]*poolv1.TierInfo
	require.Eventually(t, func() bool {
		got = map[poolv1.Tier]*poolv1.TierInfo{}
		for _, ti := range status(t, socket).Tiers {
			got[ti.Tier] = ti
		}
		for _, w := range want {
			if rl := got[w].GetReadLatency(); rl == nil || rl.Samples == 0 {
				return false
			}
		}
		return true
	}, 30*time.Second, 50*time.Millisecond, "tiers were not measured")
	return got
}

func TestMeasureTiers(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.MeasureTiers = true
	pooltest.Start(t, cfg)

	tiers := measuredTiers(t, cfg.Socket, poolv1.Tier_TIER_CXL, poolv1.Tier_TIER_LOCAL, poolv1.Tier_TIER_RDMA)
	for tier, ti := range tiers {
		t.Run(tier.String(), func(t *testing.T) {
			for _, l := range []*poolv1.Latency{ti.ReadLatency, ti.WriteLatency} {
				require.NotNil(t, l)
				require.Equal(t, "measured", l.Source)
				require.Positive(t, l.Samples)
				require.Positive(t, l.P50Ns)
				require.GreaterOrEqual(t, l.P99Ns, l.P50Ns)
			}
			require.Positive(t, ti.ReadBandwidthBps)
			require.Nil(t, ti.HmatReadLatency, "no HMAT without sysfs")
			// The probe's temporary segment is gone again.
			require.Equal(t, ti.Capacity, ti.Free)
			require.Zero(t, ti.Segments)
		})
	}
	// Measuring the loopback rdma tier does not make it real.
	require.Equal(t, "loopback", tiers[poolv1.Tier_TIER_RDMA].Kind)
	require.True(t, tiers[poolv1.Tier_TIER_RDMA].Emulated)
	require.True(t, tiers[poolv1.Tier_TIER_CXL].Emulated)
}

func TestMeasureTiersOff(t *testing.T) {
	cfg := pooltest.Config(t) // MeasureTiers is off
	pooltest.Start(t, cfg)
	for _, ti := range status(t, cfg.Socket).Tiers {
		require.Nil(t, ti.ReadLatency, ti.Tier.String())
		require.Zero(t, ti.ReadBandwidthBps, ti.Tier.String())
	}
}

func TestMeasureTiersOnDemand(t *testing.T) {
	cfg := pooltest.Config(t) // not at start
	d := pooltest.Start(t, cfg)
	for _, ti := range status(t, cfg.Socket).Tiers {
		require.Nil(t, ti.ReadLatency, ti.Tier.String())
	}
	// Two at once: they take turns on the probe's segment.
	errc := make(chan error, 1)
	go func() { errc <- d.MeasureTiers(t.Context()) }()
	require.NoError(t, d.MeasureTiers(t.Context()))
	require.NoError(t, <-errc)
	tiers := measuredTiers(t, cfg.Socket, poolv1.Tier_TIER_CXL, poolv1.Tier_TIER_LOCAL, poolv1.Tier_TIER_RDMA)
	for _, ti := range tiers {
		require.Equal(t, ti.Capacity, ti.Free, ti.Tier.String())
	}
}

// TestMeasureTiersCloseEarly: Close while the probe runs stops it and
// leaves no goroutine behind (goleak in TestMain).
func TestMeasureTiersCloseEarly(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.MeasureTiers = true
	d, err := pool.Start(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, d.Close())
}

// TestMeasureTiersOverTLS: the probe of the rdma tier dials the daemon's
// own data plane, which serves TLS here, and verifies the node's
// certificate as clients do.
func TestMeasureTiersOverTLS(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.Listen = "127.0.0.1:0"
	pooltest.TLS(t, &cfg)
	d := pooltest.Start(t, cfg)
	require.NoError(t, d.MeasureTiers(t.Context()))
	measuredTiers(t, cfg.Socket, poolv1.Tier_TIER_RDMA)
}
