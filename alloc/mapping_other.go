//go:build !linux

package alloc

import (
	"fmt"
	"os"
)

func mapShared(*os.File, int64, int64, bool) ([]byte, error) {
	return nil, fmt.Errorf("mapping segments: %w", ErrNotSupported)
}

func unmapNow([]byte) {}

func retireMapping([]byte, bool) {}

func memoryBacked(*os.File) bool { return false }
