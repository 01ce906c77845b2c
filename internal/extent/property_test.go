package extent

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestRandomized runs thousands of random operations per seed and
// alignment and requires, after every one, that the allocator agrees
// exactly with the bitmap model (best-fit offsets, error kinds, free
// extents, stats) and that its invariants hold; then it frees everything
// and requires a single free extent covering the device.
func TestRandomized(t *testing.T) {
	const ops = 4000
	for _, align := range []int64{1, 64, page} {
		for seed := uint64(1); seed <= 6; seed++ {
			t.Run(fmt.Sprintf("align=%d/seed=%d", align, seed), func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, uint64(align)))
				units := int64(64 + rng.IntN(256))
				capacity := units*align + rng.Int64N(align) // not a multiple of align
				a, err := New(capacity, align)
				require.NoError(t, err)
				m := newModel(capacity, align)
				for range ops {
					step(t, a, m, randomOp(rng, m))
				}
				drain(t, a, m)
			})
		}
	}
}

// randomOp draws an operation that is mostly valid, sometimes not: lengths
// not multiples of the alignment, frees of live extents with the length
// originally requested, double and unknown frees, reserves that overlap or
// run past the device, lengths that overflow.
func randomOp(rng *rand.Rand, m *model) op {
	units := m.capacity / m.align
	// length of k units, minus a random amount below one unit: rounding
	// must give back k units.
	length := func(k int64) int64 { return k*m.align - rng.Int64N(m.align) }
	switch r := rng.IntN(100); {
	case r < 45:
		k := 1 + rng.Int64N(8)
		switch rng.IntN(50) {
		case 0:
			k = units + 1 + rng.Int64N(4) // larger than the device
		case 1:
			return op{kind: opAlloc, length: -rng.Int64N(2)}
		case 2:
			return op{kind: opAlloc, length: math.MaxInt64 - rng.Int64N(m.align)}
		}
		return op{kind: opAlloc, length: length(k)}
	case r < 80 && len(m.live) > 0:
		offs := slices.Sorted(maps.Keys(m.live))
		off := offs[rng.IntN(len(offs))]
		return op{kind: opFree, off: off, length: length(m.live[off] / m.align)}
	case r < 88:
		// Anything: mostly not allocated (unknown, double free, wrong length).
		off := rng.Int64N(units+2) * m.align
		if rng.IntN(4) == 0 && m.align > 1 {
			off += 1 + rng.Int64N(m.align-1)
		}
		return op{kind: opFree, off: off, length: length(1 + rng.Int64N(4))}
	default:
		off := rng.Int64N(units+2) * m.align
		if rng.IntN(5) == 0 && m.align > 1 {
			off += 1 + rng.Int64N(m.align-1)
		}
		if rng.IntN(30) == 0 {
			off = -off - m.align
		}
		return op{kind: opReserve, off: off, length: length(1 + rng.Int64N(6))}
	}
}

// drain frees every live extent in random order through step, then
// requires one free extent spanning the whole device.
func drain(t testing.TB, a *Allocator, m *model) {
	t.Helper()
	offs := slices.Sorted(maps.Keys(m.live))
	rand.New(rand.NewPCG(uint64(len(offs)), 0)).Shuffle(len(offs), func(i, j int) { offs[i], offs[j] = offs[j], offs[i] })
	for _, off := range offs {
		step(t, a, m, op{kind: opFree, off: off, length: m.live[off]})
	}
	st := a.Stats()
	require.Equal(t, a.Capacity(), st.Free, "free after freeing everything")
	require.Equal(t, 1, st.FreeExtents, "free extents after freeing everything")
	require.Equal(t, a.Capacity(), st.LargestFree)
	require.Zero(t, st.Allocated)
	require.Zero(t, st.Fragmentation)
}
