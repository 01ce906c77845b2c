package dialer

import (
	"fmt"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// The steps of moving a segment away from this host (tcp.Server.Track,
// Chunk, Dirty, ReadLocal, Seal, Unseal, MoveAway). Only the tcp transport sees the writes it
// serves: a verbs peer writes registered memory without this host's CPU, so
// a segment cannot be tracked while the verbs transport serves, and Track
// refuses with an error matching rdma.ErrNotSupported.

// Track starts recording which chunks of chunk bytes writes and atomics
// change on the segment.
func (s *Server) Track(seg uint64, chunk int64) error {
	if s.verbs != nil {
		return fmt.Errorf("rdma/dialer: track writes to segment %d: %w: verbs peers write it without this host's CPU (%s)", seg, rdma.ErrNotSupported, s.reason)
	}
	return s.tcp.Track(seg, chunk)
}

// Dirty returns the chunks changed since Track or the last Dirty, as a
// bitmap (bit i of byte i/8 is chunk i), and how many; it clears them.
func (s *Server) Dirty(seg uint64) ([]byte, int, error) { return s.tcp.Dirty(seg) }

// Chunk is the chunk size the segment is tracked in.
func (s *Server) Chunk(seg uint64) (int64, error) { return s.tcp.Chunk(seg) }

// ReadLocal copies bytes of the segment at off into dst, sealed or not:
// a move's source reads what it pushes to the target.
func (s *Server) ReadLocal(seg uint64, off int64, dst []byte) error {
	return s.tcp.ReadLocal(seg, off, dst)
}

// Seal refuses new operations on the segment with rdma.ErrMoved, reads by
// reader (the mover's principal) excepted, and waits until no write or
// atomic is in flight.
func (s *Server) Seal(seg uint64, reader string) error { return s.tcp.Seal(seg, reader) }

// Unseal undoes Seal and stops tracking.
func (s *Server) Unseal(seg uint64) error { return s.tcp.Unseal(seg) }

// Handover marks a sealed segment's switch-over done: its MOVED answers
// carry token (see tcp.Server.Handover).
func (s *Server) Handover(seg, token uint64) error { return s.tcp.Handover(seg, token) }

// MoveAway withdraws the segment as Fence does, and every later operation
// naming it with its key answers rdma.ErrMoved.
func (s *Server) MoveAway(seg uint64) error { return s.tcp.MoveAway(seg) }

// Forward sets how the segment forwards its writes and atomics to its
// copies or parity shards (see tcp.Server.Forward); nil stops forwarding.
// Only the tcp transport sees the writes it serves, so forwarding is
// refused with an error matching rdma.ErrNotSupported while verbs serves,
// as Track is.
func (s *Server) Forward(seg uint64, f *tcp.Forwarding) error {
	if s.verbs != nil && f != nil {
		return fmt.Errorf("rdma/dialer: forward writes to segment %d: %w: verbs peers write it without this host's CPU (%s)", seg, rdma.ErrNotSupported, s.reason)
	}
	return s.tcp.Forward(seg, f)
}

// StopForward stops the segment's forwarding and returns the wait for its
// ops in flight (see tcp.Server.StopForward).
func (s *Server) StopForward(seg uint64) (wait func(), err error) { return s.tcp.StopForward(seg) }

// AllowReaders sets who may only read the segment over the tcp transport
// (see tcp.Server.AllowReaders). Verbs peers are guarded by the segment's
// rkey alone, as with Allow.
func (s *Server) AllowReaders(seg uint64, principals []string) error {
	return s.tcp.AllowReaders(seg, principals)
}
