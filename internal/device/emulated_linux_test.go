//go:build linux

package device

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/errs"
)

func TestNewEmulatedBadInput(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	cases := []struct {
		name, dev, dir string
		capacity       int64
		want           error
	}{
		{"empty name", "", t.TempDir(), 1 << 20, ErrInvalid},
		{"empty dir", "emulated0", "", 1 << 20, ErrInvalid},
		{"dir under a file", "emulated0", filepath.Join(file, "sub"), 1 << 20, ErrInvalid},
		{"zero capacity", "emulated0", t.TempDir(), 0, ErrInvalid},
		{"negative capacity", "emulated0", t.TempDir(), -1, ErrInvalid},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewEmulated(tc.dev, tc.dir, tc.capacity)
			require.ErrorIs(t, err, tc.want)
			require.Nil(t, d)
		})
	}
}

func TestEmulatedCreatesDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	d := openDevice(t, func() (Device, error) { return NewEmulated("emulated0", dir, 1<<20) })
	st, err := os.Stat(dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
	require.Equal(t, dir, d.(*Emulated).Dir())
	require.False(t, d.(*Emulated).Huge())
}

func TestEmulatedDirInUse(t *testing.T) {
	dir := t.TempDir()
	d, err := NewEmulated("emulated0", dir, 1<<20)
	require.NoError(t, err)
	_, err = NewEmulated("emulated1", dir, 1<<20)
	require.ErrorIs(t, err, ErrInUse)
	require.NoError(t, d.Close())
	d2, err := NewEmulated("emulated1", dir, 1<<20)
	require.NoError(t, err, "Close releases the directory")
	require.NoError(t, d2.Close())
}

func TestEmulatedOpenLost(t *testing.T) {
	dir := t.TempDir()
	d := openDevice(t, func() (Device, error) { return NewEmulated("emulated0", dir, 1<<20) })
	pg := d.Align()

	_, err := d.Open(5, 0, pg)
	require.ErrorIs(t, err, ErrLost, "never created")

	b, err := d.Create(5, 0, 2*pg)
	require.NoError(t, err)
	require.NoError(t, b.File.Close())
	_, err = d.Open(5, 0, pg)
	require.ErrorIs(t, err, ErrLost, "length differs from the file")

	require.NoError(t, os.Truncate(filepath.Join(dir, "seg-0000000000000005"), pg))
	_, err = d.Open(5, 0, 2*pg)
	require.ErrorIs(t, err, ErrLost, "file truncated by someone else")
}

func TestEmulatedSegments(t *testing.T) {
	dir := t.TempDir()
	d := openDevice(t, func() (Device, error) { return NewEmulated("emulated0", dir, 1<<20) })
	e := d.(*Emulated)
	pg := d.Align()
	ids, err := e.Segments()
	require.NoError(t, err)
	require.Empty(t, ids)
	for _, id := range []uint64{0x30, 1, 0xffffffffffffffff} {
		b, err := d.Create(id, 0, pg)
		require.NoError(t, err)
		require.NoError(t, b.File.Close())
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "seg-junk"), nil, 0o600))
	ids, err = e.Segments()
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 0x30, 0xffffffffffffffff}, ids)
	require.NoError(t, d.Remove(0x30, 0, pg))
	ids, err = e.Segments()
	require.NoError(t, err)
	require.Equal(t, []uint64{1, 0xffffffffffffffff}, ids)
}

// TestEmulatedNoSpace uses a tiny tmpfs: Create of a segment larger than
// the filesystem fails with ErrNoSpace up front.
func TestEmulatedNoSpace(t *testing.T) {
	dir := mountTest(t, "tmpfs", "size=1m")
	d := openDevice(t, func() (Device, error) { return NewEmulated("emulated0", dir, 64<<20) })
	_, err := d.Create(1, 0, 8<<20)
	require.ErrorIs(t, err, ErrNoSpace)
	require.ErrorIs(t, err, errs.ErrNoCapacity, "the daemon tries the caller's next tier on it")
	require.ErrorContains(t, err, dir)
	require.ErrorContains(t, err, "needs 8.0 MiB", "sizes for people")
	b, err := d.Create(2, 0, 256<<10)
	require.NoError(t, err)
	require.NoError(t, b.File.Close())
}

// TestEmulatedHugetlbfs mounts a private hugetlbfs: Align is the huge page
// size and extents must be multiples of it. Create reserves the segment's
// huge pages: with too few free (as on most test machines) it fails with
// ErrNoSpace naming the sysctl, never later with a fault on first touch.
func TestEmulatedHugetlbfs(t *testing.T) {
	dir := mountTest(t, "hugetlbfs", "")
	d := openDevice(t, func() (Device, error) { return NewEmulated("emulated0", dir, 1<<30) })
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	huge := int64(st.Bsize)
	require.Greater(t, huge, pageSize)
	require.Equal(t, huge, d.Align())
	require.True(t, d.(*Emulated).Huge())

	_, err := d.Create(1, 0, pageSize)
	require.ErrorIs(t, err, ErrUnaligned)
	_, err = d.Create(1, pageSize, huge)
	require.ErrorIs(t, err, ErrUnaligned)
	if freeHugePages(t) < 2 {
		_, err := d.Create(1, huge, 2*huge)
		require.ErrorIs(t, err, ErrNoSpace)
		require.ErrorContains(t, err, "vm.nr_hugepages")
		ids, err := d.(*Emulated).Segments()
		require.NoError(t, err)
		require.Empty(t, ids, "a failed Create leaves no file")
		return
	}
	b, err := d.Create(1, huge, 2*huge)
	require.NoError(t, err)
	require.NoError(t, b.File.Close())
	b, err = d.Open(1, huge, 2*huge)
	require.NoError(t, err)
	require.NoError(t, b.File.Close())
	require.NoError(t, d.Remove(1, huge, 2*huge))
}

// freeHugePages reads HugePages_Free from /proc/meminfo.
func freeHugePages(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/meminfo")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "HugePages_Free:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			require.NoError(t, err)
			return n
		}
	}
	return 0
}

// mountTest mounts a private filesystem of type fstype on a temporary
// directory for the test, or skips when that is not possible (not root).
func mountTest(t *testing.T, fstype, data string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skipf("mounting %s needs root", fstype)
	}
	dir := t.TempDir()
	if err := unix.Mount("farmem-test", dir, fstype, unix.MS_NOSUID|unix.MS_NODEV, data); err != nil {
		t.Skipf("mount %s on %s: %v", fstype, dir, err)
	}
	t.Cleanup(func() { require.NoError(t, unix.Unmount(dir, unix.MNT_DETACH)) })
	return dir
}
