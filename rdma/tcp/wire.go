package tcp

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/farmem/farmem/rdma"
)

// Protocol constants. doc.go is the specification; keep the two in step.
const (
	// Version is the protocol version this package's client speaks.
	// Version 2 adds the exactly-once session (hello session id, request
	// flags ONCE and RETRY, status INDETERMINATE).
	Version = 2
	// minVersion and maxVersion bound the versions a server accepts.
	minVersion = 1
	maxVersion = 2
	// sessionVersion is the first version with sessions.
	sessionVersion = 2

	// MaxPayload is the largest payload one frame carries (16 MiB). The
	// client splits larger reads and writes into several ops.
	MaxPayload = 16 << 20
	// MaxCredential is the largest credential a client may present (4 KiB).
	MaxCredential = 4 << 10

	helloSize      = 12
	sessionIDSize  = 16
	replySize      = 12
	reqHeaderSize  = 80
	respHeaderSize = 24
)

// magic opens every handshake message: "FMRD" (farmem remote data).
var magic = [4]byte{'F', 'M', 'R', 'D'}

// le is the byte order of every integer on the wire.
var le = binary.LittleEndian

// Opcodes. Append only: never renumber or reuse a value.
const (
	opRead  uint8 = 1
	opWrite uint8 = 2
	opCAS   uint8 = 3
	opFADD  uint8 = 4
	opMsg   uint8 = 5 // see message.go
	opXor   uint8 = 6 // XOR the payload into the segment (forward.go)
)

// Response status codes. Append only.
const (
	statusOK           uint16 = 0
	statusAccessDenied uint16 = 1
	statusOutOfRange   uint16 = 2
	statusSegmentLost  uint16 = 3
	statusLeaseExpired uint16 = 4
	statusUnaligned    uint16 = 5
	statusProtocol     uint16 = 6
	statusUnsupported  uint16 = 7
	// statusIndeterminate answers an exactly-once retry whose outcome the
	// server no longer knows (version 2).
	statusIndeterminate uint16 = 8
	// statusMoved answers an op on a segment that moved to another home,
	// or is being switched over to one (Server.Seal, MoveAway): it was not
	// applied; the client asks where the segment lives now.
	statusMoved uint16 = 9
)

// Request flags (version 2). Append only.
const (
	// reqFlagOnce: the request is exactly-once; bytes 10..11 hold its
	// session slot and bytes 60..63 its sequence number.
	reqFlagOnce uint8 = 1
	// reqFlagRetry: the client sent this slot and sequence number before.
	reqFlagRetry uint8 = 2
	// reqFlagForward: with reqFlagOnce, on WRITE or XOR: a primary
	// forwards the op, and its payload starts with an origin block naming
	// the client op it forwards and the primary's answer (origin.go).
	reqFlagForward uint8 = 4
	// reqFlagsKnown are the flags this server understands.
	reqFlagsKnown = reqFlagOnce | reqFlagRetry | reqFlagForward
)

// helloFlagResume, in a version 2 hello, says that a server accepted the
// session before: an unknown session is then one whose replies were lost.
const helloFlagResume uint16 = 1

// respFlagSwapped is set in a CAS response when the swap happened.
const respFlagSwapped uint8 = 1

// Handshake reply codes. Append only.
const (
	replyAccept        uint16 = 0
	replyBadMagic      uint16 = 1
	replyBadVersion    uint16 = 2
	replyAuthFailed    uint16 = 3
	replyCredTooLong   uint16 = 4
	replyBusy          uint16 = 5
	replyShuttingDown  uint16 = 6
	replyInternalError uint16 = 7
)

// reqHeader is a decoded request frame header.
type reqHeader struct {
	id         uint64
	op         uint8
	flags      uint8
	payloadLen uint32
	seg        uint64
	key        rdma.Key
	epoch      uint64
	off        uint64
	length     uint32
	arg0       uint64
	arg1       uint64
	slot       uint16 // with reqFlagOnce
	seq        uint32 // with reqFlagOnce
}

// encodeRequest writes h into b, which must hold reqHeaderSize bytes.
func encodeRequest(b []byte, h *reqHeader) {
	_ = b[reqHeaderSize-1]
	le.PutUint64(b[0:], h.id)
	b[8] = h.op
	b[9] = h.flags
	le.PutUint16(b[10:], h.slot)
	le.PutUint32(b[12:], h.payloadLen)
	le.PutUint64(b[16:], h.seg)
	copy(b[24:40], h.key[:])
	le.PutUint64(b[40:], h.epoch)
	le.PutUint64(b[48:], h.off)
	le.PutUint32(b[56:], h.length)
	le.PutUint32(b[60:], h.seq)
	le.PutUint64(b[64:], h.arg0)
	le.PutUint64(b[72:], h.arg1)
}

// decodeRequest parses a request header. It fails, and the connection must be
// closed, when the frame breaks a framing rule: reserved bytes set, a length
// over MaxPayload, or a payload length that contradicts a known opcode.
// Unknown opcodes and flags decode fine; the server answers them with
// statusUnsupported after skipping their payload. With reqFlagOnce the
// reserved fields carry the session slot and sequence number.
func decodeRequest(b []byte, h *reqHeader) error {
	if len(b) != reqHeaderSize {
		return fmt.Errorf("request header is %d bytes, want %d: %w", len(b), reqHeaderSize, rdma.ErrProtocol)
	}
	h.flags = b[9]
	h.slot, h.seq = le.Uint16(b[10:]), le.Uint32(b[60:])
	if h.flags&reqFlagOnce == 0 && (h.slot != 0 || h.seq != 0) {
		return fmt.Errorf("request header reserved bytes are not zero: %w", rdma.ErrProtocol)
	}
	h.id = le.Uint64(b[0:])
	h.op = b[8]
	h.payloadLen = le.Uint32(b[12:])
	h.seg = le.Uint64(b[16:])
	copy(h.key[:], b[24:40])
	h.epoch = le.Uint64(b[40:])
	h.off = le.Uint64(b[48:])
	h.length = le.Uint32(b[56:])
	h.arg0 = le.Uint64(b[64:])
	h.arg1 = le.Uint64(b[72:])
	// A forwarded op's origin block comes on top of a full payload.
	if limit := maxRequestPayload(h.flags); h.payloadLen > limit {
		return fmt.Errorf("request %d payload of %d bytes exceeds the %d-byte limit: %w", h.id, h.payloadLen, limit, rdma.ErrProtocol)
	}
	if h.length > MaxPayload {
		return fmt.Errorf("request %d length %d exceeds the %d-byte limit: %w", h.id, h.length, MaxPayload, rdma.ErrProtocol)
	}
	switch h.op {
	case opRead:
		if h.payloadLen != 0 {
			return fmt.Errorf("READ request %d carries a %d-byte payload, want none: %w", h.id, h.payloadLen, rdma.ErrProtocol)
		}
	case opWrite, opXor:
		if h.flags&reqFlagForward != 0 {
			if pre := uint64(h.payloadLen) - uint64(h.length); h.payloadLen < h.length || pre < originSize || pre > originSize+MaxOriginName {
				return fmt.Errorf("forwarded %s request %d payload is %d bytes for length %d: want length plus a %d..%d-byte origin block: %w", opName(h.op), h.id, h.payloadLen, h.length, originSize, originSize+MaxOriginName, rdma.ErrProtocol)
			}
		} else if h.payloadLen != h.length {
			return fmt.Errorf("%s request %d payload is %d bytes but length says %d: %w", opName(h.op), h.id, h.payloadLen, h.length, rdma.ErrProtocol)
		}
	case opMsg:
		if h.off != 0 || h.arg0 != 0 || h.arg1 != 0 {
			return fmt.Errorf("MSG request %d has offset or args set, want 0: %w", h.id, rdma.ErrProtocol)
		}
	case opCAS, opFADD:
		if h.payloadLen != 0 || h.length != 8 {
			return fmt.Errorf("atomic request %d has payload %d and length %d, want 0 and 8: %w", h.id, h.payloadLen, h.length, rdma.ErrProtocol)
		}
	}
	return nil
}

// maxRequestPayload is the longest payload a request with flags carries:
// MaxPayload, and an origin block more with reqFlagForward.
func maxRequestPayload(flags uint8) uint32 {
	if flags&reqFlagForward != 0 {
		return MaxPayload + originSize + MaxOriginName
	}
	return MaxPayload
}

// opName names a WRITE-like opcode in error messages.
func opName(op uint8) string { return rdma.OpKind(op).String() }

// respHeader is a decoded response frame header.
type respHeader struct {
	id         uint64
	status     uint16
	flags      uint8
	payloadLen uint32
	value      uint64
}

// encodeResponse writes h into b, which must hold respHeaderSize bytes.
func encodeResponse(b []byte, h *respHeader) {
	_ = b[respHeaderSize-1]
	le.PutUint64(b[0:], h.id)
	le.PutUint16(b[8:], h.status)
	b[10] = h.flags
	b[11] = 0
	le.PutUint32(b[12:], h.payloadLen)
	le.PutUint64(b[16:], h.value)
}

// decodeResponse parses a response header; an error means the connection
// must be closed.
func decodeResponse(b []byte, h *respHeader) error {
	if len(b) != respHeaderSize {
		return fmt.Errorf("response header is %d bytes, want %d: %w", len(b), respHeaderSize, rdma.ErrProtocol)
	}
	if b[11] != 0 {
		return fmt.Errorf("response header reserved byte is %#x, want 0: %w", b[11], rdma.ErrProtocol)
	}
	h.id = le.Uint64(b[0:])
	h.status = le.Uint16(b[8:])
	h.flags = b[10]
	h.payloadLen = le.Uint32(b[12:])
	h.value = le.Uint64(b[16:])
	if h.payloadLen > MaxPayload {
		return fmt.Errorf("response %d payload of %d bytes exceeds the %d-byte limit: %w", h.id, h.payloadLen, MaxPayload, rdma.ErrProtocol)
	}
	if h.status != statusOK && h.payloadLen != 0 {
		return fmt.Errorf("response %d has error status %d and a %d-byte payload: %w", h.id, h.status, h.payloadLen, rdma.ErrProtocol)
	}
	return nil
}

// hello is the client's opening message.
type hello struct {
	version uint16
	cred    []byte
	// From version 2: the client's session and whether it resumes one a
	// server accepted before.
	session [sessionIDSize]byte
	resume  bool
}

// appendHello appends the encoded hello to b. From version 2 it carries
// h.session and h.resume.
func appendHello(b []byte, h hello) []byte {
	var hb [helloSize]byte
	copy(hb[0:4], magic[:])
	le.PutUint16(hb[4:], h.version)
	if h.resume && h.version >= sessionVersion {
		le.PutUint16(hb[6:], helloFlagResume)
	}
	le.PutUint32(hb[8:], uint32(len(h.cred)))
	b = append(b, hb[:]...)
	b = append(b, h.cred...)
	if h.version >= sessionVersion {
		b = append(b, h.session[:]...)
	}
	return b
}

// readHello reads and checks a client hello. On a framing failure it returns
// the reply code the server should send along with the error.
func readHello(r io.Reader) (hello, uint16, error) {
	var b [helloSize]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return hello{}, replyBadMagic, fmt.Errorf("read hello: %w", err)
	}
	if [4]byte(b[0:4]) != magic {
		return hello{}, replyBadMagic, fmt.Errorf("hello magic is %q, want %q: %w", b[0:4], magic[:], rdma.ErrProtocol)
	}
	h := hello{version: le.Uint16(b[4:])}
	if h.version < minVersion || h.version > maxVersion {
		return h, replyBadVersion, fmt.Errorf("client speaks protocol version %d, this server speaks %d..%d: %w", h.version, minVersion, maxVersion, rdma.ErrProtocol)
	}
	flags, known := le.Uint16(b[6:]), uint16(0)
	if h.version >= sessionVersion {
		known = helloFlagResume
	}
	if flags&^known != 0 {
		return hello{}, replyBadMagic, fmt.Errorf("hello flags %#x are not defined in version %d: %w", flags, h.version, rdma.ErrProtocol)
	}
	h.resume = flags&helloFlagResume != 0
	n := le.Uint32(b[8:])
	if n > MaxCredential {
		return h, replyCredTooLong, fmt.Errorf("credential of %d bytes exceeds the %d-byte limit: %w", n, MaxCredential, rdma.ErrProtocol)
	}
	h.cred = make([]byte, n)
	if _, err := io.ReadFull(r, h.cred); err != nil {
		return h, replyBadMagic, fmt.Errorf("read %d-byte credential: %w", n, err)
	}
	if h.version >= sessionVersion {
		if _, err := io.ReadFull(r, h.session[:]); err != nil {
			return h, replyBadMagic, fmt.Errorf("read session id: %w", err)
		}
	}
	return h, replyAccept, nil
}

// reply is the server's answer to a hello.
type reply struct {
	version    uint16
	code       uint16
	maxPayload uint32
}

// encodeReply writes r into b, which must hold replySize bytes.
func encodeReply(b []byte, r reply) {
	_ = b[replySize-1]
	copy(b[0:4], magic[:])
	le.PutUint16(b[4:], r.version)
	le.PutUint16(b[6:], r.code)
	le.PutUint32(b[8:], r.maxPayload)
}

// decodeReply parses a server reply.
func decodeReply(b []byte) (reply, error) {
	if len(b) != replySize {
		return reply{}, fmt.Errorf("reply is %d bytes, want %d: %w", len(b), replySize, rdma.ErrProtocol)
	}
	if [4]byte(b[0:4]) != magic {
		return reply{}, fmt.Errorf("reply magic is %q, want %q; is this a farmem data-plane port?: %w", b[0:4], magic[:], rdma.ErrProtocol)
	}
	r := reply{version: le.Uint16(b[4:]), code: le.Uint16(b[6:]), maxPayload: le.Uint32(b[8:])}
	if r.code == replyAccept && (r.version < minVersion || r.version > maxVersion) {
		return r, fmt.Errorf("server accepted with protocol version %d, this client speaks %d..%d: %w", r.version, minVersion, maxVersion, rdma.ErrProtocol)
	}
	return r, nil
}

// replyError turns a rejecting reply code into an error for Dial.
func replyError(addr string, r reply) error {
	switch r.code {
	case replyAccept:
		return nil
	case replyBadMagic:
		return fmt.Errorf("rdma/tcp: %s rejected the hello as malformed: %w", addr, rdma.ErrProtocol)
	case replyBadVersion:
		return &rdma.NotSupportedError{
			Feature: fmt.Sprintf("tcp data-plane protocol version %d", Version),
			Reason:  fmt.Sprintf("%s speaks version %d; upgrade the older side", addr, r.version),
		}
	case replyAuthFailed:
		return fmt.Errorf("rdma/tcp: %s refused the credential (it is no live session's: reconnect to poold for a fresh one): %w", addr, rdma.ErrAccessDenied)
	case replyCredTooLong:
		return fmt.Errorf("rdma/tcp: %s refused a credential over %d bytes: %w", addr, MaxCredential, rdma.ErrProtocol)
	case replyBusy:
		return fmt.Errorf("rdma/tcp: %s is at its connection limit or handshake limits, or holds as many connections of this client's tenant as it takes; retry later (or close some), or raise ServerConfig.MaxConns, MaxHandshakes, MaxHandshakesPerSource or MaxConnsPerTenant (poold --data-max-conns, --data-max-handshakes, --data-max-handshakes-per-source, --data-max-conns-per-tenant)", addr)
	case replyShuttingDown:
		return fmt.Errorf("rdma/tcp: %s is shutting down: %w", addr, rdma.ErrClosed)
	default:
		return fmt.Errorf("rdma/tcp: %s rejected the connection with code %d: %w", addr, r.code, rdma.ErrProtocol)
	}
}

// statusError maps a non-OK response status to an error for op kind k;
// value is the response's value field, which a MOVED answer of an old home
// whose switch-over is done sets to the move's token (Server.Handover).
func statusError(status uint16, value uint64, k rdma.OpKind, seg, off uint64, n int) error {
	var base error
	switch status {
	case statusAccessDenied:
		base = rdma.ErrAccessDenied
	case statusOutOfRange:
		base = rdma.ErrOutOfRange
	case statusSegmentLost:
		base = rdma.ErrSegmentLost
	case statusLeaseExpired:
		base = rdma.ErrLeaseExpired
	case statusUnaligned:
		base = rdma.ErrUnaligned
	case statusUnsupported:
		base = &rdma.NotSupportedError{Feature: "tcp " + k.String(), Reason: "the server does not know this operation; upgrade it"}
	case statusIndeterminate:
		base = rdma.ErrIndeterminate
	case statusMoved:
		base = rdma.ErrMoved
		if value != 0 {
			base = &rdma.MovedError{Token: value}
		}
	default:
		base = rdma.ErrProtocol
	}
	return fmt.Errorf("rdma/tcp: %s segment %d offset %d length %d: status %d: %w", k, seg, off, n, status, base)
}
