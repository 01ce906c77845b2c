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
// # How a Segment reaches its memory
//
// Every call on a Segment is checked the same way first: a closed (freed)
// segment returns ErrClosed, bytes outside Size ErrOutOfRange (a ReadAt
// that runs past the end reads what is there and returns io.EOF), an
// atomic at an offset that is not a multiple of 8 ErrUnaligned. The call
// then goes to the segment's backend, chosen by its tier and how it was
// attached:
//
//   - Mapped (TierLocal, TierCXL): the segment is mapped into the
//     application's address space from a file descriptor the daemon passes
//     over its unix socket (internal/mmap), so reads and writes never go
//     through the daemon. ReadAt and WriteAt are copies, the atomics the
//     CPU's; on memory that can fault (real CXL, a file on a disk) a copy
//     turns a fault (a truncated backing file, a poisoned CXL line) into
//     ErrSegmentLost. Bytes returns the mapping itself; a slice from it is
//     the application's to guard. Free and Close retire the mapping: a
//     call that raced them fails rather than touch memory reused since.
//     Client.Move with ToTier(TierRDMA) demotes the segment: its calls
//     wait while the mapping is given up and the daemon copies it to an
//     rdma home, then go there (the backend is replaced; see tiermove.go
//     for how calls pin it or run again), and promotes an rdma segment
//     back into a mapping.
//   - Remote (TierRDMA): one-sided reads, writes and atomics on the home's
//     data plane, over a connection per home that rdma/dialer dials (verbs
//     where this build and host have an RDMA device, else tcp), retried as
//     described below. Bytes returns false. Client.Move moves the segment
//     to another home while it is in use; an operation its old home
//     answers MOVED asks the daemon where the segment is and runs there.
//     On the daemon's notices the client connects to a moving segment's
//     new home before the switch-over, on a goroutine of its own (one per
//     address at a time, ended by Close), and takes the new home from the
//     daemon at the switch-over (preconnect.go).
//   - Redundant (TierRDMA with WithRedundancy): the same one-sided
//     operations on several homes, each holding a copy or a shard. Copies:
//     writes and atomics go to the primary, which forwards them to the
//     others before it answers; reads go to the primary and fail over to
//     another copy when it fails or does not answer within
//     WithFailoverTimeout. Shards: a range is cut at 4 KiB chunk
//     boundaries and each data shard's pieces go to its home, the shards
//     in parallel; a lost shard's bytes are decoded from k others
//     (Reed–Solomon). Every home sees one exactly-once session of the
//     client, so a write retried at a promoted primary is answered from
//     the reply cache the old primary's forwarding filled, not applied
//     twice.
//   - Shared (Attach with Shared, an rdma segment): the attachment's cache,
//     kept coherent by package coherence, whose messages travel as
//     rdma.Conn messages on three connections to the home dialed through
//     rdma/dialer, so either transport carries them. Bytes returns false;
//     Free and Close detach first, writing modified pages back.
//
// Latency emulation (poold --emulate-latency, or WithEmulateLatency for one
// client) wraps the mapped or remote backend of a segment on an emulated
// tier (not a shared attachment): ReadAt, WriteAt and the 64-bit atomics
// take a target latency plus size/bandwidth, e.g. CXL at 200 ns or RDMA at
// 2 µs on a host with neither, calibrated so the whole call takes the
// target; calls the checks refuse return at once. Direct loads and stores
// through Bytes cannot be slowed: code that uses Bytes runs at the speed of
// the real memory behind it, and a program that wants to see emulated
// costs must go through ReadAt/WriteAt. Injected latency is always reported
// as "injected" (TierInfo, Segment.Injected), never as a measurement.
//
// ReadBatch and WriteBatch move many ranges (Spans) in one call, checked
// whole before any is done: copies on the mapped backend, the ops posted
// together on one connection (rdma.Conn.Do) on the remote one, span by
// span on a shared attachment; emulation applies once per batch.
//
// Prefetch hints a range ahead of need: madvise(WILLNEED) on the mapped
// backend; on a remote segment this client holds alone (allocated without
// a name, so no other client can write it), a background read into the
// client's buffer, which ReadAt serves from. The same buffer serves a
// detector of sequential and strided ReadAt streams on such segments; the
// client's own writes and atomics drop what they touch. Client.Stats
// counts its hits and wasted bytes.
//
// # Retries on remote segments
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
// # Concurrency, errors, OS
//
// Client and Segment are safe for concurrent use; an operation on a remote
// segment takes no client-wide lock unless it has to (re)dial. A slice
// returned by Segment.Bytes is valid until the segment is freed or the
// client closed; using it after that is a use-after-free.
//
// Errors are farmem's sentinels (ErrNoCapacity, ErrOutOfRange, ...), tested
// with errors.Is; the daemon's message, saying what to do, is kept.
//
// Needs Linux for local segments (memfd, mmap, SCM_RIGHTS).
package alloc
