package extent

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/internal/errs"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const page = 4096

func TestNew(t *testing.T) {
	tests := []struct {
		name            string
		capacity, align int64
		wantCap         int64
		wantErr         error
	}{
		{name: "page aligned", capacity: 16 * page, align: page, wantCap: 16 * page},
		{name: "capacity rounded down", capacity: 3*page + 100, align: page, wantCap: 3 * page},
		{name: "align 1", capacity: 1, align: 1, wantCap: 1},
		{name: "max capacity", capacity: math.MaxInt64, align: page, wantCap: math.MaxInt64 &^ (page - 1)},
		{name: "max capacity align 1", capacity: math.MaxInt64, align: 1, wantCap: math.MaxInt64},
		{name: "largest align", capacity: math.MaxInt64, align: 1 << 62, wantCap: 1 << 62},
		{name: "align zero", capacity: page, align: 0, wantErr: ErrInvalid},
		{name: "align negative", capacity: page, align: -page, wantErr: ErrInvalid},
		{name: "align min int64", capacity: page, align: math.MinInt64, wantErr: ErrInvalid},
		{name: "align 3", capacity: page, align: 3, wantErr: ErrInvalid},
		{name: "align 4097", capacity: 2 * page, align: page + 1, wantErr: ErrInvalid},
		{name: "align 6", capacity: page, align: 6, wantErr: ErrInvalid},
		{name: "capacity negative", capacity: -page, align: page, wantErr: ErrInvalid},
		{name: "capacity zero", capacity: 0, align: 1, wantErr: ErrInvalid},
		{name: "capacity below align", capacity: page - 1, align: page, wantErr: ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(tt.capacity, tt.align)
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Nil(t, a)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.wantCap, a.Capacity())
			require.Equal(t, tt.align, a.Align())
			require.Equal(t, Stats{Capacity: tt.wantCap, Free: tt.wantCap, LargestFree: tt.wantCap, FreeExtents: 1}, a.Stats())
			checkInvariants(t, a, nil)
		})
	}
}

// TestEdgeCases runs one operation after a setup that must succeed and
// checks its result and the resulting free extents.
func TestEdgeCases(t *testing.T) {
	alloc := func(n int64) op { return op{kind: opAlloc, length: n} }
	free := func(off, n int64) op { return op{kind: opFree, off: off, length: n} }
	reserve := func(off, n int64) op { return op{kind: opReserve, off: off, length: n} }
	const maxAligned = math.MaxInt64 &^ (page - 1)

	tests := []struct {
		name            string
		capacity, align int64
		setup           []op
		do              op
		wantOff         int64 // for alloc
		wantErr         error
		wantFree        []span // free extents afterwards, in offset order
	}{
		{name: "alloc rounds up 1 byte", capacity: 4 * page, align: page,
			do: alloc(1), wantOff: 0, wantFree: []span{{page, 3 * page}}},
		{name: "alloc rounds up page+1", capacity: 4 * page, align: page, setup: []op{alloc(page)},
			do: alloc(page + 1), wantOff: page, wantFree: []span{{3 * page, page}}},
		{name: "alloc exact fit of device", capacity: 3 * page, align: page,
			do: alloc(3 * page), wantOff: 0, wantFree: nil},
		{name: "alloc prefers exact fit over lower offset", capacity: 6 * page, align: page,
			setup:   []op{alloc(2 * page), alloc(page), alloc(page), alloc(page), free(0, 2*page), free(3*page, page)},
			do:      alloc(page),
			wantOff: 3 * page, wantFree: []span{{0, 2 * page}, {5 * page, page}}},
		{name: "alloc ties go to lowest offset", capacity: 5 * page, align: page,
			setup:   []op{alloc(page), alloc(page), alloc(page), alloc(page), free(0, page), free(2*page, page)},
			do:      alloc(page),
			wantOff: 0, wantFree: []span{{2 * page, page}, {4 * page, page}}},
		{name: "alloc larger than device", capacity: 4 * page, align: page,
			do: alloc(5 * page), wantErr: ErrNoSpace, wantFree: []span{{0, 4 * page}}},
		{name: "alloc fails when fragmented", capacity: 4 * page, align: page,
			setup: []op{alloc(page), alloc(page), alloc(page), alloc(page), free(0, page), free(2*page, page)},
			do:    alloc(2 * page), wantErr: ErrNoSpace, wantFree: []span{{0, page}, {2 * page, page}}},
		{name: "alloc zero", capacity: page, align: page, do: alloc(0), wantErr: ErrInvalid, wantFree: []span{{0, page}}},
		{name: "alloc negative", capacity: page, align: page, do: alloc(-1), wantErr: ErrInvalid, wantFree: []span{{0, page}}},
		{name: "alloc MaxInt64 overflows rounding", capacity: math.MaxInt64, align: page,
			do: alloc(math.MaxInt64), wantErr: ErrInvalid, wantFree: []span{{0, maxAligned}}},
		{name: "alloc just past largest aligned overflows", capacity: math.MaxInt64, align: page,
			do: alloc(maxAligned + 1), wantErr: ErrInvalid, wantFree: []span{{0, maxAligned}}},
		{name: "alloc largest aligned length", capacity: math.MaxInt64, align: page,
			do: alloc(maxAligned), wantOff: 0, wantFree: nil},
		{name: "alloc MaxInt64 align 1", capacity: math.MaxInt64, align: 1,
			do: alloc(math.MaxInt64), wantOff: 0, wantFree: nil},

		{name: "free with requested length", capacity: 2 * page, align: page, setup: []op{alloc(100)},
			do: free(0, 100), wantFree: []span{{0, 2 * page}}},
		{name: "free double", capacity: 2 * page, align: page, setup: []op{alloc(page), free(0, page)},
			do: free(0, page), wantErr: ErrNotAllocated, wantFree: []span{{0, 2 * page}}},
		{name: "free unknown offset", capacity: 2 * page, align: page, setup: []op{alloc(2 * page)},
			do: free(page, page), wantErr: ErrNotAllocated, wantFree: nil},
		{name: "free wrong length", capacity: 4 * page, align: page, setup: []op{alloc(2 * page)},
			do: free(0, page), wantErr: ErrNotAllocated, wantFree: []span{{2 * page, 2 * page}}},
		{name: "free on empty allocator", capacity: page, align: page,
			do: free(0, page), wantErr: ErrNotAllocated, wantFree: []span{{0, page}}},
		{name: "free zero length", capacity: page, align: page, setup: []op{alloc(page)},
			do: free(0, 0), wantErr: ErrInvalid, wantFree: nil},
		{name: "free overflowing length", capacity: page, align: page, setup: []op{alloc(page)},
			do: free(0, math.MaxInt64), wantErr: ErrInvalid, wantFree: nil},
		{name: "free negative offset", capacity: page, align: page, setup: []op{alloc(page)},
			do: free(-page, page), wantErr: ErrNotAllocated, wantFree: nil},
		{name: "free coalesces both sides", capacity: 4 * page, align: page,
			setup: []op{alloc(page), alloc(page), alloc(page), free(0, page), free(2*page, page)},
			do:    free(page, page), wantFree: []span{{0, 4 * page}}},
		{name: "free coalesces left only", capacity: 4 * page, align: page,
			setup: []op{alloc(page), alloc(page), alloc(page), alloc(page), free(0, page)},
			do:    free(page, page), wantFree: []span{{0, 2 * page}}},
		{name: "free coalesces right only", capacity: 4 * page, align: page,
			setup: []op{alloc(page), alloc(page), alloc(page), alloc(page), free(3*page, page)},
			do:    free(2*page, page), wantFree: []span{{2 * page, 2 * page}}},
		{name: "free with no free neighbour", capacity: 3 * page, align: page,
			setup: []op{alloc(page), alloc(page), alloc(page)},
			do:    free(page, page), wantFree: []span{{page, page}}},

		{name: "reserve splits a free extent", capacity: 4 * page, align: page,
			do: reserve(page, page), wantFree: []span{{0, page}, {2 * page, 2 * page}}},
		{name: "reserve rounds length", capacity: 4 * page, align: page,
			do: reserve(page, 1), wantFree: []span{{0, page}, {2 * page, 2 * page}}},
		{name: "reserve whole device", capacity: 4 * page, align: page,
			do: reserve(0, 4*page), wantFree: nil},
		{name: "reserve tail", capacity: 4 * page, align: page,
			do: reserve(3*page, page), wantFree: []span{{0, 3 * page}}},
		{name: "reserve same extent twice", capacity: 4 * page, align: page, setup: []op{reserve(page, page)},
			do: reserve(page, page), wantErr: ErrOverlap, wantFree: []span{{0, page}, {2 * page, 2 * page}}},
		{name: "reserve overlapping end", capacity: 4 * page, align: page, setup: []op{reserve(2*page, page)},
			do: reserve(page, 2*page), wantErr: ErrOverlap, wantFree: []span{{0, 2 * page}, {3 * page, page}}},
		{name: "reserve starting inside allocated", capacity: 4 * page, align: page, setup: []op{alloc(2 * page)},
			do: reserve(page, 2*page), wantErr: ErrOverlap, wantFree: []span{{2 * page, 2 * page}}},
		{name: "reserve misaligned", capacity: 4 * page, align: page,
			do: reserve(100, page), wantErr: ErrInvalid, wantFree: []span{{0, 4 * page}}},
		{name: "reserve negative offset", capacity: 4 * page, align: page,
			do: reserve(-page, page), wantErr: ErrInvalid, wantFree: []span{{0, 4 * page}}},
		{name: "reserve past capacity", capacity: 4 * page, align: page,
			do: reserve(3*page, 2*page), wantErr: ErrInvalid, wantFree: []span{{0, 4 * page}}},
		{name: "reserve at capacity", capacity: 4 * page, align: page,
			do: reserve(4*page, page), wantErr: ErrInvalid, wantFree: []span{{0, 4 * page}}},
		{name: "reserve offset plus length overflows", capacity: math.MaxInt64, align: page,
			do: reserve(page, maxAligned), wantErr: ErrInvalid, wantFree: []span{{0, maxAligned}}},
		{name: "reserve then free", capacity: 4 * page, align: page, setup: []op{reserve(page, page)},
			do: free(page, page), wantFree: []span{{0, 4 * page}}},
		{name: "alloc skips reserved", capacity: 4 * page, align: page, setup: []op{reserve(0, page)},
			do: alloc(page), wantOff: page, wantFree: []span{{2 * page, 2 * page}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a, err := New(tt.capacity, tt.align)
			require.NoError(t, err)
			for _, o := range tt.setup {
				require.NoError(t, apply(a, o), "setup %v", o)
			}
			before := a.Stats()
			var off int64
			switch tt.do.kind {
			case opAlloc:
				off, err = a.Alloc(tt.do.length)
			case opFree:
				err = a.Free(tt.do.off, tt.do.length)
			case opReserve:
				err = a.Reserve(tt.do.off, tt.do.length)
			}
			if tt.wantErr != nil {
				require.ErrorIs(t, err, tt.wantErr)
				require.Equal(t, before, a.Stats(), "a failed call changed the allocator")
			} else {
				require.NoError(t, err)
				require.Equal(t, tt.wantOff, off)
			}
			var got []span
			a.byEnd.Ascend(func(s span) bool { got = append(got, s); return true })
			require.Equal(t, tt.wantFree, got)
			checkInvariants(t, a, nil)
		})
	}
}

// apply runs o and returns its error, discarding an allocated offset.
func apply(a *Allocator, o op) error {
	switch o.kind {
	case opAlloc:
		_, err := a.Alloc(o.length)
		return err
	case opFree:
		return a.Free(o.off, o.length)
	default:
		return a.Reserve(o.off, o.length)
	}
}

func TestNoSpaceError(t *testing.T) {
	a, err := New(4*page, page)
	require.NoError(t, err)
	for range 4 {
		_, err = a.Alloc(page)
		require.NoError(t, err)
	}
	require.NoError(t, a.Free(0, page))
	require.NoError(t, a.Free(2*page, page))

	_, err = a.Alloc(2 * page)
	var nse *NoSpaceError
	require.ErrorAs(t, err, &nse)
	require.Equal(t, NoSpaceError{Requested: 2 * page, LargestFree: page, Free: 2 * page}, *nse)
	require.Contains(t, err.Error(), "fragmented")

	_, err = a.Alloc(3*page - 1)
	require.ErrorAs(t, err, &nse)
	require.Equal(t, NoSpaceError{Requested: 3 * page, LargestFree: page, Free: 2 * page}, *nse)
	require.Contains(t, err.Error(), "only 8.0 KiB free")
	require.NotErrorIs(t, err, ErrInvalid)
	require.ErrorIs(t, err, errs.ErrNoCapacity, "the daemon tries the next tier on it")
}

func TestStatsFragmentation(t *testing.T) {
	a, err := New(8*page, page)
	require.NoError(t, err)
	for range 8 {
		_, err = a.Alloc(page)
		require.NoError(t, err)
	}
	require.Equal(t, Stats{Capacity: 8 * page, Used: 8 * page, Allocated: 8}, a.Stats(), "full device: no fragmentation")

	require.NoError(t, a.Free(0, page))
	require.NoError(t, a.Free(2*page, page))
	require.NoError(t, a.Free(3*page, page))
	require.NoError(t, a.Free(6*page, page))
	st := a.Stats()
	require.Equal(t, int64(4*page), st.Free)
	require.Equal(t, int64(2*page), st.LargestFree)
	require.Equal(t, 3, st.FreeExtents)
	require.Equal(t, 4, st.Allocated)
	require.InDelta(t, 0.5, st.Fragmentation, 1e-12)
}
