package alloc_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/internal/testfs"
)

// TestPersistVolatile: on memory that a power loss clears (the emulated
// device in shared memory, local DRAM) Persist is a typed answer, not a
// silent success: a *NotDurableError matching ErrNotSupported that says
// why. Bounds and a closed segment are checked first.
func TestPersistVolatile(t *testing.T) {
	_, c := startPool(t)
	for _, tier := range []alloc.Tier{alloc.TierCXL, alloc.TierLocal, alloc.TierRDMA} {
		t.Run(tier.String(), func(t *testing.T) {
			seg, err := c.Alloc(t.Context(), 8192, alloc.WithTier(tier))
			require.NoError(t, err)
			d := seg.Durability()
			require.False(t, d.PowerSafe)
			require.Empty(t, d.Method)
			require.NotEmpty(t, d.Reason)
			err = seg.Persist(0, 100)
			require.ErrorIs(t, err, alloc.ErrNotSupported)
			var nd *alloc.NotDurableError
			require.ErrorAs(t, err, &nd)
			require.Equal(t, seg.ID(), nd.Segment)
			require.Contains(t, err.Error(), d.Reason)
			require.ErrorIs(t, seg.Persist(-1, 1), alloc.ErrOutOfRange)
			require.ErrorIs(t, seg.Persist(8000, 193), alloc.ErrOutOfRange)
			require.NoError(t, seg.Free(t.Context()))
			require.ErrorIs(t, seg.Persist(0, 1), alloc.ErrClosed)
		})
	}
}

// diskDir is a directory on a disk filesystem, where an emulated device's
// files survive a power loss once written back; the test is skipped where
// there is none.
func diskDir(t *testing.T) string {
	dir := t.TempDir()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	if st.Type == unix.TMPFS_MAGIC {
		t.Skip("the temporary directory is on tmpfs: no disk filesystem to put the emulated device on")
	}
	return dir
}

// TestPersistEmulatedOnDisk: an emulated device on a disk filesystem is
// power-safe; its mapping is refused MAP_SYNC (the page cache is between
// the process and the disk), so Persist is msync(MS_SYNC) of the range's
// pages, and the bytes are in the file on the disk afterwards.
// (mmap.TestSyncCleansPages sees those pages clean in the kernel's flags.)
func TestPersistEmulatedOnDisk(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.EmulateDir = filepath.Join(diskDir(t), "emulated")
	pooltest.Start(t, cfg)
	c := dial(t, cfg.Socket)
	seg, err := c.Alloc(t.Context(), 1<<20, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	d := seg.Durability()
	require.True(t, d.PowerSafe)
	require.Equal(t, alloc.PersistMsync, d.Method)
	require.Contains(t, d.Reason, "MAP_SYNC")
	_, err = seg.WriteAt([]byte("through a power loss"), 5000)
	require.NoError(t, err)
	require.NoError(t, seg.Persist(5000, 20))
	require.NoError(t, seg.Persist(0, seg.Size()))
	require.NoError(t, seg.Persist(7, 0))

	files, err := filepath.Glob(filepath.Join(cfg.EmulateDir, "*"))
	require.NoError(t, err)
	found := false
	for _, f := range files {
		if b, err := os.ReadFile(f); err == nil && len(b) > 5020 && string(b[5000:5020]) == "through a power loss" {
			found = true
		}
	}
	require.True(t, found, "the bytes are in the segment's file in %s", cfg.EmulateDir)
}

// TestPersistDevdax: a devdax device of a persistent (pmem) region, as in
// the lab's QEMU guest, is power-safe and Persist writes the range's cache
// lines back. Here the device is a stand-in file, so MAP_SYNC is refused
// and the lines go to a page cache; on a real device (the lab) the mapping
// is MAP_SYNC and the lines go to persistent memory.
func TestPersistDevdax(t *testing.T) {
	cfg := pooltest.Config(t)
	cfg.SysfsRoot = "../cxl/testdata/qemu-devdax"
	cfg.DevRoot = t.TempDir()
	cfg.AllowDevdaxFD = true
	dx := testfs.DevdaxStandIns(t, cfg.SysfsRoot, cfg.DevRoot)[0]
	require.True(t, dx.Persistent, "the fixture is a pmem region's device")
	pooltest.Start(t, cfg)
	c := dial(t, cfg.Socket)
	seg, err := c.Alloc(t.Context(), 1<<20, alloc.WithTier(alloc.TierCXL))
	require.NoError(t, err)
	require.Equal(t, "devdax", seg.Kind())
	d := seg.Durability()
	require.True(t, d.PowerSafe)
	require.Equal(t, alloc.PersistCacheFlush, d.Method)
	_, err = seg.WriteAt([]byte("flushed"), 64*3+5)
	require.NoError(t, err)
	require.NoError(t, seg.Persist(64*3+5, 7))
	require.NoError(t, seg.Persist(0, seg.Size()))
}
