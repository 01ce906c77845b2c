package alloc_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
)

// TestArenaGetMany reads objects spread over several segments of each tier
// in one call, appending to the entries' Bufs, and checks the batch
// semantics: a bad Ref fails its own entry and the others are read; a
// batch over MaxBatch or on a closed arena is refused whole.
func TestArenaGetMany(t *testing.T) {
	c := startBigPool(t)
	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierRDMA} {
		t.Run(tier.String(), func(t *testing.T) {
			// 1 MiB segments and 100 KiB objects: twenty objects span several segments.
			a, err := alloc.NewArena(c, alloc.ArenaTier(tier), alloc.ArenaSegmentSize(1<<20))
			require.NoError(t, err)
			defer a.Close(context.Background())
			const n = 20
			want := make([][]byte, n)
			gets := make([]alloc.ArenaGet, n)
			for i := range n {
				want[i] = bytes.Repeat([]byte{byte('a' + i)}, 100<<10+i)
				r, err := a.Alloc(len(want[i]))
				require.NoError(t, err)
				_, err = a.WriteAt(r, want[i], 0)
				require.NoError(t, err)
				gets[i] = alloc.ArenaGet{Ref: r, Buf: []byte(fmt.Sprint(i, ":"))}
			}
			require.Greater(t, a.Stats().Segments, 2, "the objects span several segments")
			require.NoError(t, a.GetMany(t.Context(), gets))
			for i, g := range gets {
				require.NoError(t, g.Err)
				require.Equal(t, append([]byte(fmt.Sprint(i, ":")), want[i]...), g.Buf, "entry %d: appended after the Buf's bytes", i)
			}

			other, err := alloc.NewArena(c, alloc.ArenaTier(tier), alloc.ArenaSegmentSize(1<<20))
			require.NoError(t, err)
			defer other.Close(context.Background())
			foreign, err := other.Alloc(8)
			require.NoError(t, err)
			freed := gets[3].Ref
			require.NoError(t, a.Free(freed))
			mixed := []alloc.ArenaGet{{Ref: gets[0].Ref}, {Ref: freed, Buf: []byte("kept")}, {Ref: foreign}, {Ref: 0}, {Ref: gets[19].Ref}}
			err = a.GetMany(t.Context(), mixed)
			require.ErrorIs(t, err, alloc.ErrBadRef)
			require.ErrorContains(t, err, "3 of 5 entries failed")
			require.NoError(t, mixed[0].Err)
			require.Equal(t, want[0], mixed[0].Buf)
			require.NoError(t, mixed[4].Err)
			require.Equal(t, want[19], mixed[4].Buf)
			for _, i := range []int{1, 2, 3} {
				require.ErrorIs(t, mixed[i].Err, alloc.ErrBadRef, "entry %d", i)
			}
			require.Equal(t, []byte("kept"), mixed[1].Buf, "a failed entry's Buf keeps its length")

			require.NoError(t, a.GetMany(t.Context(), nil), "an empty batch succeeds")
			tooMany := make([]alloc.ArenaGet, alloc.MaxBatch+1)
			for i := range tooMany {
				tooMany[i].Ref = gets[0].Ref
			}
			require.ErrorIs(t, a.GetMany(t.Context(), tooMany), alloc.ErrLimit)
			for _, g := range tooMany {
				require.ErrorIs(t, g.Err, alloc.ErrLimit)
				require.Empty(t, g.Buf, "a refused batch reads nothing")
			}

			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			one := []alloc.ArenaGet{{Ref: gets[0].Ref}}
			require.ErrorIs(t, a.GetMany(ctx, one), context.Canceled)
			require.ErrorIs(t, one[0].Err, context.Canceled)

			require.NoError(t, a.Close(t.Context()))
			require.ErrorIs(t, a.GetMany(t.Context(), one), alloc.ErrClosed)
			require.ErrorIs(t, one[0].Err, alloc.ErrClosed)
		})
	}
}

// TestArenaPutMany writes objects spread over several segments in one
// call and reads them back; an entry longer than its object or naming a
// freed one fails alone, and a repeated Ref fails its segment's group.
func TestArenaPutMany(t *testing.T) {
	c := startBigPool(t)
	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierRDMA} {
		t.Run(tier.String(), func(t *testing.T) {
			a, err := alloc.NewArena(c, alloc.ArenaTier(tier), alloc.ArenaSegmentSize(1<<20))
			require.NoError(t, err)
			defer a.Close(context.Background())
			const n = 20
			puts := make([]alloc.ArenaPut, n)
			gets := make([]alloc.ArenaGet, n)
			for i := range puts {
				r, err := a.Alloc(100<<10 + i)
				require.NoError(t, err)
				puts[i] = alloc.ArenaPut{Ref: r, Buf: bytes.Repeat([]byte{byte('A' + i)}, 100<<10+i)}
				gets[i] = alloc.ArenaGet{Ref: r}
			}
			require.Greater(t, a.Stats().Segments, 2)
			require.NoError(t, a.PutMany(t.Context(), puts))
			require.NoError(t, a.GetMany(t.Context(), gets))
			for i := range gets {
				require.Equal(t, puts[i].Buf, gets[i].Buf, "entry %d", i)
			}

			freed := puts[5].Ref
			require.NoError(t, a.Free(freed))
			mixed := []alloc.ArenaPut{
				{Ref: puts[0].Ref, Buf: []byte("short")},
				{Ref: puts[1].Ref, Buf: make([]byte, 100<<10+2)}, // one byte past the object
				{Ref: freed, Buf: []byte("x")},
				{Ref: puts[19].Ref, Buf: []byte("last")},
			}
			err = a.PutMany(t.Context(), mixed)
			require.ErrorIs(t, err, alloc.ErrOutOfRange)
			require.ErrorIs(t, err, alloc.ErrBadRef)
			require.NoError(t, mixed[0].Err)
			require.ErrorIs(t, mixed[1].Err, alloc.ErrOutOfRange)
			require.ErrorIs(t, mixed[2].Err, alloc.ErrBadRef)
			require.NoError(t, mixed[3].Err)
			back := []alloc.ArenaGet{{Ref: puts[0].Ref}, {Ref: puts[1].Ref}, {Ref: puts[19].Ref}}
			require.NoError(t, a.GetMany(t.Context(), back))
			require.Equal(t, []byte("short"), back[0].Buf[:5])
			require.Equal(t, puts[1].Buf, back[1].Buf, "the refused entry wrote nothing")
			require.Equal(t, []byte("last"), back[2].Buf[:4])

			twice := []alloc.ArenaPut{{Ref: puts[0].Ref, Buf: []byte("a")}, {Ref: puts[0].Ref, Buf: []byte("b")}}
			require.ErrorIs(t, a.PutMany(t.Context(), twice), alloc.ErrInvalid)
			require.ErrorIs(t, twice[1].Err, alloc.ErrInvalid)
		})
	}
}
