package alloc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// Segment is one far-memory allocation. It is safe for concurrent use:
// ReadAt, WriteAt and the atomics may run in parallel with each other (and
// with Free and Close, which make them fail with ErrClosed rather than
// crash).
// Concurrent writes to overlapping bytes race as they would in any memory;
// use the 64-bit atomics to coordinate.
//
// A Segment makes the checks every kind of segment shares (closed, offset
// and length within the segment, an atomic's alignment) and hands the
// access to its backend: mapped memory, a remote home, or a shared
// attachment, possibly wrapped in latency emulation (see backend). A call
// pins the backend while it runs (use), or, ReadAt and WriteAt, runs again
// when a switch began meanwhile, so that Client.Move can replace the
// backend when the segment changes tier (tiermove.go).
type Segment struct {
	c    *Client
	info *poolv1.Segment // immutable: the segment as opened
	size int64           // info.Size, beside be for the range checks
	// be is how the bytes are reached; replaced only by a move to another
	// tier, while no call has it pinned. A call that pins it reads pinned,
	// the same backend, which costs no atomic load; the others load be.
	be     atomic.Pointer[backendRef]
	pinned backend
	// desc is the segment as it is now: its tier, kind and device change
	// with a move to another tier.
	desc atomic.Pointer[poolv1.Segment]
	// state is segOpen, segSwitching (a move to another tier replaces be;
	// calls wait) or segClosed in its low bits (stateMask); above them, to
	// switchMask, how many switches began: ReadAt and WriteAt run again
	// when it changed while they ran (see ReadAt); in the high 32 bits how
	// many calls have be pinned (use), so that one atomic add both pins
	// and reads the state.
	state atomic.Uint64
	// switching is closed when the tier switch under way ends; nil when
	// none is.
	switching atomic.Pointer[chan struct{}]
	// reclaimed: the daemon said it reclaimed the segment when the
	// client's lease ran out (setReclaimed); no notice undoes it.
	reclaimed atomic.Bool
}

// The states of a Segment (Segment.state&stateMask), the unit of its
// switch count, the bits of both, and the unit of its pins.
const (
	segOpen uint64 = iota
	segSwitching
	segClosed
	stateMask   = 3
	switchCount = 4
	switchMask  = 1<<32 - 1
	pin         = 1 << 32
	unpin       = ^uint64(pin - 1) // -pin
)

// closedNow reports whether the segment was closed or freed.
func (s *Segment) closedNow() bool { return s.state.Load()&stateMask == segClosed }

// backendRef holds a backend for an atomic pointer.
type backendRef struct{ backend }

// newSegment is the segment info describes, reached through be.
func (c *Client) newSegment(info *poolv1.Segment, be backend) *Segment {
	s := &Segment{c: c, info: info, size: info.Size}
	s.setBackend(be)
	s.desc.Store(info)
	return s
}

// setBackend makes be the segment's backend: when it is new, or while no
// call has the old one pinned (Segment.hold).
func (s *Segment) setBackend(be backend) {
	s.pinned = be
	s.be.Store(&backendRef{be})
}

// backend is the segment's backend now, not pinned: for a look at what
// reaches the segment, not for a call that touches its memory (use).
func (s *Segment) backend() backend { return s.be.Load().backend }

// use pins the segment's backend for one call, waiting while a move to
// another tier replaces it; done unpins it. A move replaces the backend
// only while no call has it pinned, so that no write lands in memory the
// segment has left.
func (s *Segment) use() (backend, error) {
	for {
		st := s.state.Add(pin) & stateMask
		if st == segOpen {
			return s.pinned, nil
		}
		s.state.Add(unpin)
		if st == segClosed {
			return nil, s.errClosed()
		}
		s.awaitSwitch()
	}
}

// done unpins the backend a call pinned with use.
func (s *Segment) done() { s.state.Add(unpin) }

// setState moves the segment to state st, raising the switch count with
// raise, when it is in state from; false when it is not.
func (s *Segment) setState(from, st uint64, raise bool) bool {
	for {
		v := s.state.Load()
		if v&stateMask != from {
			return false
		}
		next := v&^stateMask | st
		if raise {
			next = v&^switchMask | (v+switchCount)&switchMask&^stateMask | st
		}
		if s.state.CompareAndSwap(v, next) {
			return true
		}
	}
}

// again reports whether a call that failed with err runs again: its
// backend refused it, not applied, because the segment moved to another
// tier under it, and this client's Move is switching the segment over
// (which again waits for).
func (s *Segment) again(err error) bool {
	return errors.Is(err, errTierMoved) && s.awaitSwitch()
}

// ID is the segment's id on its daemon.
func (s *Segment) ID() uint64 { return s.info.Id }

// Name is the segment's name, "" if it has none.
func (s *Segment) Name() string { return s.info.Name }

// Size is the segment's usable size in bytes: what Alloc asked for, but
// for an ErasureCoded(k, m) segment rounded up to whole stripes of k
// chunks of 4 KiB (every byte of it usable).
func (s *Segment) Size() int64 { return s.info.Size }

// Tier is the tier the segment was placed on.
func (s *Segment) Tier() Tier { return tierFromProto(s.desc.Load().Tier) }

// Emulated is true when the segment's tier stands in for hardware this host
// lacks (an emulated CXL device is ordinary DRAM).
func (s *Segment) Emulated() bool { return s.desc.Load().Emulated }

// Kind says what backs the segment: devdax, numa, emulated, dram.
func (s *Segment) Kind() string { return s.desc.Load().Kind }

// Device names the device the segment is on.
func (s *Segment) Device() string { return s.desc.Load().Device }

// Node names the host whose memory holds the segment: for a segment on
// the rdma tier its home now, which a move changes; for a redundant one
// the home of its primary copy (or of its first data shard), as this
// client last learned it (see Redundancy for every home).
func (s *Segment) Node() string {
	switch r := s.base().(type) {
	case *remote:
		return r.plane.Load().node
	case *redundant:
		v := r.view.Load()
		return v.homes[v.primary].plane.node
	}
	return s.desc.Load().Node
}

// Injected is the latency emulation applied to the segment's ReadAt,
// WriteAt and atomics (the daemon's --emulate-latency for its tier, or the
// client's WithEmulateLatency); zero for none. It never applies to Bytes.
func (s *Segment) Injected() Injected {
	if e, ok := s.backend().(*emulated); ok {
		return Injected(e.in.Target())
	}
	return Injected{}
}

// Bytes returns the segment's memory for direct loads and stores on
// load/store tiers (local, cxl), and false on tiers reached over a network.
// The slice is valid only until Free, Close, Client.Close or a Client.Move
// of the segment to the rdma tier (after which Bytes returns false);
// touching it after that faults, or writes memory the segment left. A
// fault in the memory itself (a poisoned CXL line) is the caller's to
// guard (see runtime/debug.SetPanicOnFault). Latency emulation cannot
// slow direct access through this slice.
func (s *Segment) Bytes() ([]byte, bool) {
	be, err := s.use()
	if err != nil {
		return nil, false
	}
	mem := be.bytes()
	s.done()
	return mem, mem != nil
}

func (s *Segment) errClosed() error { return fmt.Errorf("segment %d: %w", s.info.Id, ErrClosed) }

// ReadAt implements io.ReaderAt: it reads len(p) bytes at off, returning
// io.EOF with a short count at the end of the segment. With latency
// emulation on the segment's tier the call takes the injected latency plus
// len(p)/bandwidth (see WithEmulateLatency).
//
// ReadAt and WriteAt do not pin the backend (use), which would cost more
// than their copy: they note the segment's state before and after, and
// run again when a move to another tier began meanwhile (its mover
// raises the switch count, then waits for a barrier on every thread, so
// that a copy that saw no switch is in the memory the move copies).
func (s *Segment) ReadAt(p []byte, off int64) (int, error) {
	v := s.state.Load()
	if v&stateMask != segOpen {
		if v&stateMask == segClosed {
			return 0, s.errClosed()
		}
		s.awaitSwitch()
		return s.ReadAt(p, off)
	}
	if off < 0 || off > s.size {
		return 0, fmt.Errorf("read at %d of segment %d (size %d): %w", off, s.info.Id, s.size, ErrOutOfRange)
	}
	n, err := readAt(s.be.Load().backend, p, off, s.size)
	if (s.state.Load()^v)&switchMask != 0 || err != nil && s.again(err) {
		return s.ReadAt(p, off)
	}
	return n, err
}

// readAt is ReadAt on be, off within the segment of size bytes.
func readAt(be backend, p []byte, off, size int64) (int, error) {
	if int64(len(p)) > size-off {
		n, err := be.readAt(p[:size-off], off)
		if err == nil {
			err = io.EOF
		}
		return n, err
	}
	switch b := be.(type) { // direct calls on the hot paths: see mapped
	case *mapped:
		return b.readAt(p, off)
	case *guarded:
		return b.readAt(p, off)
	}
	return be.readAt(p, off)
}

// WriteAt implements io.WriterAt. A write that would run past the end of
// the segment writes nothing and returns ErrOutOfRange. Latency emulation
// applies as to ReadAt.
func (s *Segment) WriteAt(p []byte, off int64) (int, error) {
	v := s.state.Load()
	if v&stateMask != segOpen {
		if v&stateMask == segClosed {
			return 0, s.errClosed()
		}
		s.awaitSwitch()
		return s.WriteAt(p, off)
	}
	if off < 0 || off > s.size || int64(len(p)) > s.size-off {
		return 0, fmt.Errorf("write of %d bytes at %d of segment %d (size %d): %w", len(p), off, s.info.Id, s.size, ErrOutOfRange)
	}
	var n int
	var err error
	switch b := s.be.Load().backend.(type) { // direct calls on the hot paths: see mapped
	case *mapped:
		n, err = b.writeAt(p, off)
	case *guarded:
		n, err = b.writeAt(p, off)
	default:
		n, err = b.writeAt(p, off)
	}
	if (s.state.Load()^v)&switchMask != 0 || err != nil && s.again(err) {
		// A move to another tier began: the bytes may have landed in
		// memory the segment left, and go to where it is now. Or the
		// home refused a frame, not applied, as the segment moved: the
		// frames before it were, and writing them again stores the same
		// bytes.
		return s.WriteAt(p, off)
	}
	return n, err
}

// word checks an atomic's offset and pins the backend for it (done
// unpins it).
func (s *Segment) word(off int64) (backend, error) {
	be, err := s.use() // first: a closed segment is ErrClosed whatever off is
	switch {
	case err != nil:
		return nil, err
	case off < 0 || off > s.size-8:
		err = fmt.Errorf("atomic at %d of segment %d (size %d): %w", off, s.info.Id, s.size, ErrOutOfRange)
	case off%8 != 0:
		err = fmt.Errorf("atomic at %d of segment %d: %w", off, s.info.Id, ErrUnaligned)
	default:
		return be, nil
	}
	s.done()
	return nil, err
}

// Load64 atomically loads the 8-byte word at off (a multiple of 8). Latency
// emulation applies to the atomics as to ReadAt, with a size of 8 bytes.
//
// The atomics pin the backend (use): one that the segment's move to
// another tier refused, not applied, runs again where it is now.
func (s *Segment) Load64(off int64) (uint64, error) {
	be, err := s.word(off)
	if err != nil {
		return 0, err
	}
	v, err := be.load64(off)
	s.done()
	if err != nil && s.again(err) {
		return s.Load64(off)
	}
	return v, err
}

// Store64 atomically stores v at off (a multiple of 8).
func (s *Segment) Store64(off int64, v uint64) error {
	be, err := s.word(off)
	if err != nil {
		return err
	}
	err = be.store64(off, v)
	s.done()
	if err != nil && s.again(err) {
		return s.Store64(off, v)
	}
	return err
}

// CompareAndSwap64 atomically replaces the word at off with new if it
// holds old, reporting whether it did.
func (s *Segment) CompareAndSwap64(off int64, old, new uint64) (bool, error) {
	be, err := s.word(off)
	if err != nil {
		return false, err
	}
	swapped, err := be.compareAndSwap64(off, old, new)
	s.done()
	if err != nil && s.again(err) {
		return s.CompareAndSwap64(off, old, new)
	}
	return swapped, err
}

// Add64 atomically adds delta to the word at off and returns the new value.
func (s *Segment) Add64(off int64, delta uint64) (uint64, error) {
	be, err := s.word(off)
	if err != nil {
		return 0, err
	}
	v, err := be.add64(off, delta)
	s.done()
	if err != nil && s.again(err) {
		return s.Add64(off, delta)
	}
	return v, err
}

// Free unmaps the segment and releases it on the daemon, for everyone:
// the memory returns to the pool and the name (if any) is gone. That holds
// for a segment this client attached (Attach) as for one it allocated,
// when it may free it (see Client.Attach; else ErrAccessDenied), so an
// attacher that means only to stop using a segment calls Close instead.
// Calls on the segment then return ErrClosed; a slice from Bytes must not
// be used. Freeing twice, or after Close, returns ErrClosed. A shared
// attachment is detached first (its modified pages written back), then the
// segment freed for every sharer. A segment the daemon reclaimed when the
// client's lease ran out (its calls answer ErrLeaseExpired) is only
// unmapped: its memory went back to the pool then.
func (s *Segment) Free(ctx context.Context) error {
	ok, derr := s.retire(ctx)
	if !ok {
		return s.errClosed()
	}
	return errors.Join(derr, s.c.free(ctx, s))
}

// Close lets go of the segment without freeing it: it unmaps the segment
// in this process and, for a segment this client attached by name, gives
// the attachment up on the daemon, so that this client can no longer map
// or free it; the segment and its bytes stay for its owner and other
// attachers. On a segment this client allocated, Close unmaps it and
// leaves it to its lifetime: a named or persistent segment stays until
// freed, an unnamed one until the client's session ends (reopen it with
// Client.Open meanwhile). A shared attachment is detached first, its
// modified pages written back.
//
// Afterwards every call on the segment returns ErrClosed, also one that
// runs concurrently with Close (it never faults), and a slice from Bytes
// must not be used. Close is idempotent: a second Close, or Close after
// Free, returns nil. It waits up to the client's WithTimeout for the daemon.
func (s *Segment) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), s.c.opts.timeout)
	defer cancel()
	ok, derr := s.retire(ctx)
	if !ok {
		return nil
	}
	return errors.Join(derr, s.c.detach(ctx, s))
}

// retire marks the segment closed and unmaps it without freeing it; ok is
// false when it was closed already. What a shared attachment cannot hand
// back within ctx is lost, as on a crash, and reported in err.
func (s *Segment) retire(ctx context.Context) (ok bool, err error) {
	for !s.setState(segOpen, segClosed, false) {
		if s.closedNow() {
			return false, nil
		}
		s.awaitSwitch() // a move to another tier: its end decides
	}
	return true, s.backend().retire(ctx)
}

// retireGrace is how long a retired mapping's address range stays
// reserved (inaccessible) before it is unmapped, so that a call that
// passed the closed check just before Free faults into an error instead of
// reading memory that a later mapping placed at the same address.
const retireGrace = time.Second
