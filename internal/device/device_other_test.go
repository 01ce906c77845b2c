//go:build !linux

package device

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNotSupportedOutsideLinux(t *testing.T) {
	_, err := NewEmulated("emulated0", t.TempDir(), 1<<20)
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = NewDRAM(1 << 20)
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = NewNUMA(0, t.TempDir(), 1<<20)
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = NewDevdax("dax0.0", os.DevNull, 2<<20, 2<<20, 0)
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = PagesOnNode(make([]byte, 1))
	require.ErrorIs(t, err, ErrNotSupported)
	f, err := os.CreateTemp(t.TempDir(), "seg")
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	_, err = Map(Backing{File: f, Length: 4096})
	require.ErrorIs(t, err, ErrNotSupported)
}
