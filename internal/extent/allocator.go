package extent

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/google/btree"
)

// btreeDegree is the B-tree degree of both free-extent trees: nodes hold
// 31 to 63 extents of 16 bytes, so a tree of a million free extents is at
// most four levels deep. Degrees 16, 64 and 128 measured no better on
// BenchmarkAllocFree.
const btreeDegree = 32

// span is one extent [off, off+len) of the device.
type span struct {
	off, len int64
}

func (s span) end() int64 { return s.off + s.len }

// bySizeLess orders free extents by length, then offset: the first extent
// at or after {len: n} is the best fit for n.
func bySizeLess(a, b span) bool {
	if a.len != b.len {
		return a.len < b.len
	}
	return a.off < b.off
}

// byEndLess orders free extents by end offset; free extents never overlap,
// so the end alone identifies one and the order is also offset order.
// Keying by end rather than start makes the common updates replacements
// in place: splitting an extent from its low end (Alloc) and merging a
// freed extent into the free extent on its right (Free) keep the end.
func byEndLess(a, b span) bool { return a.end() < b.end() }

// Allocator hands out aligned extents of one device: best fit on
// allocation, coalescing on free. See the package documentation for the
// policy.
//
// An Allocator is not safe for concurrent use: callers serialize all
// method calls, Stats included (poold does so under its per-device lock).
type Allocator struct {
	capacity int64
	align    int64
	used     int64

	bySize *btree.BTreeG[span] // free extents by (length, offset)
	byEnd  *btree.BTreeG[span] // the same free extents by end offset

	allocated map[int64]int64 // offset -> length of every allocated extent
}

// Stats is a snapshot of an allocator's space. All sizes are in bytes.
// It is a plain value, safe to copy and share.
type Stats struct {
	// Capacity is the device capacity rounded down to the alignment.
	Capacity int64
	// Used is the sum of the lengths of allocated extents.
	Used int64
	// Free is Capacity - Used.
	Free int64
	// LargestFree is the length of the largest free extent, 0 when none.
	LargestFree int64
	// FreeExtents is the number of free extents.
	FreeExtents int
	// Allocated is the number of allocated extents.
	Allocated int
	// Fragmentation is 1 - LargestFree/Free: 0 when all free space is one
	// extent (or nothing is free), approaching 1 as free space splinters.
	Fragmentation float64
}

// New returns an allocator for a device of capacity bytes whose extents
// are aligned to align bytes. align must be a power of two (1 allows any
// offset); capacity is rounded down to a multiple of align and must stay
// positive. Errors wrap [ErrInvalid].
func New(capacity, align int64) (*Allocator, error) {
	if align <= 0 || bits.OnesCount64(uint64(align)) != 1 {
		return nil, fmt.Errorf("%w: alignment %d is not a power of two >= 1; use the device's alignment, e.g. 4096 or 2097152", ErrInvalid, align)
	}
	if capacity < 0 {
		return nil, fmt.Errorf("%w: capacity %d is negative; pass the device size in bytes", ErrInvalid, capacity)
	}
	usable := capacity &^ (align - 1)
	if usable == 0 {
		return nil, fmt.Errorf("%w: capacity %d holds no extent of alignment %d; use a larger device or a smaller alignment", ErrInvalid, capacity, align)
	}
	a := &Allocator{
		capacity:  usable,
		align:     align,
		bySize:    btree.NewG(btreeDegree, bySizeLess),
		byEnd:     btree.NewG(btreeDegree, byEndLess),
		allocated: make(map[int64]int64),
	}
	a.bySize.ReplaceOrInsert(span{off: 0, len: usable})
	a.byEnd.ReplaceOrInsert(span{off: 0, len: usable})
	return a, nil
}

// Capacity returns the usable capacity in bytes (rounded down to Align).
func (a *Allocator) Capacity() int64 { return a.capacity }

// Align returns the alignment of every offset and length, in bytes.
func (a *Allocator) Align() int64 { return a.align }

// roundUp rounds length up to the alignment. what names the argument in
// error messages.
func (a *Allocator) roundUp(what string, length int64) (int64, error) {
	if length <= 0 {
		return 0, fmt.Errorf("%w: %s %d is not positive; pass a length of at least 1 byte", ErrInvalid, what, length)
	}
	if length > math.MaxInt64-(a.align-1) {
		return 0, fmt.Errorf("%w: %s %d overflows int64 when rounded up to alignment %d; pass a length of at most the capacity %d", ErrInvalid, what, length, a.align, a.capacity)
	}
	return (length + a.align - 1) &^ (a.align - 1), nil
}

// Alloc allocates an extent of length bytes, rounded up to the alignment,
// and returns its offset. It takes the smallest free extent that fits,
// the lowest offset among equals, and allocates from its low end.
//
// A length <= 0, or one that overflows int64 when rounded, wraps
// [ErrInvalid]. When no free extent fits the error is a [*NoSpaceError],
// which matches [ErrNoSpace].
func (a *Allocator) Alloc(length int64) (off int64, err error) {
	n, err := a.roundUp("length", length)
	if err != nil {
		return 0, err
	}
	best, ok := a.bestFit(n)
	if !ok {
		return 0, &NoSpaceError{Requested: n, LargestFree: a.largestFree(), Free: a.capacity - a.used}
	}
	a.bySize.Delete(best)
	if best.len > n {
		rest := span{off: best.off + n, len: best.len - n}
		a.bySize.ReplaceOrInsert(rest)
		a.byEnd.ReplaceOrInsert(rest) // same end: replaces best
	} else {
		a.byEnd.Delete(best)
	}
	a.allocated[best.off] = n
	a.used += n
	return best.off, nil
}

// bestFit returns the smallest free extent of at least n bytes, the lowest
// offset among equals.
func (a *Allocator) bestFit(n int64) (best span, ok bool) {
	a.bySize.AscendGreaterOrEqual(span{off: math.MinInt64, len: n}, func(s span) bool {
		best, ok = s, true
		return false
	})
	return best, ok
}

// Reserve marks the extent [off, off+length) used, length rounded up to
// the alignment, as if Alloc had returned off. poold calls it at restart
// for every extent its segment table records, before serving allocations;
// the extent is then freed with Free like any other.
//
// A negative or misaligned off, a length <= 0, or a range that overflows
// or ends past the capacity wraps [ErrInvalid]; a range that is in part
// allocated already wraps [ErrOverlap].
func (a *Allocator) Reserve(off, length int64) error {
	n, err := a.roundUp("length", length)
	if err != nil {
		return err
	}
	if off < 0 || off&(a.align-1) != 0 {
		return fmt.Errorf("%w: reserve offset %d is negative or not a multiple of alignment %d; pass the offset Alloc returned", ErrInvalid, off, a.align)
	}
	if off > a.capacity || n > a.capacity-off {
		return fmt.Errorf("%w: reserve [%d, %d+%d) ends past capacity %d; check the recorded extent belongs to this device", ErrInvalid, off, off, n, a.capacity)
	}
	// The only free extent that can hold the range is the first one
	// ending after off.
	f, ok := a.firstEndingAtOrAfter(off + 1)
	if !ok || f.off > off {
		return fmt.Errorf("%w: reserve [%d, %d): offset %d is allocated; check for duplicate records of the extent", ErrOverlap, off, off+n, off)
	}
	if f.end() < off+n {
		return fmt.Errorf("%w: reserve [%d, %d): offset %d is allocated; check for duplicate or overlapping records", ErrOverlap, off, off+n, f.end())
	}
	a.bySize.Delete(f)
	if f.off < off {
		a.insertFree(span{off: f.off, len: off - f.off})
	}
	if f.end() > off+n {
		rest := span{off: off + n, len: f.end() - (off + n)}
		a.bySize.ReplaceOrInsert(rest)
		a.byEnd.ReplaceOrInsert(rest) // same end: replaces f
	} else {
		a.byEnd.Delete(f)
	}
	a.allocated[off] = n
	a.used += n
	return nil
}

// firstEndingAtOrAfter returns the free extent with the smallest end >= end.
func (a *Allocator) firstEndingAtOrAfter(end int64) (s span, ok bool) {
	a.byEnd.AscendGreaterOrEqual(span{off: end}, func(f span) bool {
		s, ok = f, true
		return false
	})
	return s, ok
}

// Free returns the extent [off, off+length) to the free space and merges
// it with free neighbours. The extent must be one that Alloc or Reserve
// handed out: the same offset and the same length after rounding up to the
// alignment (so the length originally requested works). Anything else — a
// double free, an unknown offset, a different length — wraps
// [ErrNotAllocated] and changes nothing; a length <= 0 or one that
// overflows wraps [ErrInvalid].
func (a *Allocator) Free(off, length int64) error {
	n, err := a.roundUp("length", length)
	if err != nil {
		return err
	}
	got, ok := a.allocated[off]
	if !ok {
		return fmt.Errorf("%w: free [%d, %d): no extent is allocated at offset %d (double free?); pass an offset that Alloc returned", ErrNotAllocated, off, off+n, off)
	}
	if got != n {
		return fmt.Errorf("%w: free [%d, %d): the extent at offset %d has length %d, not %d; pass the length it was allocated with", ErrNotAllocated, off, off+n, off, got, n)
	}
	delete(a.allocated, off)
	a.used -= n

	// One walk finds both neighbours: no free extent ends inside the
	// allocated one, so the first free extent ending at or after off is
	// the left neighbour if it ends at off, and the next one (or that one
	// itself otherwise) is the right neighbour if it starts at off+n.
	var prev, next span
	var hasPrev, hasNext bool
	a.byEnd.AscendGreaterOrEqual(span{off: off}, func(f span) bool {
		if !hasPrev && f.end() == off {
			prev, hasPrev = f, true
			return true
		}
		next, hasNext = f, f.off == off+n
		return false
	})
	merged := span{off: off, len: n}
	if hasPrev {
		a.bySize.Delete(prev)
		a.byEnd.Delete(prev)
		merged = span{off: prev.off, len: prev.len + n}
	}
	if hasNext {
		a.bySize.Delete(next)
		merged.len += next.len
	}
	// With a right neighbour the merged extent ends where it did, and the
	// insert into byEnd replaces it.
	a.insertFree(merged)
	return nil
}

// Stats returns a snapshot of the allocator's space.
func (a *Allocator) Stats() Stats {
	s := Stats{
		Capacity:    a.capacity,
		Used:        a.used,
		Free:        a.capacity - a.used,
		LargestFree: a.largestFree(),
		FreeExtents: a.byEnd.Len(),
		Allocated:   len(a.allocated),
	}
	if s.Free > 0 {
		s.Fragmentation = 1 - float64(s.LargestFree)/float64(s.Free)
	}
	return s
}

func (a *Allocator) largestFree() int64 {
	if m, ok := a.bySize.Max(); ok {
		return m.len
	}
	return 0
}

// insertFree adds s to both trees; in byEnd it replaces any free extent
// with the same end.
func (a *Allocator) insertFree(s span) {
	a.bySize.ReplaceOrInsert(s)
	a.byEnd.ReplaceOrInsert(s)
}
