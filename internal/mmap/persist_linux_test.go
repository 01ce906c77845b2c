package mmap

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/errs"
)

// pageDirty reads the kernel's dirty flag of the page mapped at p
// (/proc/self/pagemap for its frame, /proc/kpageflags bit 4, KPF_DIRTY):
// set while the page holds stores not yet written to the file.
func pageDirty(t *testing.T, p *byte) bool {
	t.Helper()
	ps := uintptr(os.Getpagesize())
	var e [8]byte
	pm, err := os.Open("/proc/self/pagemap")
	require.NoError(t, err)
	defer pm.Close()
	_, err = pm.ReadAt(e[:], int64(uintptr(unsafe.Pointer(p))/ps*8))
	require.NoError(t, err)
	v := binary.LittleEndian.Uint64(e[:])
	require.NotZero(t, v&(1<<63), "page not present")
	pfn := v & (1<<55 - 1)
	require.NotZero(t, pfn, "no frame number: reading it needs CAP_SYS_ADMIN")
	kf, err := os.Open("/proc/kpageflags")
	require.NoError(t, err)
	defer kf.Close()
	_, err = kf.ReadAt(e[:], int64(pfn*8))
	require.NoError(t, err)
	return binary.LittleEndian.Uint64(e[:])&(1<<4) != 0
}

// diskDir is a directory on a disk filesystem (not tmpfs), where the
// durable path of Sync can be seen; the test is skipped where there is none.
func diskDir(t *testing.T) string {
	t.Helper()
	for _, d := range []string{t.TempDir(), "."} {
		var st unix.Statfs_t
		if unix.Statfs(d, &st) == nil && st.Type != unix.TMPFS_MAGIC {
			if d == "." {
				tmp, err := os.MkdirTemp(".", "persist-test")
				require.NoError(t, err)
				t.Cleanup(func() { os.RemoveAll(tmp) })
				return tmp
			}
			return d
		}
	}
	t.Skip("no disk filesystem here (temporary directory and package directory are on tmpfs)")
	return ""
}

// TestSyncCleansPages: a store through a shared mapping of a file on a
// disk filesystem dirties its page; Sync writes it to the disk, after
// which the page is clean: the msync(MS_SYNC) path Persist takes for such
// segments, seen in the kernel's page flags.
func TestSyncCleansPages(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("reading a page's frame and flags (/proc/self/pagemap, /proc/kpageflags) needs root")
	}
	page := int64(os.Getpagesize())
	f, err := os.Create(filepath.Join(diskDir(t), "seg"))
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(4*page))
	require.NoError(t, f.Sync())
	b, err := Shared(f, 0, 4*page, false)
	require.NoError(t, err)
	defer Unmap(b)

	copy(b[page+10:], "durable")
	require.True(t, pageDirty(t, &b[page]), "a store dirties the page")
	require.NoError(t, Sync(b[page+10:page+17]), "an unaligned range is widened to its pages")
	require.False(t, pageDirty(t, &b[page]), "Sync wrote the page back")
	got := make([]byte, 7)
	_, err = f.ReadAt(got, page+10)
	require.NoError(t, err)
	require.Equal(t, "durable", string(got))
}

// TestSharedSyncRefusedOffPmem: MAP_SYNC is refused, with a reason that
// matches ErrNotSupported, for a file that is not persistent memory mapped
// directly (tmpfs here; a disk filesystem without DAX the same).
func TestSharedSyncRefusedOffPmem(t *testing.T) {
	f := memfd(t, int64(os.Getpagesize()))
	_, err := SharedSync(f, 0, int64(os.Getpagesize()), false)
	require.ErrorIs(t, err, errs.ErrNotSupported)
	require.Contains(t, err.Error(), "MAP_SYNC")
	require.Contains(t, err.Error(), "not persistent memory")
}

// TestFlushOnMapping: Flush writes back the cache lines of a mapped range
// with the best instruction this CPU has (the path Persist takes on devdax
// and MAP_SYNC mappings; whether the lines reach persistent memory only
// real persistent memory can show), from any start and length.
func TestFlushOnMapping(t *testing.T) {
	f := memfd(t, 2*int64(os.Getpagesize()))
	b, err := Shared(f, 0, 2*int64(os.Getpagesize()), false)
	require.NoError(t, err)
	defer Unmap(b)
	copy(b[100:], "line")
	require.NoError(t, Flush(b[100:104]))
	require.NoError(t, Flush(b[63:len(b)-1]))
	require.NoError(t, Flush(b))
	require.NoError(t, Flush(nil))
	require.Contains(t, []string{"clflush+sfence", "clflushopt+sfence", "clwb+sfence"}, FlushMethod())
	require.Equal(t, "line", string(b[100:104]))
}
