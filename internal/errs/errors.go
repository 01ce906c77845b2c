package errs

import "errors"

// The sentinels. Each names a condition an application can act on; wrap them
// with context (fmt.Errorf("...: %w", ErrX)) and test them with errors.Is.
var (
	// ErrNoCapacity: no tier that the caller accepts has room for the request.
	ErrNoCapacity = errors.New("no capacity: free segments, ask for a smaller size, or allow another tier with alloc.WithFallback")
	// ErrOutOfRange: an offset or length falls outside the segment, or overflows.
	ErrOutOfRange = errors.New("out of range: keep offset+length within the segment's Size()")
	// ErrNotFound: no segment has that id or name on this daemon.
	ErrNotFound = errors.New("not found")
	// ErrAccessDenied: the caller may not reach that segment (not its own and not attached by name).
	ErrAccessDenied = errors.New("access denied: a client reaches only segments it allocated or attached by name")
	// ErrLeaseExpired: the caller's lease or the segment's epoch ended; the memory may belong to someone else now.
	ErrLeaseExpired = errors.New("lease expired: the segment was reclaimed; allocate a new one")
	// ErrClosed: the client or segment was closed or freed.
	ErrClosed = errors.New("closed: the client or segment was closed or freed; dial again or allocate a new segment")
	// ErrSegmentLost: the memory behind the segment is gone (its home died, or its device does not survive restarts).
	ErrSegmentLost = errors.New("segment lost: its memory did not survive; free it and allocate again")
	// ErrInvalid: the request itself is malformed (size, tier, name, alignment).
	ErrInvalid = errors.New("invalid argument")
	// ErrExists: a segment with that name exists already.
	ErrExists = errors.New("name in use: pick another name or Attach the existing segment")
	// ErrUnaligned: a 64-bit atomic at an offset that is not a multiple of 8.
	ErrUnaligned = errors.New("unaligned: 64-bit atomics need an offset that is a multiple of 8")
	// ErrUnavailable: the daemon cannot be reached or is restarting; the call may be retried.
	// Its text is about the local daemon: a failure elsewhere (a far home)
	// wraps a Sub of it with its own text, such as ErrHomeUnreachable.
	ErrUnavailable = errors.New("pool unavailable: is poold running? start it with 'poold' or set FARMEM_SOCKET")
	// ErrLimit: a request went past a configured limit (segments per client,
	// name length, frame size, operations in flight); the message names the
	// limit and the setting that raises it.
	ErrLimit = errors.New("limit exceeded")
	// ErrNotSupported: the host or build lacks the capability asked for.
	ErrNotSupported = errors.New("not supported on this host or build")
)

// ErrOverBudget: no tier the caller accepts reads as fast as its budget asks
// (alloc.WithMaxLatency, alloc.WithMinBandwidth). It matches ErrNoCapacity
// too: no tier the caller accepts can take the request.
var ErrOverBudget = Sub(ErrNoCapacity, "over budget: no tier meets the read latency or bandwidth asked for; relax the budget, or run where a faster tier exists")

// ErrInUse: a segment cannot change its tier while other clients use it
// in a way the change would break: a load/store segment mapped by another
// client (its mapping would keep the old memory), or an rdma segment that
// clients other than the mover may reach. The message names the clients
// and how they let go of it. errors.Is(err, ErrInvalid) is true for it too.
var ErrInUse = Sub(ErrInvalid, "in use: other clients hold the segment; they release it (alloc.Segment.Close) before it changes tier")

// ErrHomeUnreachable: a far host that holds a segment's memory (its home,
// a peer poold) did not answer: the host may be down, or cut off from this
// one. It matches ErrUnavailable, so callers retry on it as on any
// unreachable daemon; its message sends the reader to the pool's view of
// its hosts rather than to starting the local poold, which is not what
// failed. ErrUnavailable's own text is for the local daemon alone.
var ErrHomeUnreachable = Sub(ErrUnavailable, "far memory home unreachable: its host may be down or cut off from this one; the call may be retried; 'memctl nodes' shows which hosts are alive, and the pool reports a home that stays away lost")

// ErrTooFewHomes: a redundant segment's homes cannot serve an operation
// now, while the local poold answers: none of its copies answered, too few
// of its shards could be read to decode a missing one, the shards read
// kept disagreeing while writes landed, or the daemon refused again and
// again to stand in for a lost home (ErrLimit while a move of the segment
// finishes). The pool rebuilds lost homes elsewhere, so the call may
// succeed later. It matches ErrUnavailable.
var ErrTooFewHomes = Sub(ErrUnavailable, "redundant segment unavailable for now: too few of its homes can serve the call (down, lost, or disagreeing while writes land); the call may be retried; the pool rebuilds lost homes ('memctl segments' shows the REDUNDANCY state, 'memctl nodes' which hosts are alive)")

// ErrSegmentChanging: a request met a move, rebuild or promotion of the
// segment under way (one that changed the segment's record, its homes or
// its epoch, while the request ran, or that the request waited for in
// vain), so the request stopped; the local poold is up. The call may be retried once the change settles. It matches
// ErrUnavailable.
var ErrSegmentChanging = Sub(ErrUnavailable, "segment changing: a move, rebuild or promotion of the segment is under way, and the request met it; the call may be retried once it settles")

// ErrIndeterminate: a write or atomic may or may not have taken effect, and
// retrying it could apply it twice: the connection broke after the request
// was sent and the home no longer remembers the answer (it restarted, or the
// client's reply cache there was evicted or its slot reused). Read the
// memory to find out, then decide. errors.Is(err, ErrUnavailable) is true
// for it too, so callers that only check ErrUnavailable keep working.
var ErrIndeterminate error = indeterminate{}

// indeterminate is ErrIndeterminate's type: it also matches ErrUnavailable.
type indeterminate struct{}

func (indeterminate) Error() string {
	return "outcome unknown: the operation may or may not have been applied and was not retried, so it is never applied twice; read the memory to find out"
}

// Is reports whether target is ErrUnavailable.
func (indeterminate) Is(target error) bool { return target == ErrUnavailable }

// Sub returns a new sentinel with its own message that also matches parent
// with errors.Is. A package names its own condition with it (the device's
// full filesystem, the extent allocator's missing free extent) and every
// caller still handles it as the farmem sentinel it is (ErrNoCapacity),
// without a mapping at each package boundary.
func Sub(parent error, msg string) error { return &subError{msg: msg, parent: parent} }

// subError is a sentinel made by Sub: immutable, compared by identity.
type subError struct {
	msg    string
	parent error
}

func (e *subError) Error() string { return e.msg }

// Unwrap returns the parent sentinel, so errors.Is matches both.
func (e *subError) Unwrap() error { return e.parent }
