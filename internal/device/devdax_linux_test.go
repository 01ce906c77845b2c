//go:build linux

package device

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewDevdaxBadInput(t *testing.T) {
	const size, align = 4 << 20, 2 << 20
	file := standIn(t, size)
	small := standIn(t, size/2)
	cases := []struct {
		name, dev, path string
		size, align     int64
		node            int
	}{
		{"empty name", "", file, size, align, 0},
		{"empty path", "dax0.0", "", size, align, 0},
		{"missing path", "dax0.0", filepath.Join(t.TempDir(), "nope"), size, align, 0},
		{"directory", "dax0.0", t.TempDir(), size, align, 0},
		{"stand-in too small", "dax0.0", small, size, align, 0},
		{"align not a power of two", "dax0.0", file, size, 3 * pageSize, 0},
		{"align below page size", "dax0.0", file, size, pageSize / 2, 0},
		{"size not a multiple of align", "dax0.0", file, size + pageSize, align, 0},
		{"zero size", "dax0.0", file, 0, align, 0},
		{"bad node", "dax0.0", file, size, align, -2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NewDevdax(tc.dev, tc.path, tc.size, tc.align, tc.node)
			require.ErrorIs(t, err, ErrInvalid)
			require.Nil(t, d)
		})
	}
}

// TestDevdaxSharesFD checks that every Backing is the whole device at the
// segment's offset: what one segment writes is where the device says.
func TestDevdaxSharesFD(t *testing.T) {
	const align = 2 << 20
	path := standIn(t, 8*align)
	d := openDevice(t, func() (Device, error) { return NewDevdax("dax0.0", path, 8*align, align, -1) })
	require.Equal(t, -1, d.Node())
	require.Equal(t, path, d.(*Devdax).Path())

	b, err := d.Create(1, 2*align, align)
	require.NoError(t, err)
	require.Equal(t, int64(2*align), b.Offset)
	fill(mapBacking(t, b), 5)

	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	requireZero(t, raw[:2*align])
	checkFill(t, raw[2*align:3*align], 5)
	requireZero(t, raw[3*align:])
}

// TestDevdaxZeroesStaleBytes plants bytes in the device outside any Create
// (a previous daemon's segment) and checks Create clears exactly the extent.
func TestDevdaxZeroesStaleBytes(t *testing.T) {
	const align = 64 << 10
	path := standIn(t, 4*align)
	stale := make([]byte, 4*align)
	for i := range stale {
		stale[i] = 0xa5
	}
	require.NoError(t, os.WriteFile(path, stale, 0o600))
	d := openDevice(t, func() (Device, error) { return NewDevdax("dax0.0", path, 4*align, align, 0) })

	b, err := d.Create(1, align, 2*align)
	require.NoError(t, err)
	requireZero(t, mapBacking(t, b))
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, stale[:align], raw[:align], "bytes before the extent untouched")
	require.Equal(t, stale[3*align:], raw[3*align:], "bytes after the extent untouched")

	b2, err := d.Open(2, 3*align, align)
	require.NoError(t, err, "Open does not zero")
	mem := mapBacking(t, b2)
	require.Equal(t, byte(0xa5), mem[0])
}

// TestDevdaxFaultIsError truncates the stand-in under the device, so that
// zeroing faults (as a poisoned CXL line would): Create must return an
// error, not crash the daemon.
func TestDevdaxFaultIsError(t *testing.T) {
	const align = 64 << 10
	path := standIn(t, 4*align)
	d := openDevice(t, func() (Device, error) { return NewDevdax("dax0.0", path, 4*align, align, 0) })
	require.NoError(t, os.Truncate(path, 0))
	_, err := d.Create(1, 0, align)
	require.ErrorIs(t, err, ErrNoSpace)
	require.ErrorContains(t, err, "memory fault")
}
