package testfs

import (
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

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
