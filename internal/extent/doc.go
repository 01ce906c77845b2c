// Package extent allocates aligned extents of one far-memory device.
//
// poold keeps one [Allocator] per local device (a devdax device, a
// memory-only NUMA node or an emulated CXL file). The allocator knows
// nothing about memory itself: it hands out byte ranges [off, off+length)
// of a device of fixed capacity, every offset and length a multiple of the
// device's alignment, and it measures how fragmented the free space is.
//
// Policy:
//   - Best fit: [Allocator.Alloc] takes the smallest free extent that fits,
//     the lowest offset among equally small ones, and allocates from its low
//     end. Best fit keeps large free extents whole for large segments.
//   - Coalescing: [Allocator.Free] merges the freed extent with free
//     neighbours on both sides, so free space never stays split between two
//     adjacent free extents.
//   - Exact frees: a free must name an extent exactly as it was allocated
//     (same offset, same length after rounding); a double free or a free of
//     an unknown range is an error, never silent corruption.
//   - Restart: [Allocator.Reserve] marks a given extent used, so the daemon
//     rebuilds the allocator from its segment table after a restart.
//
// Cost: free extents sit in two B-trees (github.com/google/btree), one
// ordered by (length, offset) for best fit and one by end offset (which is
// offset order) for coalescing and Reserve, and allocated extents in a
// map from offset to length, so Alloc, Free and Reserve take O(log n) time
// in the number of free extents and Stats O(1). BenchmarkAllocFree and
// TestAllocFreeScaling measure the growth from 10 to 100,000 extents.
//
// Concurrency: an Allocator is not safe for concurrent use. The daemon
// serializes calls under its own per-device lock; the allocator adds no
// locking of its own so that the daemon can update the allocator and its
// metadata store under one critical section.
//
// OS and build tags: none; the package is pure Go.
package extent
