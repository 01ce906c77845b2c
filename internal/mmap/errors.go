package mmap

import (
	"runtime"

	"github.com/farmem/farmem/internal/errs"
)

// NotSupportedError reports that this system has no shared file mappings as
// farmem uses them (any OS but Linux), or that a file or CPU lacks what an
// operation needs (MAP_SYNC, a cache-line write-back instruction). errors.Is(err, errs.ErrNotSupported)
// holds for it. It is an immutable value, safe for concurrent use.
type NotSupportedError struct {
	// Op names what was asked, e.g. "shared mapping".
	Op string
	// Reason says why not; empty for "needs Linux".
	Reason string
}

// Error implements error.
func (e *NotSupportedError) Error() string {
	if e.Reason != "" {
		return "mmap: " + e.Op + ": " + e.Reason
	}
	return "mmap: " + e.Op + " needs Linux (mmap of memfd, tmpfs and devdax files); this is " + runtime.GOOS
}

// Is reports whether target is errs.ErrNotSupported, so callers can fall back.
func (e *NotSupportedError) Is(target error) bool { return target == errs.ErrNotSupported }
