//go:build linux

package device

import (
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestNewDRAMBadCapacity(t *testing.T) {
	for _, c := range []int64{0, -1} {
		d, err := NewDRAM(c)
		require.ErrorIs(t, err, ErrInvalid)
		require.Nil(t, d)
	}
}

// TestDRAMSealed checks that a client holding the descriptor cannot resize
// the memfd under other processes' mappings.
func TestDRAMSealed(t *testing.T) {
	d := openDevice(t, func() (Device, error) { return NewDRAM(1 << 20) })
	b, err := d.Create(1, 0, 2*pageSize)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.File.Close()) }()
	require.ErrorIs(t, b.File.Truncate(pageSize), unix.EPERM)
	require.ErrorIs(t, b.File.Truncate(4*pageSize), unix.EPERM)
}

func TestDRAMOpenWrongLength(t *testing.T) {
	d := openDevice(t, func() (Device, error) { return NewDRAM(1 << 20) })
	b, err := d.Create(1, 0, 2*pageSize)
	require.NoError(t, err)
	require.NoError(t, b.File.Close())
	_, err = d.Open(1, 0, pageSize)
	require.ErrorIs(t, err, ErrInvalid)
}
