package pool

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/device"
)

// onNode is a device that says it is on a NUMA node, as a NUMA or devdax
// device on a CXL host does (this host cannot bind memory to the
// fixture's node).
type onNode struct {
	device.Device
	node int
}

func (d onNode) Node() int { return d.node }

// TestHMAT: a tier on a NUMA node with HMAT attributes shows the firmware's
// read latency with source "hmat"; others show none.
func TestHMAT(t *testing.T) {
	cfg := testConfig(t)
	cfg.SysfsRoot = "../cxl/testdata/numa"
	inv, devs, err := discover(cfg, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Equal(t, poolv1.Tier_TIER_CXL, devs[0].tier)
	devs[0].Device = onNode{devs[0].Device, 1}
	p, err := newCore(cfg, slog.New(slog.DiscardHandler), devs, nil, nil)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, p.close()) })
	p.setHMAT(inv)

	byTier := map[poolv1.Tier]*poolv1.TierInfo{}
	for _, ti := range p.tiers() {
		byTier[ti.Tier] = ti
	}
	cxlTier := byTier[poolv1.Tier_TIER_CXL]
	require.NotNil(t, cxlTier)
	require.Equal(t, &poolv1.Latency{P50Ns: 230, P99Ns: 230, Source: "hmat"}, cxlTier.HmatReadLatency)
	require.Nil(t, byTier[poolv1.Tier_TIER_LOCAL].HmatReadLatency, "local DRAM has no NUMA node of its own")

	m, err := p.measureDevice(t.Context(), p.devs[0])
	require.NoError(t, err)
	require.Nil(t, m, "a 16 MiB-free device is below the probe's minimum span")
}
