package alloc

import "math/bits"

// Size classes of an Arena: multiples of 16 bytes up to 128, then eight
// classes per doubling (144, 160, ... 256, 288, ... 1 MiB), so an object
// wastes at most 12.5% of its slot (and less than 16 bytes below 128).
const (
	// MaxObjectSize is the largest object an Arena holds: 1 MiB. Larger
	// values belong in a Segment of their own (Client.Alloc).
	MaxObjectSize = 1 << 20
	// MinObjectSize is the smallest slot an Arena hands out: 16 bytes.
	MinObjectSize = 16

	numClasses = 8 + (20-7)*8
)

// classSizes[c] is the slot size of class c.
var classSizes = func() (t [numClasses]uint32) {
	for c := range t {
		t[c] = classSize(c)
	}
	return t
}()

func classSize(c int) uint32 {
	if c < 8 {
		return uint32(c+1) * 16
	}
	k := 7 + (c-8)/8
	idx := (c-8)%8 + 1
	return 1<<k + uint32(idx)<<(k-3)
}

// classOf returns the class of an n-byte object, 0 < n <= MaxObjectSize.
func classOf(n int) int {
	if n <= 128 {
		return (n - 1) >> 4
	}
	k := bits.Len(uint(n-1)) - 1 // 2^k < n <= 2^(k+1)
	step := k - 3
	idx := (n - 1<<k + 1<<step - 1) >> step // 1..8
	return 8 + (k-7)*8 + idx - 1
}

// SizeClass returns the slot size an Arena uses for an n-byte object: the
// bytes it holds for it. It returns 0 when n is not in 1..MaxObjectSize.
func SizeClass(n int) int {
	if n <= 0 || n > MaxObjectSize {
		return 0
	}
	return int(classSizes[classOf(n)])
}
