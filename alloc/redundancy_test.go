package alloc_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
)

// TestRedundancyNames: the constructors print the form ParseRedundancy
// reads back, and what each survives.
func TestRedundancyNames(t *testing.T) {
	for _, tc := range []struct {
		r        alloc.Redundancy
		text     string
		survives int
	}{
		{alloc.Redundancy{}, "none", 0},
		{alloc.Replicas(1), "none", 0},
		{alloc.Replicas(2), "replicas=2", 1},
		{alloc.Replicas(3).OrFewer(), "replicas=3,or-fewer", 2},
		{alloc.ErasureCoded(4, 2), "ec=4+2", 2},
		{alloc.ErasureCoded(10, 4).OrFewer(), "ec=10+4,or-fewer", 4},
	} {
		require.Equal(t, tc.text, tc.r.String())
		require.Equal(t, tc.survives, tc.r.Survives(), tc.text)
		back, err := alloc.ParseRedundancy(tc.text)
		require.NoError(t, err)
		require.Equal(t, tc.text, back.String())
	}
	_, err := alloc.ParseRedundancy("mirror")
	require.ErrorIs(t, err, alloc.ErrInvalid)
}

// TestRedundancyRefusedBeforeSending: Replicas(1), which is none, places
// a cxl segment that reports "none"; numbers out of range, and redundancy
// on a load/store tier, fail Alloc with ErrInvalid saying what is wrong,
// before anything is sent: the client is closed, and the answer is still
// ErrInvalid, not ErrClosed.
func TestRedundancyRefusedBeforeSending(t *testing.T) {
	_, c := startPool(t)
	seg, err := c.Alloc(t.Context(), 1<<20, alloc.WithTier(alloc.TierCXL), alloc.WithRedundancy(alloc.Replicas(1)))
	require.NoError(t, err, "Replicas(1) is none, which every tier takes")
	require.Equal(t, alloc.RedundancyStatus{State: "none"}, seg.Redundancy())
	require.Equal(t, alloc.Redundancy{}, alloc.Replicas(1).OrFewer(), "every none is the zero value")
	require.NoError(t, c.Close())
	for _, tc := range []struct {
		opts []alloc.AllocOption
		says string
	}{
		{[]alloc.AllocOption{alloc.WithRedundancy(alloc.Replicas(0))}, "Replicas(0): the number of copies must be at least 1"},
		{[]alloc.AllocOption{alloc.WithRedundancy(alloc.Replicas(-3))}, "Replicas(-3)"},
		{[]alloc.AllocOption{alloc.WithRedundancy(alloc.Replicas(65))}, "replicas=65 needs 65 homes; at most 64"},
		{[]alloc.AllocOption{alloc.WithRedundancy(alloc.ErasureCoded(0, 2))}, "ErasureCoded(0, 2): k and m must each be at least 1"},
		{[]alloc.AllocOption{alloc.WithRedundancy(alloc.ErasureCoded(4, 0))}, "ErasureCoded(4, 0)"},
		{[]alloc.AllocOption{alloc.WithRedundancy(alloc.ErasureCoded(40, 25))}, "ec=40+25 needs 65 homes; at most 64"},
		{[]alloc.AllocOption{alloc.WithTier(alloc.TierCXL), alloc.WithRedundancy(alloc.Replicas(2))}, "redundancy is for the rdma tier"},
		{[]alloc.AllocOption{alloc.WithTier(alloc.TierLocal), alloc.WithRedundancy(alloc.ErasureCoded(4, 2))}, "with the local tier: redundancy is for the rdma tier"},
		{[]alloc.AllocOption{alloc.WithTier(alloc.TierRDMA), alloc.WithFallback(alloc.TierCXL), alloc.WithRedundancy(alloc.Replicas(2))}, "with the cxl tier"},
	} {
		_, err := c.Alloc(t.Context(), 1<<20, tc.opts...)
		require.ErrorIs(t, err, alloc.ErrInvalid)
		require.False(t, errors.Is(err, alloc.ErrClosed), "%v", err)
		require.ErrorContains(t, err, tc.says)
	}
}
