//go:build linux

package tcp

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// mapMem returns size bytes of anonymous shared mapped memory, unmapped when
// the test ends (after servers started later in the test are closed).
func mapMem(tb testing.TB, size int) []byte {
	tb.Helper()
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, unix.Munmap(mem)) })
	return mem
}
