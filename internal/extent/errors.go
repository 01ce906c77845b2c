package extent

import (
	"errors"
	"fmt"
)

// ErrInvalid reports an argument that can never succeed: a non-positive or
// misaligned value, an alignment that is not a power of two, a length whose
// rounding overflows int64, or a range outside the device.
var ErrInvalid = errors.New("extent: invalid argument")

// ErrNoSpace reports that no free extent is large enough for an allocation.
// The error returned by [Allocator.Alloc] is a [*NoSpaceError] carrying the
// requested and the largest free length.
var ErrNoSpace = errors.New("extent: no free extent large enough")

// ErrOverlap reports that [Allocator.Reserve] was asked for a range that is
// already, at least in part, allocated.
var ErrOverlap = errors.New("extent: range overlaps an allocated extent")

// ErrNotAllocated reports a free of a range that is not an allocated
// extent: a double free, an unknown offset, or a length that differs from
// the allocated one.
var ErrNotAllocated = errors.New("extent: range is not an allocated extent")

// NoSpaceError is returned by [Allocator.Alloc] when no free extent fits.
// It matches [ErrNoSpace] with errors.Is; use errors.As to read the sizes,
// for example to decide whether compaction or another device could help.
// It is an immutable value, safe for concurrent use.
type NoSpaceError struct {
	// Requested is the length asked for, in bytes, after rounding up to the
	// allocator's alignment.
	Requested int64
	// LargestFree is the length of the largest free extent, in bytes.
	LargestFree int64
	// Free is the total free space, in bytes.
	Free int64
}

// Error implements error.
func (e *NoSpaceError) Error() string {
	if e.Free >= e.Requested {
		return fmt.Sprintf("extent: no free extent of %d bytes: largest free extent is %d bytes of %d free (fragmented); free other extents or allocate a smaller length",
			e.Requested, e.LargestFree, e.Free)
	}
	return fmt.Sprintf("extent: no free extent of %d bytes: only %d bytes free (largest extent %d); free extents or use another device",
		e.Requested, e.Free, e.LargestFree)
}

// Is reports whether target is [ErrNoSpace].
func (e *NoSpaceError) Is(target error) bool { return target == ErrNoSpace }
