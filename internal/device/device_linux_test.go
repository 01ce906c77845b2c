//go:build linux

package device

import (
	"fmt"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDeviceProperties(t *testing.T) {
	want := map[string]struct {
		kind                         Kind
		name                         string
		emulated, shares, persistent bool
		node                         int
		align                        int64
	}{
		"emulated-tmpdir": {KindEmulated, "emulated0", true, false, true, -1, pageSize},
		"emulated-shm":    {KindEmulated, "emulated0", true, false, true, -1, pageSize},
		"dram":            {KindDRAM, "dram", false, false, false, -1, pageSize},
		"numa-node0":      {KindNUMA, "node0", false, false, true, 0, pageSize},
		"devdax-standin":  {KindDevdax, "dax0.0", false, true, true, 0, testDaxAlign},
	}
	for _, tc := range deviceCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := openDevice(t, tc.setup(t))
			w, ok := want[tc.name]
			require.True(t, ok)
			require.Equal(t, w.kind, d.Kind())
			require.Equal(t, w.name, d.Name())
			require.Equal(t, w.emulated, d.Emulated())
			require.Equal(t, w.shares, d.SharesFD())
			require.Equal(t, w.persistent, d.Persistent())
			require.Equal(t, w.node, d.Node())
			require.Equal(t, w.align, d.Align())
			require.Equal(t, int64(testCapacity), d.Capacity())
		})
	}
}

func TestDeviceCreateOpenRemove(t *testing.T) {
	for _, tc := range deviceCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := openDevice(t, tc.setup(t))
			off, length := 2*d.Align(), 3*d.Align()

			b, err := d.Create(1, off, length)
			require.NoError(t, err)
			require.Equal(t, length, b.Length)
			if d.SharesFD() {
				require.Equal(t, off, b.Offset)
			}
			mem := mapBacking(t, b)
			requireZero(t, mem)
			fill(mem, 1)

			b2, err := d.Open(1, off, length)
			require.NoError(t, err)
			checkFill(t, mapBacking(t, b2), 1)

			require.NoError(t, d.Remove(1, off, length))
			require.NoError(t, d.Remove(1, off, length), "Remove is idempotent")
			if !d.SharesFD() {
				_, err = d.Open(1, off, length)
				require.ErrorIs(t, err, ErrLost)
			}
			// A mapping made before Remove keeps its memory.
			checkFill(t, mem, 1)

			require.NoError(t, d.Close())
			require.NoError(t, d.Close(), "Close is idempotent")
			_, err = d.Create(2, 0, length)
			require.ErrorIs(t, err, ErrClosed)
			_, err = d.Open(1, off, length)
			require.ErrorIs(t, err, ErrClosed)
			require.ErrorIs(t, d.Remove(1, off, length), ErrClosed)
		})
	}
}

// TestDeviceCreateZeroes checks that a new segment never shows bytes of a
// previous one: the same id created again, or (devdax) a new segment on a
// previous segment's extent.
func TestDeviceCreateZeroes(t *testing.T) {
	for _, tc := range deviceCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := openDevice(t, tc.setup(t))
			length := 2 * d.Align()

			b, err := d.Create(7, 0, length)
			require.NoError(t, err)
			old := mapBacking(t, b)
			fill(old, 9)

			nextID := uint64(7) // recreate the same id without Remove
			if d.SharesFD() {
				require.NoError(t, d.Remove(7, 0, length))
				nextID = 8 // a different segment on the same extent
			}
			b2, err := d.Create(nextID, 0, length)
			require.NoError(t, err)
			requireZero(t, mapBacking(t, b2))

			if !d.SharesFD() {
				// The earlier mapping still holds the replaced segment's
				// pages rather than faulting or seeing the new ones.
				checkFill(t, old, 9)
			}
		})
	}
}

func TestDeviceRestart(t *testing.T) {
	for _, tc := range deviceCases() {
		t.Run(tc.name, func(t *testing.T) {
			open := tc.setup(t)
			d, err := open()
			require.NoError(t, err)
			length := 4 * d.Align()
			b, err := d.Create(0xfeed, d.Align(), length)
			require.NoError(t, err)
			m, err := Map(b)
			require.NoError(t, err)
			fill(m.Bytes(), 42)
			require.NoError(t, m.Close())
			require.NoError(t, b.File.Close())
			require.NoError(t, d.Close())

			d2 := openDevice(t, open)
			b2, err := d2.Open(0xfeed, d.Align(), length)
			if !d2.Persistent() {
				require.ErrorIs(t, err, ErrLost)
				return
			}
			require.NoError(t, err)
			checkFill(t, mapBacking(t, b2), 42)
		})
	}
}

func TestDeviceBadExtent(t *testing.T) {
	for _, tc := range deviceCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := openDevice(t, tc.setup(t))
			a := d.Align()
			bad := []struct {
				name        string
				off, length int64
				want        error
			}{
				{"negative length", 0, -a, ErrInvalid},
				{"zero length", 0, 0, ErrInvalid},
				{"negative offset", -a, a, ErrInvalid},
				{"unaligned offset", a / 2, a, ErrUnaligned},
				{"unaligned length", 0, a + 1, ErrUnaligned},
				{"beyond capacity", d.Capacity() - a + a, a, ErrInvalid},
				{"overflowing", 1<<62 - (1<<62)%a, 1<<62 - (1<<62)%a, ErrInvalid},
			}
			for _, bc := range bad {
				t.Run(bc.name, func(t *testing.T) {
					_, err := d.Create(3, bc.off, bc.length)
					require.ErrorIs(t, err, bc.want)
					_, err = d.Open(3, bc.off, bc.length)
					require.ErrorIs(t, err, bc.want)
					require.ErrorIs(t, d.Remove(3, bc.off, bc.length), bc.want)
				})
			}
		})
	}
}

// TestDeviceConcurrent exercises distinct segments from several goroutines
// (meaningful under -race).
func TestDeviceConcurrent(t *testing.T) {
	for _, tc := range deviceCases() {
		t.Run(tc.name, func(t *testing.T) {
			d := openDevice(t, tc.setup(t))
			a := d.Align()
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for g := range 8 {
				wg.Go(func() {
					id, off := uint64(100+g), int64(g)*a
					for range 5 {
						b, err := d.Create(id, off, a)
						if err != nil {
							errs <- err
							return
						}
						m, err := Map(b)
						if err == nil {
							m.Bytes()[0] = byte(g)
							err = m.Close()
						}
						_ = b.File.Close()
						if err == nil {
							var b2 Backing
							if b2, err = d.Open(id, off, a); err == nil {
								err = b2.File.Close()
							}
						}
						if err == nil {
							err = d.Remove(id, off, a)
						}
						if err != nil {
							errs <- fmt.Errorf("goroutine %d: %w", g, err)
							return
						}
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
		})
	}
}
