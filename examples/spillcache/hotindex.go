package main

import (
	"sync/atomic"
	"unsafe"
)

// hotIndex maps a shard's hot keys to their entries by the hash the Cache
// already computed for the key (the shard's choice), so a lookup hashes
// nothing again. It is open addressing with linear probing and
// backward-shift deletion over one word per bucket:
//
//	0 when empty, else tag<<32 | entry index + 1
//
// where tag is bits 32-61 of the key's hash (the bits a far record keeps,
// so a record's hash finds its key here too): a lookup compares a key only
// where its tag matches. The bucket is h's low bits. Unlike a Go map, its
// bucket can be loaded ahead (prefetch) before the shard's lock is taken.
//
// A hotIndex is guarded by its shard's lock, but for prefetch, which reads
// only the published table and may run at any time.
type hotIndex struct {
	words []uint64 // a power of two of them
	n     int      // used buckets
	// pub is words for prefetch: its own copy of the slice header, which
	// growth replaces rather than writes.
	pub atomic.Pointer[[]uint64]
}

const tagMask = 1<<30 - 1

func hotWord(h uint64, i int32) uint64 { return (h>>32&tagMask)<<32 | uint64(uint32(i)+1) }

// init sizes the index for n keys.
func (x *hotIndex) init(n int) {
	size := 16
	for size*3 < n*4 {
		size <<= 1
	}
	x.setTable(make([]uint64, size))
	x.n = 0
}

func (x *hotIndex) setTable(w []uint64) {
	x.words = w
	x.pub.Store(&w)
}

// prefetch starts loading h's bucket.
func (x *hotIndex) prefetch(h uint64) {
	w := *x.pub.Load()
	prefetch(uintptr(unsafe.Pointer(&w[h&uint64(len(w)-1)])))
}

// get returns the index of key's entry, whose hash is h.
func (x *hotIndex) get(entries []hotEntry, h uint64, key string) (int32, bool) {
	mask := uint64(len(x.words) - 1)
	tag := h >> 32 & tagMask
	for b := h & mask; ; b = (b + 1) & mask {
		w := x.words[b]
		if w == 0 {
			return 0, false
		}
		if w>>32 == tag {
			if i := int32(uint32(w) - 1); entries[i].key == key {
				return i, true
			}
		}
	}
}

// put indexes entry i, whose key is not indexed, under its hash h.
func (x *hotIndex) put(entries []hotEntry, h uint64, i int32) {
	if (x.n+1)*4 > len(x.words)*3 {
		x.grow(entries)
	}
	x.insert(h, hotWord(h, i))
	x.n++
}

func (x *hotIndex) insert(h, word uint64) {
	mask := uint64(len(x.words) - 1)
	b := h & mask
	for x.words[b] != 0 {
		b = (b + 1) & mask
	}
	x.words[b] = word
}

// grow doubles the table, taking each entry's home from its hash.
func (x *hotIndex) grow(entries []hotEntry) {
	old := x.words
	x.setTable(make([]uint64, 2*len(old)))
	for _, w := range old {
		if w != 0 {
			x.insert(entries[uint32(w)-1].hash, w)
		}
	}
}

// del removes entry i, whose hash is h, while entries still holds the
// hashes of every indexed entry.
func (x *hotIndex) del(entries []hotEntry, h uint64, i int32) {
	mask := uint64(len(x.words) - 1)
	want := hotWord(h, i)
	b := h & mask
	for x.words[b] != want {
		if x.words[b] == 0 {
			return
		}
		b = (b + 1) & mask
	}
	x.n--
	for j := (b + 1) & mask; ; j = (j + 1) & mask {
		w := x.words[j]
		if w == 0 {
			break
		}
		if shiftsBack(b, j, entries[uint32(w)-1].hash&mask) {
			x.words[b] = w
			b = j
		}
	}
	x.words[b] = 0
}
