package pool

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/cluster"
)

func TestCapacityMoved(t *testing.T) {
	const c = 64 << 20 // one announceStep is 1 MiB
	rdma := func(free int64) []cluster.TierFree {
		return []cluster.TierFree{{Name: "rdma", Capacity: c, Free: free}}
	}
	for _, tc := range []struct {
		name       string
		last, now  []cluster.TierFree
		wantGossip bool
	}{
		{"first announcement", nil, rdma(c), true},
		{"unchanged", rdma(c), rdma(c), false},
		{"less than a step", rdma(c), rdma(c - 1<<20 + 1), false},
		{"one step down", rdma(c), rdma(c - 1<<20), true},
		{"one step up", rdma(c - 1<<20), rdma(c), true},
		{"full", rdma(1 << 10), rdma(0), true},
		{"no longer full", rdma(0), rdma(1 << 10), true},
		{"capacity changed", rdma(c), []cluster.TierFree{{Name: "rdma", Capacity: 2 * c, Free: c}}, true},
		{"tier added", rdma(c), append(rdma(c), cluster.TierFree{Name: "cxl", Capacity: c, Free: c}), true},
		{"tier renamed", rdma(c), []cluster.TierFree{{Name: "cxl", Capacity: c, Free: c}}, true},
		{"tiny tier, any change", []cluster.TierFree{{Name: "cxl", Capacity: 10, Free: 10}}, []cluster.TierFree{{Name: "cxl", Capacity: 10, Free: 9}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.wantGossip, capacityMoved(tc.last, tc.now))
		})
	}
}
