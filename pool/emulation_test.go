package pool_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/emulation"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/session"
	"github.com/farmem/farmem/pool"
)

func TestConfigEmulateLatency(t *testing.T) {
	cfg, err := pool.ParseConfig([]byte("emulate-latency: cxl=200ns,rdma=2us/12GB/s\n"), pool.DefaultConfig())
	require.NoError(t, err)
	require.Equal(t, "cxl=200ns,rdma=2µs/12GB/s", cfg.EmulateLatency.String())

	_, err = pool.ParseConfig([]byte("emulate-latency: cxl=200\n"), pool.DefaultConfig())
	require.ErrorIs(t, err, pool.ErrConfig)
	require.ErrorContains(t, err, "write cxl=200ns")
}

// TestEmulationAdvertised checks that a daemon with latency emulation hands
// it to clients in segment descriptions and tiers, labelled injected with
// the measured figures beside, and that MeasureTiers (the RPC) measures on
// demand.
func TestEmulationAdvertised(t *testing.T) {
	cfg := pooltest.Config(t)
	var err error
	cfg.EmulateLatency, err = emulation.Parse("cxl=200ns")
	require.NoError(t, err)
	pooltest.Start(t, cfg)
	conn, err := session.Channel("unix", cfg.Socket)
	require.NoError(t, err)
	defer conn.Close()
	api := poolv1.NewPoolClient(conn)

	resp, err := api.MeasureTiers(t.Context(), &poolv1.MeasureTiersRequest{})
	require.NoError(t, err)
	for _, ti := range resp.Tiers {
		t.Run(ti.Tier.String(), func(t *testing.T) {
			if ti.Tier != poolv1.Tier_TIER_CXL {
				require.Nil(t, ti.Injected)
				require.Equal(t, "measured", ti.ReadLatency.Source)
				return
			}
			require.Equal(t, int64(200), ti.Injected.LatencyNs)
			require.Equal(t, &poolv1.Latency{P50Ns: 200, P99Ns: 200, Source: "injected"}, stripped(ti.ReadLatency))
			require.Equal(t, "injected", ti.WriteLatency.Source)
			require.Equal(t, "measured", ti.MeasuredReadLatency.Source)
			require.Positive(t, ti.MeasuredReadLatency.Samples)
			require.Contains(t, ti.Note, "injected")
		})
	}

	seg, err := api.Alloc(t.Context(), &poolv1.AllocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_CXL, Persist: true})
	require.NoError(t, err)
	require.Equal(t, int64(200), seg.GetInjected().GetLatencyNs())
	seg, err = api.Alloc(t.Context(), &poolv1.AllocRequest{Size: 1 << 20, Tier: poolv1.Tier_TIER_LOCAL, Persist: true})
	require.NoError(t, err)
	require.Nil(t, seg.Injected)
}

func stripped(l *poolv1.Latency) *poolv1.Latency {
	return &poolv1.Latency{P50Ns: l.P50Ns, P99Ns: l.P99Ns, Samples: l.Samples, Source: l.Source}
}
