package tcp

import (
	"bytes"
	"crypto/rand"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// TestFenceRefusesOldOwner: after Fence, every op that carries the fenced
// segment's key fails with ErrLeaseExpired (a wrong key still gets
// ErrAccessDenied), and the same memory exported again as another segment
// keeps its new owner's bytes whatever the old owner retries.
func TestFenceRefusesOldOwner(t *testing.T) {
	s := startServer(t, ServerConfig{})
	const size = 64 << 10
	mem, old := s.export(t, 1, size)
	c := dial(t, s.addr)
	ctx := t.Context()
	require.NoError(t, c.Write(ctx, old, 0, bytes.Repeat([]byte{0xAA}, size)))
	require.NoError(t, s.Fence(1))
	require.ErrorIs(t, s.Fence(1), rdma.ErrNotExported)

	// The memory goes to a new owner under a new segment id and key.
	key, err := s.Export(2, mem, 1)
	require.NoError(t, err)
	fresh := rdma.Region{Segment: 2, Key: key, Epoch: 1}
	want := make([]byte, size)
	rand.Read(want)
	require.NoError(t, c.Write(ctx, fresh, 0, want))

	wrongKey := old
	wrongKey.Key[0] ^= 1
	newer := old
	newer.Epoch = 99
	for _, tc := range []struct {
		name string
		r    rdma.Region
		op   func(rdma.Region) error
		want error
	}{
		{"write", old, func(r rdma.Region) error { return c.Write(ctx, r, 0, make([]byte, 4096)) }, rdma.ErrLeaseExpired},
		{"write with a higher epoch", newer, func(r rdma.Region) error { return c.Write(ctx, r, 0, make([]byte, 8)) }, rdma.ErrLeaseExpired},
		{"read", old, func(r rdma.Region) error { return c.Read(ctx, r, 0, make([]byte, 8)) }, rdma.ErrLeaseExpired},
		{"cas", old, func(r rdma.Region) error { _, _, err := c.CompareAndSwap64(ctx, r, 0, 0, 1); return err }, rdma.ErrLeaseExpired},
		{"fadd", old, func(r rdma.Region) error { _, err := c.FetchAdd64(ctx, r, 8, 1); return err }, rdma.ErrLeaseExpired},
		{"write with a wrong key", wrongKey, func(r rdma.Region) error { return c.Write(ctx, r, 0, make([]byte, 8)) }, rdma.ErrAccessDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorIs(t, tc.op(tc.r), tc.want)
		})
	}
	got := make([]byte, size)
	require.NoError(t, c.Read(ctx, fresh, 0, got))
	require.Equal(t, want, got, "the new owner's bytes are intact")
	require.Equal(t, want, mem)
}

// TestFencesForgetOldest: the ring forgets the oldest fence first, and a
// segment exported again is no longer fenced.
func TestFencesForgetOldest(t *testing.T) {
	var f fences
	k := rdma.Key{1}
	for seg := uint64(1); seg <= MaxFenced+1; seg++ {
		f.add(seg, k, statusLeaseExpired)
	}
	require.False(t, fenced(&f, 1, k), "the oldest is forgotten")
	require.True(t, fenced(&f, 2, k))
	require.True(t, fenced(&f, MaxFenced+1, k))
	require.False(t, fenced(&f, 2, rdma.Key{2}), "another key is not the fenced one")
	f.forget(2)
	require.False(t, fenced(&f, 2, k))
	require.Len(t, f.keys, MaxFenced-1)
}

// fenced reports whether f remembers seg under key.
func fenced(f *fences, seg uint64, key rdma.Key) bool {
	_, ok := f.status(seg, key)
	return ok
}
