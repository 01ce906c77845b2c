//go:build !linux

package paths

import (
	"errors"
	"fmt"
)

// ProcLocks is the kernel's table of file locks; only Linux has one here.
const ProcLocks = "/proc/locks"

// fileID cannot tell files apart as a lock table does outside Linux:
// every directory is then reported in use.
func fileID(path string) (FileID, int64, error) {
	return FileID{}, 0, fmt.Errorf("%s: %w", path, errors.ErrUnsupported)
}
