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
// attachment, possibly wrapped in latency emulation (see backend).
type Segment struct {
	c      *Client
	info   *poolv1.Segment // immutable
	size   int64           // info.Size, beside be for the range checks
	be     backend         // how the bytes are reached; never changes
	closed atomic.Bool
}

// newSegment is the segment info describes, reached through be.
func (c *Client) newSegment(info *poolv1.Segment, be backend) *Segment {
	return &Segment{c: c, info: info, size: info.Size, be: be}
}

// ID is the segment's id on its daemon.
func (s *Segment) ID() uint64 { return s.info.Id }

// Name is the segment's name, "" if it has none.
func (s *Segment) Name() string { return s.info.Name }

// Size is the segment's usable size in bytes.
func (s *Segment) Size() int64 { return s.info.Size }

// Tier is the tier the segment was placed on.
func (s *Segment) Tier() Tier { return tierFromProto(s.info.Tier) }

// Emulated is true when the segment's tier stands in for hardware this host
// lacks (an emulated CXL device is ordinary DRAM).
func (s *Segment) Emulated() bool { return s.info.Emulated }

// Kind says what backs the segment: devdax, numa, emulated, dram.
func (s *Segment) Kind() string { return s.info.Kind }

// Device names the device the segment is on.
func (s *Segment) Device() string { return s.info.Device }

// Node names the host whose memory holds the segment: for a segment on
// the rdma tier its home now, which a move changes.
func (s *Segment) Node() string {
	if r, ok := s.base().(*remote); ok {
		return r.plane.Load().node
	}
	return s.info.Node
}

// Injected is the latency emulation applied to the segment's ReadAt,
// WriteAt and atomics (the daemon's --emulate-latency for its tier, or the
// client's WithEmulateLatency); zero for none. It never applies to Bytes.
func (s *Segment) Injected() Injected {
	if e, ok := s.be.(*emulated); ok {
		return Injected(e.in.Target())
	}
	return Injected{}
}

// Bytes returns the segment's memory for direct loads and stores on
// load/store tiers (local, cxl), and false on tiers reached over a network.
// The slice is valid only until Free or Client.Close; touching it after
// that faults. A fault in the memory itself (a poisoned CXL line) is
// the caller's to guard (see runtime/debug.SetPanicOnFault). Latency
// emulation cannot slow direct access through this slice.
func (s *Segment) Bytes() ([]byte, bool) {
	if s.closed.Load() {
		return nil, false
	}
	mem := s.be.bytes()
	return mem, mem != nil
}

func (s *Segment) errClosed() error { return fmt.Errorf("segment %d: %w", s.info.Id, ErrClosed) }

// ReadAt implements io.ReaderAt: it reads len(p) bytes at off, returning
// io.EOF with a short count at the end of the segment. With latency
// emulation on the segment's tier the call takes the injected latency plus
// len(p)/bandwidth (see WithEmulateLatency).
func (s *Segment) ReadAt(p []byte, off int64) (int, error) {
	if s.closed.Load() {
		return 0, s.errClosed()
	}
	if off < 0 || off > s.size {
		return 0, fmt.Errorf("read at %d of segment %d (size %d): %w", off, s.info.Id, s.size, ErrOutOfRange)
	}
	if int64(len(p)) > s.size-off {
		n, err := s.be.readAt(p[:s.size-off], off)
		if err == nil {
			err = io.EOF
		}
		return n, err
	}
	switch b := s.be.(type) { // direct calls on the hot paths: see mapped
	case *mapped:
		return b.readAt(p, off)
	case *guarded:
		return b.readAt(p, off)
	}
	return s.be.readAt(p, off)
}

// WriteAt implements io.WriterAt. A write that would run past the end of
// the segment writes nothing and returns ErrOutOfRange. Latency emulation
// applies as to ReadAt.
func (s *Segment) WriteAt(p []byte, off int64) (int, error) {
	if s.closed.Load() {
		return 0, s.errClosed()
	}
	if off < 0 || off > s.size || int64(len(p)) > s.size-off {
		return 0, fmt.Errorf("write of %d bytes at %d of segment %d (size %d): %w", len(p), off, s.info.Id, s.size, ErrOutOfRange)
	}
	switch b := s.be.(type) { // direct calls on the hot paths: see mapped
	case *mapped:
		return b.writeAt(p, off)
	case *guarded:
		return b.writeAt(p, off)
	}
	return s.be.writeAt(p, off)
}

// checkWord checks an atomic's offset.
func (s *Segment) checkWord(off int64) error {
	if s.closed.Load() {
		return s.errClosed()
	}
	if off < 0 || off > s.size-8 {
		return fmt.Errorf("atomic at %d of segment %d (size %d): %w", off, s.info.Id, s.size, ErrOutOfRange)
	}
	if off%8 != 0 {
		return fmt.Errorf("atomic at %d of segment %d: %w", off, s.info.Id, ErrUnaligned)
	}
	return nil
}

// Load64 atomically loads the 8-byte word at off (a multiple of 8). Latency
// emulation applies to the atomics as to ReadAt, with a size of 8 bytes.
func (s *Segment) Load64(off int64) (uint64, error) {
	if err := s.checkWord(off); err != nil {
		return 0, err
	}
	return s.be.load64(off)
}

// Store64 atomically stores v at off (a multiple of 8).
func (s *Segment) Store64(off int64, v uint64) error {
	if err := s.checkWord(off); err != nil {
		return err
	}
	return s.be.store64(off, v)
}

// CompareAndSwap64 atomically replaces the word at off with new if it
// holds old, reporting whether it did.
func (s *Segment) CompareAndSwap64(off int64, old, new uint64) (bool, error) {
	if err := s.checkWord(off); err != nil {
		return false, err
	}
	return s.be.compareAndSwap64(off, old, new)
}

// Add64 atomically adds delta to the word at off and returns the new value.
func (s *Segment) Add64(off int64, delta uint64) (uint64, error) {
	if err := s.checkWord(off); err != nil {
		return 0, err
	}
	return s.be.add64(off, delta)
}

// Free unmaps the segment and releases it on the daemon, for everyone:
// the memory returns to the pool and the name (if any) is gone. That holds
// for a segment this client attached (Attach) as for one it allocated,
// when it may free it (see Client.Attach; else ErrAccessDenied), so an
// attacher that means only to stop using a segment calls Close instead.
// Calls on the segment then return ErrClosed; a slice from Bytes must not
// be used. Freeing twice, or after Close, returns ErrClosed. A shared
// attachment is detached first (its modified pages written back), then the
// segment freed for every sharer.
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
	if !s.closed.CompareAndSwap(false, true) {
		return false, nil
	}
	return true, s.be.retire(ctx)
}

// retireGrace is how long a retired mapping's address range stays
// reserved (inaccessible) before it is unmapped, so that a call that
// passed the closed check just before Free faults into an error instead of
// reading memory that a later mapping placed at the same address.
const retireGrace = time.Second
