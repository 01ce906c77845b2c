package tcp

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/rdma"
)

// A segment's move to another home, as the source's data plane serves it
// (docs/MOVE.md has the whole protocol): Track records which chunks
// mutating operations change while the mover copies the segment, Dirty
// hands them over round by round, Seal refuses new writes and atomics
// (MOVED) and waits out those in flight so the last round is final, and
// MoveAway withdraws the segment for good, remembering it so operations
// that name it keep answering MOVED. Unseal abandons a move. ReadLocal
// lets the source read what it pushes to the target itself, sealed or not.

// MinChunk is the smallest chunk Track records changes in.
const MinChunk = 4096

// dirtyMap is a bitmap of changed chunks, one bit a chunk, set by mutating
// operations after they changed memory and taken by Dirty.
type dirtyMap struct {
	shift  uint // log2 of the chunk size
	chunks uint64
	words  []atomic.Uint64
}

// changed marks the chunks of [off, off+n) changed, when a move tracks the
// segment; the caller changed that memory and still pins the export, so a
// Seal waiting for it sees the mark in the next Dirty.
func (e *export) changed(off, n uint64) {
	d := e.dirty.Load()
	if d == nil || n == 0 {
		return
	}
	for c := off >> d.shift; c <= (off+n-1)>>d.shift; c++ {
		d.words[c/64].Or(1 << (c % 64))
	}
}

// readableBy reports whether a sealed export serves reads to principal:
// only the mover's, which copies the last changed chunks.
func (e *export) readableBy(principal string) bool {
	r := e.reader.Load()
	return r != nil && *r == principal
}

// Track starts recording which chunks of segment seg successful WRITE, CAS
// and FADD operations change, chunk bytes each (a power of two, at least
// MinChunk); a Track of a tracked segment starts afresh with no chunk
// marked. Tracking costs a mutating operation one atomic OR a chunk.
func (s *Server) Track(seg uint64, chunk int64) error {
	if chunk < MinChunk || chunk&(chunk-1) != 0 {
		return fmt.Errorf("rdma/tcp: track segment %d in chunks of %d bytes: use a power of two of at least %d", seg, chunk, MinChunk)
	}
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: track segment %d: %w", seg, rdma.ErrNotExported)
	}
	chunks := (uint64(len(e.mem)) + uint64(chunk) - 1) / uint64(chunk)
	e.dirty.Store(&dirtyMap{
		shift:  uint(bits.TrailingZeros64(uint64(chunk))),
		chunks: chunks,
		words:  make([]atomic.Uint64, (chunks+63)/64),
	})
	return nil
}

// Dirty returns the chunks of segment seg changed since Track or the last
// Dirty, as a bitmap (bit i of byte i/8 is chunk i), and how many; it
// clears them. A chunk changed while Dirty runs is in this answer or the
// next.
func (s *Server) Dirty(seg uint64) (bitmap []byte, n int, err error) {
	e := s.lookup(seg)
	if e == nil {
		return nil, 0, fmt.Errorf("rdma/tcp: changed chunks of segment %d: %w", seg, rdma.ErrNotExported)
	}
	d := e.dirty.Load()
	if d == nil {
		return nil, 0, fmt.Errorf("rdma/tcp: changed chunks of segment %d: %w", seg, rdma.ErrNotTracked)
	}
	bitmap = make([]byte, len(d.words)*8)
	for i := range d.words {
		w := d.words[i].Swap(0)
		binary.LittleEndian.PutUint64(bitmap[i*8:], w)
		n += bits.OnesCount64(w)
	}
	return bitmap[:(d.chunks+7)/8], n, nil
}

// Chunk is the chunk size segment seg is tracked in (Track), which the
// bitmaps of Dirty count in.
func (s *Server) Chunk(seg uint64) (int64, error) {
	e := s.lookup(seg)
	if e == nil {
		return 0, fmt.Errorf("rdma/tcp: chunk of segment %d: %w", seg, rdma.ErrNotExported)
	}
	d := e.dirty.Load()
	if d == nil {
		return 0, fmt.Errorf("rdma/tcp: chunk of segment %d: %w", seg, rdma.ErrNotTracked)
	}
	return 1 << d.shift, nil
}

// ReadLocal copies len(dst) bytes of segment seg at off into dst, as its
// memory holds them now, sealed or not: the source of a move reads what
// it pushes to the target this way, in process. A chunk a write changes
// meanwhile is marked for the next Dirty, as for the copy over the
// network. A memory fault of the mapping (SIGBUS) is an error matching
// rdma.ErrSegmentLost, not a crash.
func (s *Server) ReadLocal(seg uint64, off int64, dst []byte) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: read segment %d here: %w", seg, rdma.ErrNotExported)
	}
	e.refs.Add(1) // before the state load, as acquire
	defer e.release()
	switch e.state.Load() {
	case stateLive, stateSealed:
	case stateLost:
		return fmt.Errorf("rdma/tcp: read segment %d here: %w", seg, rdma.ErrSegmentLost)
	default:
		return fmt.Errorf("rdma/tcp: read segment %d here: %w", seg, rdma.ErrNotExported)
	}
	if off < 0 || uint64(off) > uint64(len(e.mem)) || uint64(len(dst)) > uint64(len(e.mem))-uint64(off) {
		return fmt.Errorf("rdma/tcp: read %d bytes of segment %d here at %d: %w", len(dst), seg, off, rdma.ErrOutOfRange)
	}
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	if _, fault := copyGuarded(dst, e.mem[off:]); fault {
		return fmt.Errorf("rdma/tcp: read segment %d here at %d: %w: %w", seg, off, rdma.ErrSegmentLost, errFault)
	}
	return nil
}

// sealInterrupt is how long Seal waits for a WRITE whose payload is still
// arriving before it cuts the connection off (as Revoke does), so that a
// slow or stalled client cannot hold a move's switch-over.
const sealInterrupt = time.Second

// Seal starts a move's switch-over on segment seg: from now on WRITE, CAS
// and FADD on it answer MOVED (not applied), and so do READs by any
// principal but reader, the mover's (ServerConfig.Identify; the empty
// principal without it), which copies the last changed chunks. Seal
// returns once no mutating operation is in flight on seg, so the next
// Dirty is the last. A WRITE whose payload is still arriving after
// sealInterrupt has its connection cut (its client retries and is told
// MOVED). Sealing a sealed segment only waits again.
func (s *Server) Seal(seg uint64, reader string) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: seal segment %d: %w", seg, rdma.ErrNotExported)
	}
	e.reader.Store(&reader)
	e.handover.Store(0)
	if !e.state.CompareAndSwap(stateLive, stateSealed) {
		switch e.state.Load() {
		case stateSealed:
		case stateLost:
			return fmt.Errorf("rdma/tcp: seal segment %d: %w", seg, rdma.ErrSegmentLost)
		default:
			return fmt.Errorf("rdma/tcp: seal segment %d: %w", seg, rdma.ErrNotExported)
		}
	}
	start := time.Now()
	wait := 10 * time.Microsecond
	for e.writers.Load() != 0 {
		if time.Since(start) > sealInterrupt {
			s.interruptStreams(e)
		}
		time.Sleep(wait)
		wait = min(2*wait, time.Millisecond)
	}
	return nil
}

// Unseal abandons a move of segment seg: it serves writes and atomics
// again (if Seal ran) and stops tracking changes.
func (s *Server) Unseal(seg uint64) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: unseal segment %d: %w", seg, rdma.ErrNotExported)
	}
	e.state.CompareAndSwap(stateSealed, stateLive)
	e.handover.Store(0)
	e.dirty.Store(nil)
	return nil
}

// Handover marks the switch-over of sealed segment seg done here: its
// last changes reached the copy that token (rdma.MoveToken) names, and
// operations refused MOVED from now on carry the token in the response's
// value, so that a client told of that copy ahead goes there at once
// rather than asking its daemon. An Unseal, or a new Seal, clears it.
func (s *Server) Handover(seg, token uint64) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: hand over segment %d: %w", seg, rdma.ErrNotExported)
	}
	if e.state.Load() != stateSealed {
		return fmt.Errorf("rdma/tcp: hand over segment %d: %w: it is not sealed; call Seal first", seg, errs.ErrInvalid)
	}
	e.handover.Store(token)
	return nil
}

// MoveAway withdraws segment seg after its move committed elsewhere, as
// Fence does (waiting until no operation touches its memory), and
// remembers it: an operation that names seg with the key it was exported
// under then fails with MOVED, for the next MaxFenced withdrawals, so a
// client that has not yet heard of the move asks where it went.
func (s *Server) MoveAway(seg uint64) error { return s.withdraw(seg, statusMoved, "move away") }

// interruptStreams cuts off the connections streaming a WRITE payload into
// e (see Revoke).
func (s *Server) interruptStreams(e *export) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if c.streaming.Load() == e {
			c.interrupt()
		}
	}
}
