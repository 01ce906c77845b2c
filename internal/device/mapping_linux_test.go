//go:build linux

package device

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMapUnalignedOffset(t *testing.T) {
	path := standIn(t, 4*pageSize)
	data := make([]byte, 4*pageSize)
	fill(data, 3)
	require.NoError(t, os.WriteFile(path, data, 0o600))

	for _, tc := range []struct {
		name        string
		off, length int64
	}{
		{"aligned", pageSize, pageSize},
		{"inside a page", 100, 200},
		{"across pages", pageSize - 10, pageSize + 20},
		{"to the end", 3*pageSize + 1, pageSize - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := os.OpenFile(path, os.O_RDWR, 0)
			require.NoError(t, err)
			b := Backing{File: f, Offset: tc.off, Length: tc.length}
			mem := mapBacking(t, b, MapOptions{Populate: true})
			require.Equal(t, data[tc.off:tc.off+tc.length], mem)
			require.Equal(t, len(mem), cap(mem), "no access beyond the segment through append")
		})
	}
}

func TestMapShared(t *testing.T) {
	d := openDevice(t, func() (Device, error) { return NewDRAM(1 << 20) })
	b, err := d.Create(1, 0, pageSize)
	require.NoError(t, err)
	b2, err := d.Open(1, 0, pageSize)
	require.NoError(t, err)
	m1, m2 := mapBacking(t, b), mapBacking(t, b2)
	m1[10] = 77
	require.Equal(t, byte(77), m2[10], "two mappings of a segment share memory")
}

func TestMapBadInput(t *testing.T) {
	f, err := os.Open(standIn(t, pageSize))
	require.NoError(t, err)
	defer func() { require.NoError(t, f.Close()) }()
	for _, tc := range []struct {
		name string
		b    Backing
		opts []MapOptions
	}{
		{"nil file", Backing{Length: pageSize}, nil},
		{"zero length", Backing{File: f}, nil},
		{"negative length", Backing{File: f, Length: -1}, nil},
		{"negative offset", Backing{File: f, Offset: -pageSize, Length: pageSize}, nil},
		{"overflow", Backing{File: f, Offset: 1 << 62, Length: 1 << 62}, nil},
		{"two options", Backing{File: f, Length: pageSize}, []MapOptions{{}, {}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Map(tc.b, tc.opts...)
			require.ErrorIs(t, err, ErrInvalid)
			require.Nil(t, m)
		})
	}
}

func TestMappingCloseIdempotent(t *testing.T) {
	d := openDevice(t, func() (Device, error) { return NewDRAM(1 << 20) })
	b, err := d.Create(1, 0, pageSize)
	require.NoError(t, err)
	defer func() { require.NoError(t, b.File.Close()) }()
	m, err := Map(b)
	require.NoError(t, err)
	require.NoError(t, b.File.Close(), "the mapping outlives the descriptor")
	b.File, err = os.Open(os.DevNull) // keep the deferred Close valid
	require.NoError(t, err)
	m.Bytes()[0] = 1
	require.NoError(t, m.Close())
	require.NoError(t, m.Close())
}
