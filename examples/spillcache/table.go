package main

import (
	"context"
	"fmt"
	"unsafe"

	"github.com/farmem/farmem/alloc"
)

// farTable is an open-addressing hash table (linear probing, backward-shift
// deletion, no tombstones) kept in a far-memory segment, so the index of
// spilled entries costs the Go heap and the garbage collector nothing. It
// is cut into one region per cache shard; a region is only touched under
// its shard's lock.
//
// A bucket is two 8-byte words:
//
//	word 0: 0 when empty, else 1<<63 | referenced<<62 | hash & (1<<62-1)
//	word 1: the alloc.Ref of the record (key and value) in the tier's arena
type farTable struct {
	seg     *alloc.Segment
	words   []uint64 // the segment, as words
	buckets uint64   // per region, a power of two
}

const (
	bucketUsed = 1 << 63
	bucketRef  = 1 << 62
	hashMask   = 1<<62 - 1
)

// newFarTable allocates regions*buckets buckets on a load/store tier
// (cxl, else local DRAM).
func newFarTable(c *alloc.Client, ctx context.Context, regions int, buckets uint64) (*farTable, error) {
	n := int64(regions) * int64(buckets) * 16
	n = (n + 1<<20 - 1) &^ (1<<20 - 1)
	seg, err := c.Alloc(ctx, n, alloc.WithTier(alloc.TierCXL), alloc.WithFallback(alloc.TierLocal))
	if err != nil {
		return nil, fmt.Errorf("far index of %d bytes: %w", n, err)
	}
	b, ok := seg.Bytes()
	if !ok {
		seg.Free(ctx)
		return nil, fmt.Errorf("far index landed on tier %s, which has no load/store mapping", seg.Tier())
	}
	return &farTable{seg: seg, words: unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8), buckets: buckets}, nil
}

// region returns the words of one shard's buckets.
func (t *farTable) region(shard int) []uint64 {
	n := t.buckets * 2
	return t.words[uint64(shard)*n : uint64(shard+1)*n]
}

// find returns the bucket holding hash h whose record match accepts, or -1.
func (t *farTable) find(reg []uint64, h uint64, match func(alloc.Ref) bool) int {
	mask := t.buckets - 1
	want := h&hashMask | bucketUsed
	for i, n := h&mask, uint64(0); n < t.buckets; i, n = (i+1)&mask, n+1 {
		w := reg[2*i]
		if w == 0 {
			return -1
		}
		if w&^bucketRef == want && match(alloc.Ref(reg[2*i+1])) {
			return int(i)
		}
	}
	return -1
}

// insert puts (h, ref) in the first empty bucket from h's home; the caller
// keeps the region below its capacity.
func (t *farTable) insert(reg []uint64, h uint64, ref alloc.Ref) {
	mask := t.buckets - 1
	for i := h & mask; ; i = (i + 1) & mask {
		if reg[2*i] == 0 {
			reg[2*i+1] = uint64(ref)
			reg[2*i] = h&hashMask | bucketUsed
			return
		}
	}
}

// remove empties bucket i and shifts later entries of the probe run back.
func (t *farTable) remove(reg []uint64, i uint64) {
	mask := t.buckets - 1
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		w := reg[2*j]
		if w == 0 {
			break
		}
		if shiftsBack(i, j, w&hashMask&mask) {
			reg[2*i], reg[2*i+1] = w, reg[2*j+1]
			i = j
		}
	}
	reg[2*i], reg[2*i+1] = 0, 0
}

// shiftsBack says whether the entry in bucket j of a linear-probing run,
// whose home bucket is home, moves back into the hole at bucket i when
// the hole's entry is deleted: its home is not in the cyclic range (i, j].
func shiftsBack(i, j, home uint64) bool {
	return (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)
}

// prefetch starts loading the home bucket of hash h in a shard's region.
func (t *farTable) prefetch(shard int, h uint64) {
	i := (uint64(shard)*t.buckets + h&(t.buckets-1)) * 2
	prefetch(uintptr(unsafe.Pointer(&t.words[i])))
}

func (t *farTable) free(ctx context.Context) error { return t.seg.Free(ctx) }

// sameHash compares hashes by the bits the index keeps: a record moved
// down a tier carries only those.
func sameHash(a, b uint64) bool { return (a^b)&hashMask == 0 }
