//go:build linux

package device

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// devCase is one device kind under test. setup prepares fresh state (a
// directory or stand-in file) and returns a constructor that can be called
// again on the same state, to model a daemon restart.
type devCase struct {
	name  string
	setup func(t *testing.T) func() (Device, error)
}

const testCapacity = 64 << 20

// shmDir returns a fresh directory on /dev/shm (tmpfs), removed after the
// test, or skips the test when /dev/shm is not tmpfs.
func shmDir(t testing.TB) string {
	t.Helper()
	var st unix.Statfs_t
	if err := unix.Statfs("/dev/shm", &st); err != nil || uint32(st.Type) != uint32(unix.TMPFS_MAGIC) {
		t.Skip("needs /dev/shm on tmpfs")
	}
	dir, err := os.MkdirTemp("/dev/shm", "farmem-device-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// standIn returns the path of a regular file of size bytes standing in for a
// devdax device.
func standIn(t *testing.T, size int64) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "dax-")
	require.NoError(t, err)
	require.NoError(t, f.Truncate(size))
	require.NoError(t, f.Close())
	return f.Name()
}

const testDaxAlign = 64 << 10

func deviceCases() []devCase {
	return []devCase{
		{"emulated-tmpdir", func(t *testing.T) func() (Device, error) {
			dir := t.TempDir()
			return func() (Device, error) { return NewEmulated("emulated0", dir, testCapacity) }
		}},
		{"emulated-shm", func(t *testing.T) func() (Device, error) {
			dir := shmDir(t)
			return func() (Device, error) { return NewEmulated("emulated0", dir, testCapacity) }
		}},
		{"dram", func(t *testing.T) func() (Device, error) {
			return func() (Device, error) { return NewDRAM(testCapacity) }
		}},
		{"numa-node0", func(t *testing.T) func() (Device, error) {
			dir := shmDir(t)
			return func() (Device, error) { return NewNUMA(0, dir, testCapacity) }
		}},
		{"devdax-standin", func(t *testing.T) func() (Device, error) {
			path := standIn(t, testCapacity)
			return func() (Device, error) { return NewDevdax("dax0.0", path, testCapacity, testDaxAlign, 0) }
		}},
	}
}

// openDevice constructs a device and closes it when the test ends.
func openDevice(t *testing.T, open func() (Device, error)) Device {
	t.Helper()
	d, err := open()
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, d.Close()) })
	return d
}

// mapBacking maps b, closing the backing's file and the mapping when the
// test ends.
func mapBacking(t *testing.T, b Backing, opts ...MapOptions) []byte {
	t.Helper()
	t.Cleanup(func() { require.NoError(t, b.File.Close()) })
	m, err := Map(b, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, m.Close()) })
	require.Len(t, m.Bytes(), int(b.Length))
	return m.Bytes()
}

// fill writes a pattern derived from seed; checkFill verifies it.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7)
	}
}

func checkFill(t *testing.T, b []byte, seed byte) {
	t.Helper()
	for i := range b {
		if b[i] != seed+byte(i*7) {
			require.Failf(t, "pattern mismatch", "byte %d is %#x, want %#x", i, b[i], seed+byte(i*7))
		}
	}
}

func requireZero(t *testing.T, b []byte) {
	t.Helper()
	for i, c := range b {
		if c != 0 {
			require.Failf(t, "not zero", "byte %d of %d is %#x", i, len(b), c)
		}
	}
}
