package alloc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/pool"
)

// reclaimPool starts a test pool configured by set and dials it; both end
// with the test.
func reclaimPool(t *testing.T, set func(*pool.Config)) *Client {
	cfg := pooltest.Config(t)
	set(&cfg)
	pooltest.Start(t, cfg)
	c, err := Dial(t.Context(), cfg.Socket)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestReclaimedGuarded: a segment mapped from memory that can go away
// (an emulated device's file on a disk rather than in tmpfs, which the
// library guards as it does a device's) fails every call with
// ErrLeaseExpired once its daemon says it reclaimed it, saying why; its
// Free only lets go of it here, and the client's other segments go on.
func TestReclaimedGuarded(t *testing.T) {
	c := reclaimPool(t, func(cfg *pool.Config) {
		cfg.ShmDir = t.TempDir() // on the disk: not memory-backed, so guarded
	})
	ctx := t.Context()
	seg, err := c.Alloc(ctx, 1<<20, WithTier(TierCXL))
	require.NoError(t, err)
	require.IsType(t, &guarded{}, seg.base(), "a segment file on a disk is guarded")
	other, err := c.Alloc(ctx, 1<<20, WithTier(TierCXL))
	require.NoError(t, err)
	_, err = seg.WriteAt([]byte("before"), 0)
	require.NoError(t, err)

	c.segmentsReclaimed([]uint64{seg.ID(), other.ID() + 1000})
	_, err = seg.ReadAt(make([]byte, 6), 0)
	require.ErrorIs(t, err, ErrLeaseExpired)
	require.Contains(t, err.Error(), "lease ran out")
	_, err = seg.WriteAt([]byte("after"), 0)
	require.ErrorIs(t, err, ErrLeaseExpired)
	_, err = seg.Add64(8, 1)
	require.ErrorIs(t, err, ErrLeaseExpired)
	seg.setLost(false) // a later report of the device back does not undo it
	_, err = seg.ReadAt(make([]byte, 6), 0)
	require.ErrorIs(t, err, ErrLeaseExpired)
	require.NoError(t, seg.Free(ctx), "freeing a reclaimed segment only lets go of it here")

	_, err = other.WriteAt([]byte("still mine"), 0)
	require.NoError(t, err, "a segment the notice does not name")
	require.NoError(t, other.Free(ctx))
}

// TestReclaimedRemote: an rdma segment reclaimed by its daemon answers
// ErrLeaseExpired, also for bytes its read-ahead holds, and also when the
// daemon reported it lost before (the reclaim is the later and final word,
// which a report of its home back does not undo).
func TestReclaimedRemote(t *testing.T) {
	c := reclaimPool(t, func(*pool.Config) {})
	ctx := t.Context()
	held, err := c.Alloc(ctx, 1<<20, WithTier(TierRDMA))
	require.NoError(t, err)
	lost, err := c.Alloc(ctx, 1<<20, WithTier(TierRDMA))
	require.NoError(t, err)
	_, err = held.WriteAt([]byte("read ahead"), 0)
	require.NoError(t, err)
	require.NoError(t, held.Prefetch(0, 64<<10))
	got := make([]byte, 10)
	_, err = held.ReadAt(got, 0)
	require.NoError(t, err)
	require.Positive(t, c.Stats().PrefetchHits, "served from what it read ahead")

	lost.setLost(true)
	_, err = lost.ReadAt(got, 0)
	require.ErrorIs(t, err, ErrSegmentLost)
	c.segmentsReclaimed([]uint64{held.ID(), lost.ID()})
	for _, s := range []*Segment{held, lost} {
		s.setLost(false)
		_, err = s.ReadAt(got, 0)
		require.ErrorIs(t, err, ErrLeaseExpired, "segment %d", s.ID())
		require.NotErrorIs(t, err, ErrSegmentLost)
		_, err = s.WriteAt(got, 0)
		require.ErrorIs(t, err, ErrLeaseExpired)
	}
}
