package extent

import (
	"maps"
	"math"
	"slices"
	"testing"
)

// FuzzAllocator decodes bytes into an allocator and a sequence of
// operations and checks each against the bitmap model, as TestRandomized
// does; a final drain requires one free extent spanning the device.
//
// Encoding: byte 0 picks the alignment (1, 8, 64 or 512), byte 1 the
// capacity in units (16..127), byte 2 a remainder below one unit that
// New must round away; then each 3 bytes [kind, a, b] is one operation.
//
//	go test -run '^$' -fuzz FuzzAllocator -fuzztime 100000x ./internal/extent/
//
// A count (Nx) rather than a duration avoids a race in the Go fuzzing
// coordinator that fails a duration-bounded run with "context deadline
// exceeded" when workers are starved at the deadline (seen on this shared
// machine; see ethereum-optimism/optimism#21516).
func FuzzAllocator(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 3 {
			return
		}
		align := int64(1) << (3 * (data[0] % 4))
		units := 16 + int64(data[1]%112)
		capacity := units*align + int64(data[2])%align
		a, err := New(capacity, align)
		if err != nil {
			t.Fatalf("New(%d, %d): %v", capacity, align, err)
		}
		m := newModel(capacity, align)
		data = data[3:]
		const maxOps = 400 // keeps one input, and its minimization, fast
		for i := 0; i+3 <= len(data) && i/3 < maxOps; i += 3 {
			step(t, a, m, decodeOp(m, data[i], data[i+1], data[i+2]))
		}
		drain(t, a, m)
	})
}

// decodeOp turns three bytes into an operation on a device described by m.
func decodeOp(m *model, kind, x, y byte) op {
	units := m.capacity / m.align
	below := int64(y) % m.align // less than one unit, to exercise rounding
	switch kind % 4 {
	case 0:
		switch x {
		case 255:
			return op{kind: opAlloc, length: -int64(y)}
		case 254:
			return op{kind: opAlloc, length: math.MaxInt64 - int64(y)}
		}
		return op{kind: opAlloc, length: (int64(x%24)+1)*m.align - below}
	case 1:
		if len(m.live) == 0 {
			return op{kind: opFree, off: int64(x) * m.align, length: m.align}
		}
		offs := slices.Sorted(maps.Keys(m.live))
		off := offs[int(x)%len(offs)]
		return op{kind: opFree, off: off, length: m.live[off] - below}
	case 2:
		off := int64(x) % (units + 2) * m.align
		if y&0x80 != 0 && m.align > 1 {
			off++
		}
		return op{kind: opFree, off: off, length: int64(y%4+1) * m.align}
	default:
		off := int64(x) % (units + 2) * m.align
		switch {
		case y&0x80 != 0 && m.align > 1:
			off++
		case y&0x40 != 0:
			off = -off - m.align
		}
		return op{kind: opReserve, off: off, length: int64(y%8+1)*m.align - int64(y>>3)%m.align}
	}
}
