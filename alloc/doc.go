// Package alloc is the library applications import to allocate far memory
// from farmem: CXL memory (real or emulated), local DRAM, and, with peers,
// remote memory.
//
//	c, err := alloc.Dial(ctx, "")                  // the local poold, default socket
//	seg, err := c.Alloc(ctx, 64<<20, alloc.WithTier(alloc.TierCXL))
//	b, _ := seg.Bytes()                            // load/store tiers: the memory itself
//	_, err = seg.WriteAt(data, 0)                  // or io.WriterAt / io.ReaderAt
//	err = seg.Free(ctx)
//
// Local segments are mapped into the application's address space from a
// file descriptor the daemon passes over its unix socket: reads and writes
// never go through the daemon. ReadAt, WriteAt and the atomics turn a
// memory fault (a truncated backing file, a poisoned CXL line) into an
// error; a slice from Bytes is the application's to guard.
//
// Concurrency: Client and Segment are safe for concurrent use. A slice
// returned by Segment.Bytes is valid until the segment is freed or the
// client closed; using it after that is a use-after-free.
//
// Errors are farmem's sentinels (ErrNoCapacity, ErrOutOfRange, ...), tested
// with errors.Is; the daemon's message, saying what to do, is kept.
//
// Needs Linux for local segments (memfd, mmap, SCM_RIGHTS).
package alloc
