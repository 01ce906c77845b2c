package tcp

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

func TestRoundTrip(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 7, 1<<20)
	c := dial(t, s.addr)
	ctx := t.Context()

	t.Run("write read", func(t *testing.T) {
		for _, n := range []int{0, 1, 8, 4096, 100_000, 1 << 20} {
			p := make([]byte, n)
			for i := range p {
				p[i] = byte(rand.Uint32())
			}
			require.NoError(t, c.Write(ctx, r, 0, p))
			require.Equal(t, p, mem[:n])
			q := make([]byte, n)
			require.NoError(t, c.Read(ctx, r, 0, q))
			require.Equal(t, p, q)
		}
	})

	t.Run("read at offset", func(t *testing.T) {
		copy(mem[1000:], "hello far memory")
		q := make([]byte, 16)
		require.NoError(t, c.Read(ctx, r, 1000, q))
		require.Equal(t, "hello far memory", string(q))
		q = make([]byte, 3)
		require.NoError(t, c.Read(ctx, r, int64(len(mem)-3), q))
	})

	t.Run("cas", func(t *testing.T) {
		binary.NativeEndian.PutUint64(mem[64:], 5)
		prev, ok, err := c.CompareAndSwap64(ctx, r, 64, 4, 9)
		require.NoError(t, err)
		require.False(t, ok)
		require.EqualValues(t, 5, prev)
		prev, ok, err = c.CompareAndSwap64(ctx, r, 64, 5, 9)
		require.NoError(t, err)
		require.True(t, ok)
		require.EqualValues(t, 5, prev)
		require.EqualValues(t, 9, binary.NativeEndian.Uint64(mem[64:]))
	})

	t.Run("fadd", func(t *testing.T) {
		binary.NativeEndian.PutUint64(mem[128:], 100)
		prev, err := c.FetchAdd64(ctx, r, 128, 11)
		require.NoError(t, err)
		require.EqualValues(t, 100, prev)
		prev, err = c.FetchAdd64(ctx, r, 128, ^uint64(0)) // -1
		require.NoError(t, err)
		require.EqualValues(t, 111, prev)
		require.EqualValues(t, 110, binary.NativeEndian.Uint64(mem[128:]))
	})

	t.Run("batch", func(t *testing.T) {
		binary.NativeEndian.PutUint64(mem[256:], 1)
		binary.NativeEndian.PutUint64(mem[264:], 40)
		out := make([]byte, 5)
		ops := []*rdma.Op{
			{Kind: rdma.OpWrite, Region: r, Offset: 300, Buf: []byte("batch")},
			{Kind: rdma.OpRead, Region: r, Offset: 300, Buf: out},
			{Kind: rdma.OpCompareAndSwap, Region: r, Offset: 256, Old: 1, New: 2},
			{Kind: rdma.OpFetchAdd, Region: r, Offset: 264, Delta: 2},
			{Kind: rdma.OpRead, Region: r, Offset: int64(len(mem)), Buf: make([]byte, 1)},
			{Kind: rdma.OpFetchAdd, Region: r, Offset: 3, Delta: 1},
		}
		err := c.Do(ctx, ops...)
		require.ErrorIs(t, err, rdma.ErrOutOfRange)
		for i := range 4 {
			require.NoError(t, ops[i].Err, "op %d", i)
		}
		require.Equal(t, "batch", string(out))
		require.True(t, ops[2].Swapped)
		require.EqualValues(t, 1, ops[2].Prev)
		require.EqualValues(t, 40, ops[3].Prev)
		require.EqualValues(t, 42, binary.NativeEndian.Uint64(mem[264:]))
		require.ErrorIs(t, ops[4].Err, rdma.ErrOutOfRange)
		require.ErrorIs(t, ops[5].Err, rdma.ErrUnaligned)
	})

	t.Run("batch deeper than the in-flight limit", func(t *testing.T) {
		c := dial(t, s.addr, WithConns(1), WithMaxInflight(4))
		ops := make([]*rdma.Op, 50)
		for i := range ops {
			ops[i] = &rdma.Op{Kind: rdma.OpFetchAdd, Region: r, Offset: 512, Delta: 1}
		}
		before := binary.NativeEndian.Uint64(mem[512:])
		require.NoError(t, c.Do(ctx, ops...))
		require.EqualValues(t, before+50, binary.NativeEndian.Uint64(mem[512:]))
	})
}

// TestLargeSplit moves more than MaxPayload in one call, which the client
// splits into several wire ops.
func TestLargeSplit(t *testing.T) {
	s := startServer(t, ServerConfig{})
	const size = MaxPayload + MaxPayload/2 + 13
	mem, r := s.export(t, 1, size+64)
	c := dial(t, s.addr)
	p := make([]byte, size)
	for i := range p {
		p[i] = byte(i * 7)
	}
	require.NoError(t, c.Write(t.Context(), r, 64, p))
	require.True(t, bytes.Equal(p, mem[64:64+size]))
	q := make([]byte, size)
	require.NoError(t, c.Read(t.Context(), r, 64, q))
	require.True(t, bytes.Equal(p, q))
}
