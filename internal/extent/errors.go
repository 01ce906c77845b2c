package extent

import (
	"errors"
	"fmt"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/size"
)

// ErrNoSpace is the one condition a client acts on and matches
// errs.ErrNoCapacity; ErrInvalid, ErrOverlap and ErrNotAllocated stay this
// package's own: they report the daemon's misuse of its allocator (a bug or
// a corrupt segment table), never a bad request of a client.

// ErrInvalid reports an argument that can never succeed: a non-positive or
// misaligned value, an alignment that is not a power of two, a length whose
// rounding overflows int64, or a range outside the device.
var ErrInvalid = errors.New("extent: invalid argument")

// ErrNoSpace reports that no free extent is large enough for an allocation.
// The error returned by [Allocator.Alloc] is a [*NoSpaceError] carrying the
// requested and the largest free length. It matches errs.ErrNoCapacity too.
var ErrNoSpace = errs.Sub(errs.ErrNoCapacity, "extent: no free extent large enough")

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
		return fmt.Sprintf("extent: no free extent of %s: largest free extent is %s of %s free (fragmented); free other extents or allocate a smaller length",
			size.Size(e.Requested).Human(), size.Size(e.LargestFree).Human(), size.Size(e.Free).Human())
	}
	return fmt.Sprintf("extent: no free extent of %s: only %s free (largest extent %s); free extents or use another device",
		size.Size(e.Requested).Human(), size.Size(e.Free).Human(), size.Size(e.LargestFree).Human())
}

// Unwrap returns [ErrNoSpace], so errors.Is matches it and, through it,
// errs.ErrNoCapacity.
func (e *NoSpaceError) Unwrap() error { return ErrNoSpace }
