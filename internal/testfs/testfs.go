package testfs

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/cxl"
	"github.com/farmem/farmem/internal/size"
)

// SmallFS mounts a tmpfs of sz bytes on a fresh temporary directory and
// returns it, unmounted when the test ends: a filesystem a test can fill.
// It skips the test, saying why, when not root or when the mount fails.
func SmallFS(t testing.TB, sz size.Size) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if err := unix.Mount("farmem-test", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d,mode=0700", int64(sz))); err != nil {
		t.Skipf("mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() { require.NoError(t, unix.Unmount(dir, unix.MNT_DETACH)) })
	return dir
}

// FillFS writes a file in dir that leaves about leave bytes of its
// filesystem available, and returns its path (remove it to give the room
// back).
func FillFS(t testing.TB, dir string, leave size.Size) string {
	t.Helper()
	var st unix.Statfs_t
	require.NoError(t, unix.Statfs(dir, &st))
	n := int64(st.Bavail)*int64(st.Bsize) - int64(leave)
	p, err := os.CreateTemp(dir, "filler")
	require.NoError(t, err)
	defer p.Close()
	if n > 0 {
		require.NoError(t, unix.Fallocate(int(p.Fd()), 0, 0, n))
	}
	return p.Name()
}

// Resize changes the size of a tmpfs that SmallFS mounted.
func Resize(t testing.TB, dir string, sz size.Size) {
	t.Helper()
	require.NoError(t, unix.Mount("farmem-test", dir, "tmpfs", unix.MS_REMOUNT|unix.MS_NOSUID|unix.MS_NODEV, fmt.Sprintf("size=%d", int64(sz))))
}

// DevdaxStandIns makes, under devRoot, a sparse regular file for each
// devdax device of the sysfs tree at sysfsRoot (a fixture under
// cxl/testdata), of the device's size, where poold started with that tree
// and --dev-root devRoot opens the device: a character device would need
// the hardware. It returns the devices.
func DevdaxStandIns(t testing.TB, sysfsRoot, devRoot string) []cxl.DaxDevice {
	t.Helper()
	fs, err := cxl.NewFS(sysfsRoot)
	require.NoError(t, err)
	inv, err := fs.Discover()
	require.NoError(t, err)
	daxes := inv.DevdaxDevices()
	require.NotEmpty(t, daxes, "no devdax device in %s", sysfsRoot)
	for _, dx := range daxes {
		path := filepath.Join(devRoot, dx.DevPath)
		require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		require.NoError(t, os.WriteFile(path, nil, 0o600))
		require.NoError(t, os.Truncate(path, int64(dx.Size)))
	}
	return daxes
}
