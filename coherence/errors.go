package coherence

import (
	"errors"

	"github.com/farmem/farmem/internal/errs"
)

// The errors coherence returns, matched with errors.Is. The farmem sentinels
// are the ones alloc re-exports, so applications test alloc.ErrSegmentLost.
var (
	// ErrSegmentLost: the home is gone or restarted (its directory has a new
	// incarnation); pages this sharer held, and modified data it had not
	// written back, are lost. Attach the segment again.
	ErrSegmentLost = errs.ErrSegmentLost
	// ErrLeaseExpired: modified data was not written back before its lease
	// ran out (the sharer was partitioned or stalled) and the page moved on;
	// the writes since the last successful Sync are lost.
	ErrLeaseExpired = errs.ErrLeaseExpired
	// ErrClosed: the sharer was closed.
	ErrClosed = errs.ErrClosed
	// ErrOutOfRange: an offset or length falls outside the segment.
	ErrOutOfRange = errs.ErrOutOfRange
	// ErrUnaligned: a 64-bit atomic at an offset that is not a multiple of 8.
	ErrUnaligned = errs.ErrUnaligned
	// ErrInvalid: a bad configuration (page size, lease).
	ErrInvalid = errs.ErrInvalid
	// ErrUnavailable: the home could not be reached within the operation's
	// deadline; the operation may be retried.
	ErrUnavailable = errs.ErrUnavailable
	// ErrProtocol: a malformed message, or a reply that breaks the protocol.
	ErrProtocol = errors.New("coherence: protocol violation: a malformed or unexpected message; check that both ends run the same farmem version")
)
