package tcp

import (
	"crypto/subtle"
	"fmt"
	"sync"

	"github.com/farmem/farmem/rdma"
)

// MaxFenced is how many fenced segments a Server remembers, the oldest
// forgotten first: 16 Ki of them take about 1 MiB. An operation on a
// segment fenced longer ago than that fails with ErrAccessDenied instead of
// ErrLeaseExpired; it is refused either way.
const MaxFenced = 1 << 14

// fences remembers the keys of fenced and moved-away segments, in a ring,
// with the status an operation naming one with its key gets. Safe for
// concurrent use; operations consult it only when their segment is not
// exported, so the hot path takes no lock.
type fences struct {
	mu   sync.Mutex
	keys map[uint64]fence
	ring []uint64
	next int
}

// fence is a withdrawn segment's key and the status its operations get:
// LEASE_EXPIRED (Fence) or MOVED (MoveAway).
type fence struct {
	key    rdma.Key
	status uint16
}

func (f *fences) add(seg uint64, key rdma.Key, status uint16) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.keys == nil {
		f.keys = make(map[uint64]fence)
		f.ring = make([]uint64, MaxFenced)
	}
	if _, ok := f.keys[seg]; ok {
		f.keys[seg] = fence{key, status}
		return
	}
	if old := f.ring[f.next]; old != 0 {
		delete(f.keys, old)
	}
	f.ring[f.next] = seg
	f.next = (f.next + 1) % len(f.ring)
	f.keys[seg] = fence{key, status}
}

// status is the answer to an operation on seg under key when seg was
// withdrawn under that key (constant-time compare); ok is false when it
// was not.
func (f *fences) status(seg uint64, key rdma.Key) (status uint16, ok bool) {
	f.mu.Lock()
	fc, ok := f.keys[seg]
	f.mu.Unlock()
	if !ok || subtle.ConstantTimeCompare(fc.key[:], key[:]) != 1 {
		return 0, false
	}
	return fc.status, true
}

// forget drops seg, exported again under the same id.
func (f *fences) forget(seg uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.keys[seg]; ok {
		delete(f.keys, seg)
		for i, s := range f.ring {
			if s == seg {
				f.ring[i] = 0
			}
		}
	}
}

// Fence withdraws segment seg as Revoke does (waiting until no operation
// touches its memory) and remembers it: an operation that names seg with
// the key it was exported under then fails with ErrLeaseExpired, not
// ErrAccessDenied, for the next MaxFenced fences. A daemon fences a segment
// whose lease ended or that was freed, so that a client that was
// partitioned or paused past its lease, retrying its writes, learns that
// the memory is no longer its own; it never reaches the memory, which may
// belong to another segment by then.
func (s *Server) Fence(seg uint64) error { return s.withdraw(seg, statusLeaseExpired, "fence") }

// withdraw revokes segment seg and remembers its key with the status
// operations naming it get from now on (what names the caller in errors).
func (s *Server) withdraw(seg uint64, status uint16, what string) error {
	e := s.lookup(seg)
	if e == nil {
		return fmt.Errorf("rdma/tcp: %s segment %d: %w", what, seg, rdma.ErrNotExported)
	}
	// Remembered before the revocation, so an operation never finds the
	// segment neither exported nor withdrawn.
	s.fences.add(seg, e.key, status)
	return s.Revoke(seg)
}
