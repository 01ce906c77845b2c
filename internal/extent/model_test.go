package extent

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// model is the reference the allocator is checked against: a bitmap with
// one bit per alignment unit and a map of live extents. It is obviously
// correct and O(capacity) per operation, so it only runs on small devices.
type model struct {
	align    int64
	capacity int64
	used     []bool          // used[i] covers [i*align, (i+1)*align)
	live     map[int64]int64 // offset -> rounded length
}

func newModel(capacity, align int64) *model {
	capacity &^= align - 1
	return &model{
		align:    align,
		capacity: capacity,
		used:     make([]bool, capacity/align),
		live:     make(map[int64]int64),
	}
}

// runs returns the maximal free runs in offset order, in bytes.
func (m *model) runs() []span {
	var out []span
	for i := 0; i < len(m.used); {
		if m.used[i] {
			i++
			continue
		}
		j := i
		for j < len(m.used) && !m.used[j] {
			j++
		}
		out = append(out, span{off: int64(i) * m.align, len: int64(j-i) * m.align})
		i = j
	}
	return out
}

func (m *model) stats() Stats {
	s := Stats{Capacity: m.capacity, Allocated: len(m.live)}
	for _, r := range m.runs() {
		s.Free += r.len
		s.FreeExtents++
		s.LargestFree = max(s.LargestFree, r.len)
	}
	s.Used = m.capacity - s.Free
	if s.Free > 0 {
		s.Fragmentation = 1 - float64(s.LargestFree)/float64(s.Free)
	}
	return s
}

// round mirrors the allocator's length rule; ok is false for ErrInvalid.
func (m *model) round(length int64) (int64, bool) {
	if length <= 0 || length > math.MaxInt64-(m.align-1) {
		return 0, false
	}
	return (length + m.align - 1) / m.align * m.align, true
}

func (m *model) mark(off, n int64, used bool) {
	for i := off / m.align; i < (off+n)/m.align; i++ {
		m.used[i] = used
	}
}

func (m *model) rangeFree(off, n int64) bool {
	for i := off / m.align; i < (off+n)/m.align; i++ {
		if m.used[i] {
			return false
		}
	}
	return true
}

// opKind names an allocator operation in property, fuzz and transcript tests.
type opKind int

const (
	opAlloc opKind = iota
	opFree
	opReserve
)

func (k opKind) String() string { return [...]string{"alloc", "free", "reserve"}[k] }

type op struct {
	kind        opKind
	off, length int64
}

func (o op) String() string {
	if o.kind == opAlloc {
		return fmt.Sprintf("alloc %d", o.length)
	}
	return fmt.Sprintf("%v %d %d", o.kind, o.off, o.length)
}

// step applies o to both the allocator and the model, requires that the
// allocator did what the model predicts (including the exact best-fit
// offset and the error kind), then checks every invariant.
func step(t testing.TB, a *Allocator, m *model, o op) {
	t.Helper()
	switch o.kind {
	case opAlloc:
		off, err := a.Alloc(o.length)
		n, ok := m.round(o.length)
		if !ok {
			require.ErrorIs(t, err, ErrInvalid, "%v", o)
			break
		}
		// Best fit: the smallest run that fits; runs are in offset order, so
		// a strict < keeps the lowest offset among equals.
		var best span
		found := false
		for _, r := range m.runs() {
			if r.len >= n && (!found || r.len < best.len) {
				best, found = r, true
			}
		}
		want := best.off
		if !found {
			var nse *NoSpaceError
			require.ErrorAs(t, err, &nse, "%v", o)
			require.ErrorIs(t, err, ErrNoSpace)
			st := m.stats()
			require.Equal(t, NoSpaceError{Requested: n, LargestFree: st.LargestFree, Free: st.Free}, *nse)
			break
		}
		require.NoError(t, err, "%v", o)
		require.Equal(t, want, off, "%v: best fit", o)
		require.True(t, m.rangeFree(off, n), "%v: returned [%d,%d) overlaps a live extent", o, off, off+n)
		m.mark(off, n, true)
		m.live[off] = n
	case opFree:
		err := a.Free(o.off, o.length)
		n, ok := m.round(o.length)
		switch {
		case !ok:
			require.ErrorIs(t, err, ErrInvalid, "%v", o)
		case m.live[o.off] != n || n == 0:
			require.ErrorIs(t, err, ErrNotAllocated, "%v", o)
		default:
			require.NoError(t, err, "%v", o)
			m.mark(o.off, n, false)
			delete(m.live, o.off)
		}
	case opReserve:
		err := a.Reserve(o.off, o.length)
		n, ok := m.round(o.length)
		switch {
		case !ok, o.off < 0, o.off%m.align != 0, o.off > m.capacity, n > m.capacity-o.off:
			require.ErrorIs(t, err, ErrInvalid, "%v", o)
		case !m.rangeFree(o.off, n):
			require.ErrorIs(t, err, ErrOverlap, "%v", o)
		default:
			require.NoError(t, err, "%v", o)
			m.mark(o.off, n, true)
			m.live[o.off] = n
		}
	}
	checkInvariants(t, a, m)
}

// checkInvariants checks the allocator's internal structures and its
// agreement with the model: the free trees hold the same extents, free
// extents are aligned, inside [0, capacity), disjoint and never adjacent
// (coalesced), free and allocated extents tile the device, and
// Used+Free == Capacity. With a model it also requires the free extents to
// be exactly the model's free runs and the allocated map its live set.
func checkInvariants(t testing.TB, a *Allocator, m *model) {
	t.Helper()
	var byOff, bySize []span
	a.byEnd.Ascend(func(s span) bool { byOff = append(byOff, s); return true })
	a.bySize.Ascend(func(s span) bool { bySize = append(bySize, s); return true })
	require.Len(t, bySize, len(byOff), "free trees disagree")
	require.True(t, slices.IsSortedFunc(bySize, func(x, y span) int {
		if bySizeLess(x, y) {
			return -1
		}
		return 1
	}), "bySize not ordered")
	sorted := slices.Clone(bySize)
	slices.SortFunc(sorted, func(x, y span) int { return int(min(max(x.off-y.off, -1), 1)) })
	require.Equal(t, byOff, sorted, "free trees hold different extents")
	// Per-extent checks use plain conditions: a require call per extent
	// per step would dominate the property tests' run time.
	for i, s := range byOff {
		if s.len <= 0 || s.off%a.align != 0 || s.len%a.align != 0 || s.off < 0 || s.len > a.capacity-s.off {
			require.Failf(t, "bad free extent", "[%d, %d) is empty, misaligned to %d or outside [0, %d)", s.off, s.end(), a.align, a.capacity)
		}
		if i > 0 && s.off <= byOff[i-1].end() {
			require.Failf(t, "free extents overlap or are not coalesced", "%v and %v", byOff[i-1], s)
		}
	}
	for off, n := range a.allocated {
		if off%a.align != 0 || n%a.align != 0 || off < 0 || n <= 0 || n > a.capacity-off {
			require.Failf(t, "bad allocated extent", "[%d, +%d) is empty, misaligned to %d or outside [0, %d)", off, n, a.align, a.capacity)
		}
	}
	// Free and allocated extents tile [0, capacity): none overlap, no byte
	// is lost.
	all := slices.Clone(byOff)
	for off, n := range a.allocated {
		all = append(all, span{off: off, len: n})
	}
	slices.SortFunc(all, func(x, y span) int { return int(min(max(x.off-y.off, -1), 1)) })
	next := int64(0)
	for _, s := range all {
		if s.off != next {
			require.Failf(t, "extents do not tile the device", "extent %v starts at %d, previous extent ends at %d", s, s.off, next)
		}
		next = s.end()
	}
	require.Equal(t, a.capacity, next, "extents end before capacity")
	if m != nil {
		require.Equal(t, m.runs(), byOffOrNil(byOff), "free extents differ from the model")
		require.Equal(t, m.live, a.allocated, "allocated extents differ from the model")
		require.Equal(t, m.stats(), a.Stats())
	}
	st := a.Stats()
	require.Equal(t, st.Capacity, st.Used+st.Free, "Used+Free != Capacity")
	var live int64
	for _, n := range a.allocated {
		live += n
	}
	require.Equal(t, live, st.Used)
}

func byOffOrNil(s []span) []span {
	if len(s) == 0 {
		return nil
	}
	return s
}

// errName names the sentinel err matches, for transcripts and messages.
func errName(err error) string {
	for _, e := range []struct {
		name string
		err  error
	}{{"ErrInvalid", ErrInvalid}, {"ErrNoSpace", ErrNoSpace}, {"ErrOverlap", ErrOverlap}, {"ErrNotAllocated", ErrNotAllocated}} {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return fmt.Sprintf("unexpected(%v)", err)
}
