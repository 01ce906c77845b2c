//go:build !linux

package tcp

import (
	"testing"
	"unsafe"
)

// mapMem returns size bytes of 8-byte aligned memory. Off Linux the tests
// use the heap; the server does not care where the memory lives.
func mapMem(tb testing.TB, size int) []byte {
	tb.Helper()
	words := make([]uint64, (size+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)
}
