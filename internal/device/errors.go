package device

import (
	"errors"

	"github.com/farmem/farmem/internal/errs"
)

// Sentinel errors. Every error a device returns wraps one of these (test with
// errors.Is), and its message names the device, the segment and the value at
// fault, and says what to do. The ones for conditions a client acts on are
// made with errs.Sub and match the farmem sentinel of the same meaning, so
// the daemon hands them on without mapping them. ErrInvalid, ErrUnaligned
// and ErrInUse stay this package's own: they report the daemon's misuse of a
// device or its configuration, never a bad request of a client.
var (
	// ErrInvalid reports an argument the device cannot use: a negative or
	// zero length, an extent beyond the device's capacity, a missing or
	// wrong kind of directory, a NUMA node that does not exist.
	ErrInvalid = errors.New("invalid argument")

	// ErrUnaligned reports an extent whose offset or length is not a
	// multiple of the device's Align(); round the extent to Align().
	ErrUnaligned = errors.New("extent not aligned to the device alignment")

	// ErrLost reports a segment whose contents did not survive (a memfd
	// after a daemon restart, a segment file removed or truncated by someone
	// else). The segment must be freed; its data is gone. It matches
	// errs.ErrSegmentLost.
	ErrLost = errs.Sub(errs.ErrSegmentLost, "segment contents lost")

	// ErrNoSpace reports that the filesystem or NUMA node backing the device
	// has no room for the segment, even though the device's capacity
	// accounting allowed it. It matches errs.ErrNoCapacity too, so the
	// daemon tries the caller's next tier and reports it as capacity.
	ErrNoSpace = errs.Sub(errs.ErrNoCapacity, "no space left on the backing memory")

	// ErrNotSupported reports a feature this system does not provide: any
	// device outside Linux, or a kernel without NUMA support. Errors that
	// match it are capability errors, and callers fall back on them. It
	// matches errs.ErrNotSupported.
	ErrNotSupported = errs.Sub(errs.ErrNotSupported, "not supported on this system")

	// ErrClosed reports use of a device or mapping after Close: the daemon
	// is shutting down. It matches errs.ErrUnavailable, since a client
	// reaches the restarted daemon's device again.
	ErrClosed = errs.Sub(errs.ErrUnavailable, "device closed")

	// ErrInUse reports a segment directory that another device instance (in
	// this or another process, usually a second poold) already holds.
	ErrInUse = errors.New("directory in use by another device")
)

// notSupportedError is a capability error: it says which feature is
// missing and why, and matches ErrNotSupported.
type notSupportedError struct {
	feature string
	reason  string
}

func (e *notSupportedError) Error() string {
	return "device: " + e.feature + " is not supported: " + e.reason
}

// Is reports whether target is ErrNotSupported or the farmem sentinel it
// matches, so callers can fall back.
func (e *notSupportedError) Is(target error) bool { return errors.Is(ErrNotSupported, target) }
