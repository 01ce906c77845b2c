package rdma

import (
	"context"
	"fmt"
)

// Region is everything a client needs to address a remote segment: which
// segment, the key that authorises access, and the lease epoch the client
// holds. A server refuses mutating operations whose Epoch is older than the
// segment's current epoch (fencing). Region is a plain value, safe to copy.
type Region struct {
	// Segment is the segment id at the exporting host.
	Segment uint64
	// Key is the access key the exporter issued for the segment.
	Key Key
	// Epoch is the lease epoch the client holds; it travels on every op.
	Epoch uint64
}

// String formats the region without its key, so it is safe to log.
func (r Region) String() string {
	return fmt.Sprintf("segment %d epoch %d", r.Segment, r.Epoch)
}

// Exporter is the server side of a transport: it registers mapped segment
// memory so that remote clients can operate on it (the analogue of
// ibv_reg_mr). Implementations are safe for concurrent use.
type Exporter interface {
	// Export makes mem reachable as segment seg under a fresh random key and
	// returns that key. mem must be mapped memory (mmap), never the Go heap,
	// must be 8-byte aligned, and must stay mapped until Revoke returns.
	// Exporting a segment id that is already exported fails.
	Export(seg uint64, mem []byte, epoch uint64) (Key, error)
	// Revoke withdraws segment seg: new operations on it fail with
	// ErrAccessDenied, and Revoke returns only after every operation that
	// was touching its memory has finished, so the caller may unmap it.
	Revoke(seg uint64) error
	// SetEpoch raises the segment's lease epoch; mutating operations that
	// carry an older epoch then fail with ErrLeaseExpired. Lowering the epoch
	// is refused.
	SetEpoch(seg, epoch uint64) error
	// MarkLost records that the segment's memory is gone (device fault, lost
	// backing store): new operations on it fail with ErrSegmentLost and do
	// not touch the memory. Revoke still has to be called to drop it.
	MarkLost(seg uint64) error
}

// Conn is a client connection to one remote host's exported memory.
// Implementations are safe for concurrent use and keep many operations in
// flight. Every method honours ctx: when ctx ends first the call returns
// ctx.Err() (possibly wrapped), and a Read never writes into p after it has
// returned. Whether a cancelled Write, CompareAndSwap64 or FetchAdd64 took
// effect remotely is unknown, as with RDMA.
type Conn interface {
	// Read fills p with the bytes of r starting at off.
	Read(ctx context.Context, r Region, off int64, p []byte) error
	// Write stores p into r starting at off. p is not retained after Write
	// returns.
	Write(ctx context.Context, r Region, off int64, p []byte) error
	// CompareAndSwap64 atomically replaces the 64-bit word at off (8-byte
	// aligned) with new if it equals old. It returns the word's previous
	// value and whether the swap happened.
	CompareAndSwap64(ctx context.Context, r Region, off int64, old, new uint64) (prev uint64, swapped bool, err error)
	// FetchAdd64 atomically adds delta to the 64-bit word at off (8-byte
	// aligned) and returns its previous value.
	FetchAdd64(ctx context.Context, r Region, off int64, delta uint64) (prev uint64, err error)
	// Do posts all ops at once and waits for all of them. Each op's result
	// and Err are set; Do returns the first non-nil Op.Err in argument
	// order, or nil.
	Do(ctx context.Context, ops ...*Op) error
	// Message is the one two-sided operation: it hands req to the message
	// handler of the host exporting r (the coherence directory of a shared
	// segment) and reads its answer into resp, returning the answer's
	// length. The handler may hold the call (a long poll), and with it the
	// operations queued behind it, so a caller that may be held uses a
	// connection of its own. A transport bounds req and resp (rdma/tcp:
	// MaxMessage and MaxPayload) and refuses larger with ErrOutOfRange; one that cannot
	// carry messages fails with an error matching ErrNotSupported.
	Message(ctx context.Context, r Region, req, resp []byte) (int, error)
	// Close releases the connection. Operations in flight fail with
	// ErrClosed. Close is idempotent.
	Close() error
}

// Transport dials connections of one kind (tcp, verbs). Implementations are
// safe for concurrent use.
type Transport interface {
	// Name returns the transport's short name: "tcp" or "verbs".
	Name() string
	// Dial connects to the data-plane address addr and presents cred, an
	// opaque credential the server's authenticator checks. A transport that
	// cannot work on this host or build returns an error for which
	// errors.Is(err, ErrNotSupported) is true.
	Dial(ctx context.Context, addr string, cred []byte) (Conn, error)
}

// OpKind says what an Op does. The values are stable.
type OpKind uint8

// The operation kinds.
const (
	// OpRead reads len(Buf) bytes at Offset into Buf.
	OpRead OpKind = 1
	// OpWrite writes Buf at Offset.
	OpWrite OpKind = 2
	// OpCompareAndSwap replaces the word at Offset with New if it equals Old.
	OpCompareAndSwap OpKind = 3
	// OpFetchAdd adds Delta to the word at Offset.
	OpFetchAdd OpKind = 4
	// OpXor XORs Buf into the bytes at Offset: the parity update of an
	// erasure-coded segment, where updates from several writers commute.
	// It is exactly-once-able (Op.Once) like OpWrite. Value 6: 5 is the
	// tcp transport's message opcode.
	OpXor OpKind = 6
)

// String returns the kind's name as used in error messages.
func (k OpKind) String() string {
	switch k {
	case OpRead:
		return "READ"
	case OpWrite:
		return "WRITE"
	case OpCompareAndSwap:
		return "CAS"
	case OpFetchAdd:
		return "FADD"
	case OpXor:
		return "XOR"
	default:
		return fmt.Sprintf("OpKind(%d)", uint8(k))
	}
}

// Op is one work request for Conn.Do, the analogue of an RDMA work request
// plus its completion. The caller owns the Op and its Buf; neither may be
// touched while Do runs. An Op may be reused after Do returns.
type Op struct {
	// Kind is the operation.
	Kind OpKind
	// Region addresses the remote segment.
	Region Region
	// Offset is the byte offset in the segment. Atomics need a multiple of 8.
	Offset int64
	// Buf is the destination of OpRead and the source of OpWrite and
	// OpXor.
	Buf []byte
	// Old is the expected value for OpCompareAndSwap.
	Old uint64
	// New is the replacement value for OpCompareAndSwap.
	New uint64
	// Delta is the addend for OpFetchAdd.
	Delta uint64
	// Once, when not nil, makes an OpWrite, OpXor, OpCompareAndSwap or
	// OpFetchAdd exactly-once: post the op again with the same Ticket (on a connection
	// dialed with the ticket's Session) after a connection failure, and the
	// server answers a retry of an op it already applied with the original
	// result, or with ErrIndeterminate when it can no longer tell; it never
	// applies the op twice. An OpWrite or OpXor with a ticket carries at most one
	// frame of the transport (rdma/tcp: MaxPayload bytes). Nil: the op is
	// sent as is, and posting it again may apply it again.
	Once *Ticket

	// Prev is set by Do for atomics: the word's value before the op.
	Prev uint64
	// Swapped is set by Do for OpCompareAndSwap.
	Swapped bool
	// Err is set by Do: nil on success.
	Err error
}
