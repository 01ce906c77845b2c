package devices

import (
	"errors"
	"fmt"
)

// ErrNoSysfs is returned by Discover when the root is not a directory.
var ErrNoSysfs = errors.New("no sysfs tree at the given root; mount sysfs or pass its path")

// ErrSyntax is matched (errors.Is) by every *SyntaxError.
var ErrSyntax = errors.New("malformed sysfs value")

// SyntaxError is a sysfs value ParseEnum cannot read. A plain value.
type SyntaxError struct {
	// Value is the text read.
	Value string
	// Want says what the kernel writes there.
	Want string
}

// Error says what was read and what was expected.
func (e *SyntaxError) Error() string {
	return fmt.Sprintf("sysfs value %q: want %s", e.Value, e.Want)
}

// Is reports ErrSyntax.
func (e *SyntaxError) Is(target error) bool { return target == ErrSyntax }
