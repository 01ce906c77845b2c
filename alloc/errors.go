package alloc

import (
	"errors"

	"github.com/farmem/farmem/internal/errs"
)

// The errors alloc returns, matched with errors.Is. The message of a
// returned error says what failed and what to do; these are the sentinels.
var (
	// ErrNoCapacity: no tier the caller accepts has room for the request.
	ErrNoCapacity = errs.ErrNoCapacity
	// ErrOverBudget: no tier the caller accepts meets its WithMaxLatency or
	// WithMinBandwidth; the message names the best tier and its figures.
	// errors.Is(err, ErrNoCapacity) is true for it too.
	ErrOverBudget = errs.ErrOverBudget
	// ErrOutOfRange: an offset or length falls outside the segment, or overflows.
	ErrOutOfRange = errs.ErrOutOfRange
	// ErrNotFound: no segment has that id or name.
	ErrNotFound = errs.ErrNotFound
	// ErrAccessDenied: the segment is neither the caller's nor attached by name.
	ErrAccessDenied = errs.ErrAccessDenied
	// ErrLeaseExpired: the caller's lease ended and the segment was reclaimed.
	ErrLeaseExpired = errs.ErrLeaseExpired
	// ErrClosed: the client or segment was closed or freed.
	ErrClosed = errs.ErrClosed
	// ErrSegmentLost: the memory behind a segment did not survive.
	ErrSegmentLost = errs.ErrSegmentLost
	// ErrInvalid: a malformed request (size, tier, name).
	ErrInvalid = errs.ErrInvalid
	// ErrExists: a segment with that name exists; Attach it instead.
	ErrExists = errs.ErrExists
	// ErrUnaligned: a 64-bit atomic at an offset that is not a multiple of 8.
	ErrUnaligned = errs.ErrUnaligned
	// ErrUnavailable: poold, or a far home of a segment, cannot be reached,
	// or a redundant segment's homes cannot serve the call now; the call
	// may be retried. The message says which: only a failure to reach the
	// local poold asks whether it runs.
	ErrUnavailable = errs.ErrUnavailable
	// ErrIndeterminate: a WriteAt, CompareAndSwap64 or FetchAdd64 on an
	// rdma segment may or may not have taken effect. The connection broke
	// after the request was sent and the home could not say whether it ran
	// (it restarted, or it no longer held this client's reply for it), so
	// the call was not retried: a write or atomic is never applied twice.
	// Read the memory to find out. errors.Is(err, ErrUnavailable) is also
	// true for it.
	ErrIndeterminate = errs.ErrIndeterminate
	// ErrInUse: Client.Move cannot change a segment's tier while other
	// clients hold it: another client maps the load/store segment, or
	// clients other than the caller may reach the rdma segment to be
	// promoted. The message names them; they let go with Segment.Close
	// (or end). errors.Is(err, ErrInvalid) is true for it too.
	ErrInUse = errs.ErrInUse
	// ErrLimit: a request went past one of poold's limits (segments per
	// client, name length); the message names it and how to raise it.
	ErrLimit = errs.ErrLimit
	// ErrNotSupported: this host or build lacks the capability.
	ErrNotSupported = errs.ErrNotSupported
	// ErrBadRef: an Arena Ref that was freed, forged, or made by another arena.
	ErrBadRef = errors.New("alloc: the Ref names no live object of this arena")
	// ErrTooLarge: an Arena object larger than MaxObjectSize; use a Segment.
	ErrTooLarge = errors.New("alloc: object larger than the arena's largest size class")
)
