package main

// prefetch asks the CPU to bring the cache line at addr into its caches
// without waiting for it (PREFETCHT0): a hint that never faults and, unlike
// a load, does not hold up the instructions after it, so a Get can start
// the DRAM miss of a far index bucket it may need before it takes its
// shard's lock and looks in the hot tier.
//
//go:noescape
func prefetch(addr uintptr)

// prefetchLines is prefetch of every 64-byte line of the n bytes at addr:
// the DRAM misses of a far record's lines overlap instead of following one
// another as a copy walks it.
//
//go:noescape
func prefetchLines(addr, n uintptr)
