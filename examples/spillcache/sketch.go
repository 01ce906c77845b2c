package main

import "unsafe"

// sketch estimates how often keys were used lately: a count-min sketch of
// four rows of 4-bit counters, with conservative update (only the smallest
// of a key's counters grow) and aging (every counter halves once the
// sketch has counted sample uses), as TinyLFU keeps it. A key's four
// counters lie in one 64-byte block (one row in each pair of its words),
// so counting or estimating a key costs one cache miss, not four. The
// admission policy compares two keys' estimates: a far entry moves up a
// tier only when it is hotter than the entry it would push out.
//
// It holds no pointers, so it costs the collector nothing to scan. Not
// safe for concurrent use: each shard keeps its own under its lock.
type sketch struct {
	words  []uint64 // blocks of 8 words, 16 counters a word
	blocks uint64   // a power of two
	adds   int
	sample int
}

const sketchRows = 4

// newSketch sizes a sketch for about n keys: a power of two of at least
// n counters per row, halving after 8 uses per counter.
func newSketch(n int) sketch {
	blocks := uint64(1)
	for blocks*32 < uint64(n) { // a block holds 32 counters of each row
		blocks <<= 1
	}
	return sketch{words: make([]uint64, 8*blocks), blocks: blocks, sample: 8 * 32 * int(blocks)}
}

// slots returns the word index and bit shift of each row's counter for
// hash h. They come from one multiplicative rehash of the hash's low 62
// bits (those the far index keeps), so a far entry's frequency is found
// from its index bucket without reading its record: the low bits pick the
// block, the top 32 bits one counter in each row's two words.
func (s *sketch) slots(h uint64) (w [sketchRows]int, sh [sketchRows]uint) {
	x := (h & hashMask) * 0x9e3779b97f4a7c15
	base := int(x&(s.blocks-1)) * 8
	for r := range sketchRows {
		i := x >> (32 + 5*r) & 31 // one of the row's 32 counters
		w[r], sh[r] = base+2*r+int(i>>4), uint(i&15)*4
	}
	return w, sh
}

// add counts one use of the key with hash h.
func (s *sketch) add(h uint64) {
	w, sh := s.slots(h)
	low := s.min(w, sh)
	if low < 15 {
		for r := range sketchRows {
			if s.words[w[r]]>>sh[r]&15 == low {
				s.words[w[r]] += 1 << sh[r]
			}
		}
	}
	if s.adds++; s.adds >= s.sample {
		for i, x := range s.words {
			s.words[i] = x >> 1 & 0x7777777777777777
		}
		s.adds /= 2
	}
}

// estimate returns the key's count: at least its uses since the last
// aging, at most 15.
func (s *sketch) estimate(h uint64) uint64 {
	return s.min(s.slots(h))
}

// prefetch starts loading the block of hash h.
func (s *sketch) prefetch(h uint64) {
	x := (h & hashMask) * 0x9e3779b97f4a7c15
	prefetch(uintptr(unsafe.Pointer(&s.words[int(x&(s.blocks-1))*8])))
}

func (s *sketch) min(w [sketchRows]int, sh [sketchRows]uint) uint64 {
	low := uint64(15)
	for r := range sketchRows {
		low = min(low, s.words[w[r]]>>sh[r]&15)
	}
	return low
}
