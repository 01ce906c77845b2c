package mmap

import (
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/errs"
)

// sink keeps a load from being optimized away.
var sink byte

// memfd returns a memory file of n bytes.
func memfd(t *testing.T, n int64) *os.File {
	fd, err := unix.MemfdCreate("mmap-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	f := os.NewFile(uintptr(fd), "memfd:mmap-test")
	t.Cleanup(func() { f.Close() })
	require.NoError(t, f.Truncate(n))
	return f
}

// TestSharedSeesTheFile: a store through the mapping is in the file, at the
// offset mapped, and Unmap gives the range back.
func TestSharedSeesTheFile(t *testing.T) {
	page := int64(os.Getpagesize())
	f := memfd(t, 4*page)
	for _, populate := range []bool{false, true} {
		b, err := Shared(f, page, 2*page, populate)
		require.NoError(t, err)
		require.Len(t, b, int(2*page))
		copy(b[1:], "far")
		got := make([]byte, 3)
		_, err = f.ReadAt(got, page+1)
		require.NoError(t, err)
		require.Equal(t, "far", string(got))
		require.NoError(t, Unmap(b))
	}
	require.True(t, MemoryBacked(f), "a memfd is memory")
}

// TestSharedRefusesBadLengths: a length mmap cannot take is ErrInvalid,
// naming the length, before any system call.
func TestSharedRefusesBadLengths(t *testing.T) {
	f := memfd(t, 4096)
	for _, n := range []int64{0, -1} {
		_, err := Shared(f, 0, n, false)
		require.ErrorIs(t, err, errs.ErrInvalid)
		require.ErrorContains(t, err, "out of range")
	}
}

// TestRetire: a mapping whose pages may go to another segment faults at
// once (an error under SetPanicOnFault), one whose pages are its own stays
// readable for the grace period.
func TestRetire(t *testing.T) {
	page := int64(os.Getpagesize())
	f := memfd(t, page)
	own, err := Shared(f, 0, page, false)
	require.NoError(t, err)
	own[0] = 7
	Retire(own, time.Hour, true)
	require.Equal(t, byte(7), own[0], "own pages stay readable during the grace period")

	shared, err := Shared(f, 0, page, false)
	require.NoError(t, err)
	Retire(shared, time.Hour, false)
	require.Panics(t, func() {
		old := debug.SetPanicOnFault(true)
		defer debug.SetPanicOnFault(old)
		sink = shared[0]
	}, "a retired mapping of pages that are not its own must fault")
}
