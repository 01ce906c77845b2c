package paths

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// shmTree makes a shared-memory directory laid out as poold's: segment
// directories with a lock file and a segment file, and an owner file
// naming dataDir when it is not "".
func shmTree(t *testing.T, root, name, dataDir string) string {
	t.Helper()
	dir := filepath.Join(root, name)
	for _, sub := range []string{"emulated-cxl", "export"} {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, sub), 0o700))
		require.NoError(t, os.WriteFile(filepath.Join(dir, sub, lockName), nil, 0o600))
		require.NoError(t, os.WriteFile(filepath.Join(dir, sub, "seg-0000000000000001"), make([]byte, 64<<10), 0o600))
	}
	if dataDir != "" {
		require.NoError(t, WriteShmOwner(dir, dataDir))
	}
	return dir
}

func TestScanShm(t *testing.T) {
	root := t.TempDir()
	live, stopped, gone := t.TempDir(), t.TempDir(), filepath.Join(t.TempDir(), "deleted")
	inUse := shmTree(t, root, "farmem-0-11111111", live)
	f, err := os.OpenFile(filepath.Join(inUse, "export", lockName), os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB))
	stop := shmTree(t, root, "farmem-0-22222222", stopped)
	orphan := shmTree(t, root, "farmem-0-33333333", gone)
	old := shmTree(t, root, "farmem-0-44444444", "")
	shmTree(t, root, "other-app", "")

	dirs, err := ScanShm(root, ProcLocks)
	require.NoError(t, err)
	got := map[string]ShmDir{}
	for _, d := range dirs {
		got[d.Path] = d
	}
	require.Len(t, got, 4, "only farmem-* directories")
	require.Equal(t, ShmInUse, got[inUse].State)
	require.Equal(t, os.Getpid(), got[inUse].PID)
	require.Equal(t, ShmStopped, got[stop].State)
	require.Equal(t, stopped, got[stop].DataDir)
	require.Equal(t, ShmOrphaned, got[orphan].State)
	require.Equal(t, gone, got[orphan].DataDir)
	require.Equal(t, ShmUnknownOwner, got[old].State)
	require.GreaterOrEqual(t, got[orphan].Bytes, int64(128<<10), "the segment files' blocks")

	// Released, the lock no longer marks the directory in use.
	require.NoError(t, unix.Flock(int(f.Fd()), unix.LOCK_UN))
	dirs, err = ScanShm(root, ProcLocks)
	require.NoError(t, err)
	for _, d := range dirs {
		if d.Path == inUse {
			require.Equal(t, ShmStopped, d.State)
		}
	}
}

func TestScanShmWithoutLockTable(t *testing.T) {
	root := t.TempDir()
	shmTree(t, root, "farmem-0-55555555", filepath.Join(root, "gone"))
	_, err := ScanShm(root, filepath.Join(root, "no-locks"))
	require.ErrorContains(t, err, "cannot tell which directories a running poold uses")
	dirs, err := ScanShm(filepath.Join(root, "missing"), ProcLocks)
	require.NoError(t, err)
	require.Empty(t, dirs)
}

func TestParseLocks(t *testing.T) {
	held, err := ParseLocks([]byte("1: FLOCK  ADVISORY  WRITE 4242 00:1a:123456 0 EOF\n" +
		"1: -> FLOCK  ADVISORY  WRITE 4343 00:1a:123456 0 EOF\n" +
		"2: OFDLCK ADVISORY  READ  -1 fd:01:99 0 EOF\n"))
	require.NoError(t, err)
	require.Equal(t, map[FileID]int{{Major: 0, Minor: 0x1a, Inode: 123456}: 4242, {Major: 0xfd, Minor: 1, Inode: 99}: -1}, held)
	for _, bad := range []string{"1: FLOCK ADVISORY WRITE\n", "1: FLOCK ADVISORY WRITE x 00:1a:1 0 EOF\n", "1: FLOCK ADVISORY WRITE 1 00:1a 0 EOF\n", "1: FLOCK ADVISORY WRITE 1 zz:1a:1 0 EOF\n"} {
		_, err := ParseLocks([]byte(bad))
		require.Error(t, err, bad)
	}
}

func FuzzParseLocks(f *testing.F) {
	f.Add([]byte("1: FLOCK  ADVISORY  WRITE 4242 00:1a:123456 0 EOF\n"))
	f.Add([]byte("1: -> FLOCK  ADVISORY  WRITE 1 00:1a:1 0 EOF\n2: POSIX  ADVISORY  READ 7 08:02:1234 128 128\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		held, err := ParseLocks(b)
		if err != nil && held != nil {
			t.Fatalf("error %v with a table", err)
		}
	})
}
