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
// Latency emulation (poold --emulate-latency, or WithEmulateLatency for one
// client) makes ReadAt, WriteAt and the 64-bit atomics of a tier take a
// target latency plus size/bandwidth, e.g. CXL at 200 ns or RDMA at 2 µs on
// a host with neither, calibrated so the whole call takes the target.
// Direct loads and stores through Bytes cannot be slowed: code that uses
// Bytes runs at the speed of the real memory behind it, and a program that
// wants to see emulated costs must go through ReadAt/WriteAt. Injected
// latency is always reported as "injected" (TierInfo, Segment.Injected),
// never as a measurement.
//
// Concurrency: Client and Segment are safe for concurrent use. A slice
// returned by Segment.Bytes is valid until the segment is freed or the
// client closed; using it after that is a use-after-free.
//
// Errors are farmem's sentinels (ErrNoCapacity, ErrOutOfRange, ...), tested
// with errors.Is; the daemon's message, saying what to do, is kept.
//
// Remote (rdma) segments are reached over a data-plane connection to their
// home that the client redials when it breaks, retrying the call within
// WithOpTimeout. Reads are retried as they are; WriteAt, CompareAndSwap64
// and Add64 carry an operation id that the home remembers, so a retry is
// answered with the first run's result and never applied twice. When the
// home cannot tell (it restarted, or forgot this client's answers), the
// call returns ErrIndeterminate, which also matches ErrUnavailable: the
// operation may have run once; read the memory to find out.
//
// Needs Linux for local segments (memfd, mmap, SCM_RIGHTS).
package alloc
