package rdma

import (
	"errors"
	"fmt"

	"github.com/farmem/farmem/internal/errs"
)

// The sentinels for conditions an application acts on are made with
// errs.Sub: each keeps its own message and also matches the farmem sentinel
// of the same meaning (errors.Is(err, alloc.ErrAccessDenied) holds for an
// rdma.ErrAccessDenied), so no caller maps them. ErrProtocol, ErrNotExported
// and ErrAlreadyExported stay this package's own: they report a broken peer
// or a misuse of an Exporter by the daemon, never an answer to an
// application.

// ErrAccessDenied means the key does not match an exported segment (the key
// is wrong, or the segment was revoked or never exported on that host), or
// the connection's principal may not use the segment (tcp Server.Allow).
// Ask the segment's home for a fresh Region.
var ErrAccessDenied = errs.Sub(errs.ErrAccessDenied, "rdma: access denied: the key does not match a segment exported by that host, or the connection's credential is not one of its owner's or attachers'; the segment may have been revoked, freed or detached: fetch a fresh region from its home")

// ErrOutOfRange means an operation addressed bytes outside the segment (or an
// offset so large that offset+length overflows). Check the offset and length
// against the segment size.
var ErrOutOfRange = errs.Sub(errs.ErrOutOfRange, "rdma: offset or length out of range for the segment; check offset+length against the segment size")

// ErrSegmentLost means the memory behind the segment is gone (the device
// faulted, the home host died, or its daemon dropped the segment). Its
// contents cannot be recovered; allocate a new segment.
var ErrSegmentLost = errs.Sub(errs.ErrSegmentLost, "rdma: segment lost: its memory is gone and its contents cannot be recovered; allocate a new segment")

// ErrNotSupported means a transport or feature is not available on this host
// or build. It is matched with errors.Is; the concrete error is usually a
// *NotSupportedError that says what is missing. Transport pickers fall back to
// the next transport on this error.
var ErrNotSupported = errs.Sub(errs.ErrNotSupported, "rdma: not supported")

// ErrLeaseExpired means the operation carried a lease epoch older than the
// segment's current one: another holder took the segment over (fencing).
// Renew the lease with the segment's home to get the current epoch.
var ErrLeaseExpired = errs.Sub(errs.ErrLeaseExpired, "rdma: lease expired: the region's epoch is older than the segment's current epoch; renew the lease to get the current epoch")

// ErrClosed means the connection or server was closed, locally or by the
// peer, before the operation completed. Whether a cancelled write reached
// the remote memory is unknown; dial again and retry if the operation is
// idempotent. It matches errs.ErrUnavailable (the home is out of reach over
// this connection), not errs.ErrClosed, which says the caller closed its
// own client or segment.
var ErrClosed = errs.Sub(errs.ErrUnavailable, "rdma: connection closed; dial again")

// ErrProtocol means the peer sent bytes that do not follow the wire protocol
// (bad magic, unknown version, malformed or oversized frame). The connection
// is closed; check that both hosts run compatible farmem versions.
var ErrProtocol = errors.New("rdma: protocol error; check that both hosts run compatible farmem versions")

// ErrIndeterminate means a WRITE, CAS or FADD that was retried with an
// exactly-once ticket (Op.Once) may or may not have been applied: the
// server no longer remembers the ticket's answer (it restarted, evicted the
// session's reply cache, or the slot moved on), or the transport cannot
// resend it safely (a verbs queue pair broke after it was posted). The
// operation was not applied a second time. Read the memory to find out.
// Like errs.ErrIndeterminate it also matches errs.ErrUnavailable.
var ErrIndeterminate = errs.Sub(errs.ErrIndeterminate, "rdma: outcome unknown: the operation may have been applied once and was not applied again; read the memory to find out")

// ErrMoved means the segment moved to another home, or is switching over
// to one: the operation was not applied. Ask the segment's daemon where it
// lives now (its Stat) and send the operation there; alloc does this
// itself. It matches errs.ErrUnavailable (the segment is out of reach at
// that address), so a caller that gives up retries as for an unreachable
// home.
var ErrMoved = errs.Sub(errs.ErrUnavailable, "rdma: segment moved: the operation was not applied; ask the segment's daemon where it lives now and retry there")

// MovedError is the ErrMoved of an old home whose move's switch-over is
// done there: the copy at the new home has every change, and Token
// (MoveToken of that copy) names it. A client that was told of the copy
// ahead (its daemon's notice before the seal) sends the operation there
// at once; any other asks its daemon as for ErrMoved. errors.Is(err,
// ErrMoved) holds. Immutable once made, safe to share.
type MovedError struct {
	Token uint64
}

func (e *MovedError) Error() string {
	return fmt.Sprintf("%v (switched over to the copy %#x)", ErrMoved, e.Token)
}

// Unwrap returns ErrMoved.
func (e *MovedError) Unwrap() error { return ErrMoved }

// ErrUnaligned means an atomic operation addressed an offset that is not a
// multiple of 8. CompareAndSwap64 and FetchAdd64 need 8-byte aligned offsets.
var ErrUnaligned = errs.Sub(errs.ErrUnaligned, "rdma: atomic operation needs an 8-byte aligned offset")

// ErrNotTracked means a segment's changed chunks were asked for (Dirty,
// Chunk: a move's source taking or pushing them) while its writes are not
// tracked: Track was never called, an Unseal stopped it (the move's
// ABORT), or the host restarted since. The changes since are unknown, so
// that move cannot go on; a new one starts with Track. It matches
// errs.ErrNotFound: no tracking of the segment is found here.
var ErrNotTracked = errs.Sub(errs.ErrNotFound, "rdma: the segment's writes are not tracked here (never tracked, its move's ABORT stopped it, or this host restarted since), so its changes are unknown: start the move again, from its TRACK")

// ErrNotExported means an exporter was asked to revoke, re-epoch or mark a
// segment id that it does not export (never exported, or already revoked).
var ErrNotExported = errors.New("rdma: segment is not exported by this host; check the segment id")

// ErrAlreadyExported means Export was called for a segment id that is already
// exported. Revoke it first, or use a different id.
var ErrAlreadyExported = errors.New("rdma: segment is already exported; revoke it first")

// NotSupportedError is a capability error: it says which feature is missing
// and why, and errors.Is(err, ErrNotSupported) reports true for it.
// It is an immutable value and safe for concurrent use.
type NotSupportedError struct {
	// Feature names what is missing, e.g. "verbs transport".
	Feature string
	// Reason says why and what to do, e.g. "built without the verbs tag;
	// rebuild with -tags verbs on a host with libibverbs".
	Reason string
}

// Error implements error.
func (e *NotSupportedError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("rdma: %s not supported", e.Feature)
	}
	return fmt.Sprintf("rdma: %s not supported: %s", e.Feature, e.Reason)
}

// Is reports whether target is ErrNotSupported or the farmem sentinel it
// matches.
func (e *NotSupportedError) Is(target error) bool { return errors.Is(ErrNotSupported, target) }
