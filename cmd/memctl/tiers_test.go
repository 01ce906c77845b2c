package main

import (
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

func TestReadLatencyColumn(t *testing.T) {
	measured := &poolv1.Latency{P50Ns: 300, P99Ns: 900, Samples: 400, Source: "measured"}
	hmat := &poolv1.Latency{P50Ns: 250, Source: "hmat"}
	require.Equal(t, "-", readLatency(&poolv1.TierInfo{}))
	require.Equal(t, "300ns p50 (measured)", readLatency(&poolv1.TierInfo{ReadLatency: measured}))
	require.Equal(t, "300ns p50 (measured), hmat 250ns (+20%)", readLatency(&poolv1.TierInfo{ReadLatency: measured, HmatReadLatency: hmat}))
	require.Equal(t, "-, hmat 250ns", readLatency(&poolv1.TierInfo{HmatReadLatency: hmat}))
}
