package coherence

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"slices"
	"sync"
	"time"
)

// Clock tells the time. The state machines take time as arguments; Home
// and Sharer read it from a Clock so tests can drive it.
type Clock interface {
	Now() time.Time
}

// SystemClock is the real, monotonic clock.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// maxMailbox bounds the messages waiting for one sharer; older ones are
// dropped (a lost Invalidate is resent, a lost Grant asked for again).
const maxMailbox = 1024

// mailbox holds the messages pushed to one sharer until it polls.
type mailbox struct {
	msgs     []Message
	wake     chan struct{} // closed when msgs becomes non-empty
	lastSeen time.Time
}

// heldKey names a held request: its sharer and sequence number.
type heldKey struct {
	from SharerID
	seq  uint64
}

// Home hosts a Directory for one segment at its home: it serializes the
// directory, keeps a mailbox per sharer for the messages the home pushes
// (invalidations, grants that had to wait) and hands them out to sharers'
// long polls. It does no I/O itself; the data plane feeds it messages.
//
// Home is safe for concurrent use.
type Home struct {
	cfg   Config
	clock Clock

	mu     sync.Mutex
	dir    *Directory
	boxes  map[SharerID]*mailbox
	held   map[heldKey]chan Message // requests whose reply waits for their grant
	done   bool                     // closed: the memory may be gone
	closed chan struct{}
	once   sync.Once
}

// NewHome returns the home of a segment whose memory is mem, with a random
// incarnation.
func NewHome(cfg Config, mem []byte, clock Clock) (*Home, error) {
	if clock == nil {
		clock = SystemClock{}
	}
	var b [8]byte
	var inc uint64
	for inc == 0 {
		rand.Read(b[:])
		inc = binary.LittleEndian.Uint64(b[:])
	}
	dir, err := NewDirectory(cfg, mem, inc, clock.Now())
	if err != nil {
		return nil, err
	}
	return &Home{cfg: cfg, clock: clock, dir: dir, boxes: map[SharerID]*mailbox{}, held: map[heldKey]chan Message{}, closed: make(chan struct{})}, nil
}

// Config returns the home's configuration.
func (h *Home) Config() Config { return h.cfg }

// Handle serves one request and returns its reply. Messages for other
// sharers go to their mailboxes.
func (h *Home) Handle(m Message) Message {
	return h.HandleHeld(context.Background(), m, 0)
}

// HandleHeld is Handle, except that a ReadReq or WriteReq that has to wait
// for invalidations is answered with its Grant itself when the grant comes
// within hold (and before ctx ends or the home closes), instead of Wait and
// a grant pushed to the requester's poll: one trip and two hand-offs fewer
// on a writer's path. After hold it is answered Wait and the grant is
// pushed as usual. The caller's connection is held meanwhile, so requests
// held this way belong on a connection of their own.
func (h *Home) HandleHeld(ctx context.Context, m Message, hold time.Duration) Message {
	h.mu.Lock()
	if h.done {
		h.mu.Unlock()
		return Message{Kind: Refused, From: m.From, Page: m.Page, Code: CodeClosed}
	}
	now := h.clock.Now()
	h.box(m.From, now)
	rep, out := h.dir.Handle(now, m)
	var ch chan Message
	k := heldKey{m.From, m.Seq}
	if _, dup := h.held[k]; !dup && rep.Kind == Wait && hold > 0 && (m.Kind == ReadReq || m.Kind == WriteReq) {
		ch = make(chan Message, 1)
		h.held[k] = ch
	}
	h.post(now, out)
	h.mu.Unlock()
	if ch == nil {
		return rep
	}
	t := time.NewTimer(hold)
	defer t.Stop()
	select {
	case g := <-ch:
		return g
	case <-t.C:
	case <-ctx.Done():
	case <-h.closed:
	}
	h.mu.Lock()
	mine := h.held[k] == ch
	if mine {
		delete(h.held, k)
	}
	h.mu.Unlock()
	if mine {
		return rep // Wait: the grant will be pushed
	}
	return <-ch // it came as the hold ended
}

func (h *Home) box(id SharerID, now time.Time) *mailbox {
	b := h.boxes[id]
	if b == nil {
		b = &mailbox{wake: make(chan struct{})}
		h.boxes[id] = b
	}
	b.lastSeen = now
	return b
}

// post puts pushed messages into their addressees' mailboxes.
func (h *Home) post(now time.Time, out []Message) {
	for _, m := range out {
		if m.Kind == Grant {
			k := heldKey{m.From, m.Seq}
			if ch, ok := h.held[k]; ok {
				delete(h.held, k)
				ch <- m
				continue
			}
		}
		b := h.boxes[m.From]
		if b == nil {
			b = &mailbox{wake: make(chan struct{}), lastSeen: now}
			h.boxes[m.From] = b
		}
		if len(b.msgs) >= maxMailbox {
			b.msgs = slices.Delete(b.msgs, 0, 1)
		}
		b.msgs = append(b.msgs, m)
		if len(b.msgs) == 1 {
			close(b.wake)
		}
	}
}

// Poll handles acks, the InvAcks sharer id sends along (their replies
// carry nothing), then returns the messages pushed to id, waiting up to
// wait for the first one (or until ctx ends or the home closes). It
// returns no messages and no error when nothing arrived in time. Acks ride
// the poll so that answering an invalidation costs the sharer no call of
// its own and the home no reply.
func (h *Home) Poll(ctx context.Context, id SharerID, wait time.Duration, acks []Message) []Message {
	for _, a := range acks {
		if a.Kind == InvAck && a.From == id {
			h.Handle(a)
		}
	}
	wait = min(wait, h.cfg.Lease)
	var timer *time.Timer
	for {
		h.mu.Lock()
		b := h.box(id, h.clock.Now())
		if len(b.msgs) > 0 {
			msgs := b.msgs
			b.msgs = nil
			b.wake = make(chan struct{})
			h.mu.Unlock()
			if timer != nil {
				timer.Stop()
			}
			return msgs
		}
		wake := b.wake
		h.mu.Unlock()
		if timer == nil {
			if wait <= 0 {
				return nil
			}
			timer = time.NewTimer(wait)
			defer timer.Stop()
		}
		select {
		case <-wake:
		case <-timer.C:
			return nil
		case <-ctx.Done():
			return nil
		case <-h.closed:
			return nil
		}
	}
}

// Tick advances the directory's clock: it gives up on sharers whose leases
// ran out, resends unanswered invalidations (after a tenth of a lease) and
// forgets mailboxes of sharers not heard from for ten leases. Call it
// about every Lease/20.
func (h *Home) Tick() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.done {
		return
	}
	now := h.clock.Now()
	h.post(now, h.dir.Tick(now, h.cfg.Lease/10))
	for id, b := range h.boxes {
		if now.Sub(b.lastSeen) > 10*h.cfg.Lease {
			delete(h.boxes, id)
		}
	}
}

// Stats returns the directory's counters.
func (h *Home) Stats() Stats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dir.Stats()
}

// Sharers returns the sharers holding a page under an unexpired lease.
func (h *Home) Sharers() []SharerID {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dir.Sharers(h.clock.Now())
}

// Attached returns how many sharers were heard from (a request or a poll)
// within the last two leases.
func (h *Home) Attached() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock.Now()
	n := 0
	for _, b := range h.boxes {
		if now.Sub(b.lastSeen) <= 2*h.cfg.Lease {
			n++
		}
	}
	return n
}

// Incarnation returns the directory's incarnation.
func (h *Home) Incarnation() uint64 { return h.dir.Incarnation() }

// Check verifies the directory's invariants (see Directory.Check).
func (h *Home) Check() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.dir.Check()
}

// Close wakes every poll; later polls return at once, and requests are
// refused (CodeClosed). After Close returns the Home no longer touches the
// segment's memory. Idempotent.
func (h *Home) Close() {
	h.mu.Lock()
	h.done = true
	h.mu.Unlock()
	h.once.Do(func() { close(h.closed) })
}
