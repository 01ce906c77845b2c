package cluster

import (
	"errors"
	"testing"
	"time"

	"github.com/farmem/farmem/internal/cluster/memnet"
	"github.com/stretchr/testify/require"
)

// A node that joins under a live member's name is told so by Join, with
// the holder's address, and both nodes list the conflict; the holder keeps
// its place in the cluster.
func TestJoinRefusesTakenName(t *testing.T) {
	n := memnet.New(0)
	cs := startMemCluster(t, n, 2) // n0, n1
	tr, err := n.NewTransport("impostor")
	require.NoError(t, err)
	cfg := fastConfig("n0")
	cfg.Transport = tr
	dup, err := New(cfg, testMeta("n0"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, dup.Shutdown()) })

	_, err = dup.Join(t.Context(), []string{cs[1].Self().Addr})
	require.ErrorIs(t, err, ErrNameConflict)
	var nc *NameConflictError
	require.True(t, errors.As(err, &nc))
	require.Equal(t, cs[0].Self().Addr, nc.Holder)
	require.Equal(t, dup.Self().Addr, nc.Self)
	require.Contains(t, err.Error(), "--node")
	require.Contains(t, err.Error(), cs[0].Self().Addr)

	got := dup.Conflicts()
	require.NotEmpty(t, got)
	require.True(t, got[0].Self)
	require.Equal(t, cs[0].Self().Addr, got[0].Claimant)

	// The seed n1 saw the impostor's claim on n0's name and kept n0.
	waitFor(t, "n1 lists the conflict", func() bool { return len(cs[1].Conflicts()) > 0 })
	c := cs[1].Conflicts()[0]
	require.Equal(t, Conflict{Name: "n0", Known: cs[0].Self().Addr, Claimant: dup.Self().Addr},
		Conflict{Name: c.Name, Known: c.Known, Claimant: c.Claimant})
	require.False(t, c.Self)
	m, ok := cs[1].Member("n0")
	require.True(t, ok)
	require.Equal(t, cs[0].Self().Addr, m.Addr)
	require.NotZero(t, cs[1].Stats().NameConflicts)
}

// Distinct names never report a conflict.
func TestNoConflictWithDistinctNames(t *testing.T) {
	cs := startMemCluster(t, memnet.New(0), 3)
	for _, c := range cs {
		require.Empty(t, c.Conflicts())
	}
}

// The conflict table keeps the newest claims and counts repeats.
func TestConflictTableBounded(t *testing.T) {
	var tab conflictTable
	now := time.Unix(1_800_000_000, 0)
	for i := range maxConflicts + 3 {
		tab.note("n", "a", string(rune('A'+i)), false, now.Add(time.Duration(i)*time.Second))
	}
	require.Len(t, tab, maxConflicts)
	require.Equal(t, "D", tab[0].Claimant) // A, B, C gave way
	c := tab.note("n", "a", "D", false, now.Add(100*time.Second))
	require.Equal(t, uint64(2), c.Count)
	require.Len(t, tab, maxConflicts)
}
