package alloc

import "context"

// backend is how a Segment reaches its bytes. There are three, one per way
// memory is reached, and a decorator:
//
//   - mapped: load/store memory mapped into this process (local DRAM, CXL,
//     emulated CXL); calls are copies and CPU atomics on the mapping, and
//     guarded is the same for memory that can fault, whose copies turn a
//     fault into an error.
//   - remote: an rdma segment, reached with one-sided operations on its
//     home's data plane (rdma.Conn), retried across redials.
//   - sharedBackend: a coherent shared attachment (Attach with Shared),
//     whose pages are cached here under the coherence protocol, carried as
//     messages on the rdma transport.
//   - readahead wraps the remote backend of a segment this client holds
//     alone with read-ahead (see Segment.Prefetch).
//   - emulated wraps any of them with injected latency (the "emulated"
//     figures of a tier, WithEmulateLatency).
//
// Segment makes the checks common to every backend before it calls one:
// the segment is not closed, the bytes lie within the segment (ReadAt
// passes only the part of p that does, and adds io.EOF itself; a batch is
// checked whole, see ReadBatch), and an
// atomic's offset is within it and a multiple of 8. A backend's methods
// trust their arguments. Implementations are safe for concurrent use.
type backend interface {
	// readAt fills p, which lies within the segment, from off, returning
	// how many bytes it read before an error.
	readAt(p []byte, off int64) (int, error)
	// writeAt stores p, which lies within the segment, at off, returning
	// how many bytes it wrote before an error.
	writeAt(p []byte, off int64) (int, error)
	// readBatch and writeBatch do every span of a batch, each of which lies
	// within the segment, the spans of a write not overlapping; nil means
	// all were done.
	readBatch(ctx context.Context, spans []Span) error
	writeBatch(ctx context.Context, spans []Span) error
	// load64, store64, compareAndSwap64 and add64 are the 64-bit atomics
	// on the word at off; add64 returns the new value.
	load64(off int64) (uint64, error)
	store64(off int64, v uint64) error
	compareAndSwap64(off int64, old, new uint64) (bool, error)
	add64(off int64, delta uint64) (uint64, error)
	// prefetch is Segment.Prefetch's hint for [off, off+n), which lies
	// within the segment; it does not wait for the bytes.
	prefetch(off, n int64)
	// bytes is the memory for direct loads and stores, nil when the backend
	// reaches it over a network.
	bytes() []byte
	// retire ends the backend's use of the memory when the segment is freed
	// or closed (once; calls that raced it fail rather than fault), handing
	// back within ctx whatever it holds for the home.
	retire(ctx context.Context) error
}

// base is the segment's backend without its latency emulation and
// read-ahead.
func (s *Segment) base() backend {
	be := s.backend()
	if e, ok := be.(*emulated); ok {
		be = e.next
	}
	if ra, ok := be.(*readahead); ok {
		return ra.r
	}
	return be
}
