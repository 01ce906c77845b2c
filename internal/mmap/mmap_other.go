//go:build !linux

package mmap

import (
	"os"
	"time"
)

// Shared fails with a *NotSupportedError outside Linux.
func Shared(*os.File, int64, int64, bool) ([]byte, error) {
	return nil, &NotSupportedError{Op: "shared mapping"}
}

// SharedSync fails with a *NotSupportedError outside Linux.
func SharedSync(*os.File, int64, int64, bool) ([]byte, error) {
	return nil, &NotSupportedError{Op: "MAP_SYNC mapping"}
}

// Sync fails with a *NotSupportedError outside Linux.
func Sync([]byte) error { return &NotSupportedError{Op: "msync"} }

// Unmap fails with a *NotSupportedError outside Linux; no mapping can exist.
func Unmap([]byte) error { return &NotSupportedError{Op: "munmap"} }

// Retire does nothing outside Linux, where Shared maps nothing.
func Retire([]byte, time.Duration, bool) {}

// MemoryBacked is false outside Linux.
func MemoryBacked(*os.File) bool { return false }

// WillNeed does nothing outside Linux.
func WillNeed([]byte) {}
