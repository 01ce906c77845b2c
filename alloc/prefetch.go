package alloc

import (
	"fmt"
	"sync/atomic"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/mmap"
)

// Prefetch hints that the n bytes at off will be read soon. It returns at
// once; the bytes are not guaranteed to be fetched, and a later ReadAt is
// correct either way:
//
//   - load/store tiers (local, cxl): the kernel is asked to page the range
//     in (madvise MADV_WILLNEED); memory already resident is unaffected.
//   - rdma tier, on a segment this client holds alone (see below): the
//     range is read from the home in the background, in pieces of at most
//     1 MiB, into a buffer of the client's, and a ReadAt that the buffer
//     covers is served from it (waiting for the piece if it is still on
//     its way). At most 16 MiB per segment is held ahead; a longer range is
//     fetched up to that much, the oldest pieces dropped first.
//   - rdma segments not held alone and shared attachments: nothing (a
//     shared attachment's page cache is kept coherent by its protocol).
//
// A segment is held alone when this client allocated it with Alloc and
// without a name (WithName), so no other client can attach it. Only there
// is reading ahead safe: the client sees its own writes and atomics and
// drops what it read ahead of the bytes they touch, but a write from
// another client would go unseen. The same rule turns on the client's
// read-ahead detector: on such a segment, ReadAt calls that walk the
// segment sequentially (each starting where the last ended) or with a
// constant stride are read ahead by themselves, in a window that starts
// at 256 KiB and doubles while the stream uses it, up to 4 MiB (four
// reads of 1 MiB in flight); an access off the pattern stops it, and
// accesses larger than 1 MiB are left alone (they stream by themselves).
// One stream per segment is followed: goroutines reading different parts
// of one segment look random to it, and can call Prefetch themselves.
// Client.Stats counts the hits and the bytes read ahead in vain.
//
// Bad input is refused as ReadAt's is: ErrClosed on a closed segment,
// ErrOutOfRange for a negative off or a range that runs past the end
// (nothing is fetched), ErrInvalid for n ≤ 0. Safe for concurrent use.
func (s *Segment) Prefetch(off, n int64) error {
	if s.closedNow() {
		return s.errClosed()
	}
	if n <= 0 {
		return fmt.Errorf("prefetch of %d bytes at %d of segment %d: give a length of at least 1 byte: %w", n, off, s.info.Id, ErrInvalid)
	}
	if off < 0 || off > s.size || n > s.size-off {
		return fmt.Errorf("prefetch of %d bytes at %d of segment %d (size %d): %w", n, off, s.info.Id, s.size, ErrOutOfRange)
	}
	be, err := s.use()
	if err != nil {
		return err
	}
	be.prefetch(off, n)
	s.done()
	return nil
}

// ClientStats are a client's counters since Dial. A plain value.
type ClientStats struct {
	// PrefetchHits counts the ReadAt calls on rdma segments that were
	// served from bytes read ahead (by Prefetch or the read-ahead
	// detector), PrefetchHitBytes the bytes they returned.
	PrefetchHits     int64
	PrefetchHitBytes int64
	// PrefetchMisses counts the ReadAt calls on segments that read ahead
	// (those this client holds alone, see Segment.Prefetch) that went to
	// the home instead.
	PrefetchMisses int64
	// PrefetchStreams counts the sequential or strided streams the
	// read-ahead detector found.
	PrefetchStreams int64
	// PrefetchedBytes counts the bytes read ahead from homes;
	// PrefetchWastedBytes those of them dropped before any ReadAt used
	// them: pushed out by newer read-ahead, overwritten by this client,
	// read ahead of a stream that stopped, or held when the segment closed.
	PrefetchedBytes     int64
	PrefetchWastedBytes int64
	// DataConnects counts the data-plane connections the client opened
	// to the homes of its rdma segments (each one handshake, over TLS
	// where the home serves it); MovePreconnects those of them it opened
	// ahead of a live move, to a segment's new home before the
	// switch-over, on its daemon's notice (docs/MOVE.md, "Clients").
	DataConnects    int64
	MovePreconnects int64
	// MoveHandovers counts the operations that, refused MOVED by a
	// segment's old home once its switch-over was done there, went
	// straight to the copy the daemon had told of ahead, without asking
	// the daemon (docs/MOVE.md, "Clients").
	MoveHandovers int64
}

// Stats returns the client's counters. Safe for concurrent use.
func (c *Client) Stats() ClientStats {
	p := &c.prefetch
	return ClientStats{
		PrefetchHits:        p.hits.Load(),
		PrefetchHitBytes:    p.hitBytes.Load(),
		PrefetchMisses:      p.misses.Load(),
		PrefetchStreams:     p.streams.Load(),
		PrefetchedBytes:     p.fetched.Load(),
		PrefetchWastedBytes: p.wasted.Load(),
		DataConnects:        c.dials.Load(),
		MovePreconnects:     c.pre.made.Load(),
		MoveHandovers:       c.pre.handovers.Load(),
	}
}

// prefetchCounters are the client's read-ahead counters (ClientStats).
type prefetchCounters struct {
	hits, hitBytes, misses, streams, fetched, wasted atomic.Int64
}

// The backends' prefetch hints. Only readahead reads ahead over the
// network; a remote segment that is not held alone, and a shared
// attachment, take no hint.

func (m *mapped) prefetch(off, n int64) { mmap.WillNeed(m.mem[off : off+n]) }

func (r *remote) prefetch(int64, int64) {}

func (b sharedBackend) prefetch(int64, int64) {}

func (e *emulated) prefetch(off, n int64) { e.next.prefetch(off, n) }

// heldAlone reports whether Alloc's segment described by info can be
// reached by no other client, so that this client's read-ahead of it
// stays coherent: no name to attach it by, and no attacher.
func heldAlone(info *poolv1.Segment) bool {
	return info.Name == "" && len(info.Attached) == 0
}

// WithReadAhead turns the read-ahead of rdma segments that the client
// holds alone (its detector and Segment.Prefetch; see there) on or off.
// Off, ReadAt always goes to the home and Prefetch on the rdma tier does
// nothing. Default: on.
func WithReadAhead(on bool) DialOption {
	return func(o *dialOptions) { o.noReadAhead = !on }
}
