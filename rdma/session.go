package rdma

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
)

// SessionSlots is how many exactly-once operations one Session keeps in
// flight to one server, and how many replies the server caches for it: a
// slot holds one operation until its answer is known, and the server keeps
// the last answer of each slot (the slot table of an NFSv4.1 session).
const SessionSlots = 128

// Session is a client's exactly-once state towards one server: a random id
// that outlives connections, and a table of SessionSlots slots, each with
// the sequence number of its current operation. A WRITE, CAS or FADD posted
// with a Ticket names its slot and sequence number; when the connection
// breaks and the caller posts it again with the same Ticket on a new
// connection of the same Session, the server answers from its reply cache
// instead of applying it twice, or with ErrIndeterminate when it no longer
// knows. Use one Session per server (data-plane address) and keep it across
// redials. A Session is safe for concurrent use.
type Session struct {
	id     [16]byte
	free   chan uint16
	seqs   [SessionSlots]uint32 // a slot's entry is owned by its ticket holder
	opened atomic.Bool          // a server accepted the session once
}

// NewSession makes a session with a fresh random id.
func NewSession() *Session {
	s := &Session{free: make(chan uint16, SessionSlots)}
	rand.Read(s.id[:])
	for i := range SessionSlots {
		s.free <- uint16(i)
	}
	return s
}

// ID returns the session's id, which the transport's handshake presents.
func (s *Session) ID() [16]byte { return s.id }

// Opened reports whether a server has accepted the session before: a
// handshake then resumes it rather than opening it.
func (s *Session) Opened() bool { return s.opened.Load() }

// MarkOpened records that a server accepted the session.
func (s *Session) MarkOpened() { s.opened.Store(true) }

// Acquire takes a free slot for one operation, waiting while all
// SessionSlots are taken (until ctx ends), and returns its ticket with the slot's next
// sequence number. Release the ticket once the operation's outcome is
// known, whatever it was.
func (s *Session) Acquire(ctx context.Context) (*Ticket, error) {
	// A free slot is taken even if ctx has ended: only a wait fails.
	if tk, ok := s.TryAcquire(); ok {
		return tk, nil
	}
	select {
	case slot := <-s.free:
		return s.take(slot), nil
	case <-ctx.Done():
		return nil, fmt.Errorf("rdma: all %d exactly-once slots of the session are in use: %w", SessionSlots, ctx.Err())
	}
}

// TryAcquire is Acquire without the wait: it returns false when every slot
// is taken. A caller that already holds tickets takes more with it, so that
// it never waits for a slot while holding others (two such callers could
// each wait for the other's).
func (s *Session) TryAcquire() (*Ticket, bool) {
	select {
	case slot := <-s.free:
		return s.take(slot), true
	default:
		return nil, false
	}
}

// take is the ticket of a slot just taken off the free list.
func (s *Session) take(slot uint16) *Ticket {
	s.seqs[slot]++
	return &Ticket{s: s, Slot: slot, Seq: s.seqs[slot]}
}

// Ticket names one exactly-once operation: the slot it holds in its
// Session and the slot's sequence number. Post the same Ticket again to
// retry the operation. A Ticket is safe for concurrent use, but one
// operation uses it at a time.
type Ticket struct {
	s *Session
	// Slot is the session slot the operation holds.
	Slot uint16
	// Seq is the slot's sequence number for this operation.
	Seq uint32

	posted   atomic.Bool
	released sync.Once
}

// Session returns the session the ticket belongs to.
func (t *Ticket) Session() *Session { return t.s }

// Post records that the operation is being posted and reports whether it
// was posted before (this is a retry).
func (t *Ticket) Post() (retry bool) { return t.posted.Swap(true) }

// Posted reports whether the operation was posted at least once.
func (t *Ticket) Posted() bool { return t.posted.Load() }

// Release returns the slot to the session; the next operation on it gets
// the next sequence number, which tells the server to drop this one's
// cached reply. Release is idempotent.
func (t *Ticket) Release() { t.released.Do(func() { t.s.free <- t.Slot }) }
