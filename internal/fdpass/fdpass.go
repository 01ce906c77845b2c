package fdpass

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/farmem/farmem/internal/errs"
)

// Magic opens every descriptor-passing connection.
const Magic = "FMFD"

const (
	version    = 2
	maxSession = 256
	maxMessage = 4096
	// MaxBody bounds a request's or response's body.
	MaxBody = 64 << 10
)

// Op is what a request asks for.
type Op uint8

// The ops; the values are stable.
const (
	// OpGet asks for an existing segment's descriptor.
	OpGet Op = 1
	// OpAlloc allocates a segment (body: an AllocRequest proto) and returns
	// its description (a Segment proto) with its descriptor.
	OpAlloc Op = 2
	// OpFree frees a segment.
	OpFree Op = 3
	// OpRelease tells the daemon that the client no longer maps a segment
	// it got the descriptor of (it closed the segment, or moves it to
	// another tier): the daemon counts who maps each segment, and moves a
	// load/store segment only when no other client does.
	OpRelease Op = 4
)

// MapsMemory reports whether a successful reply to op carries a descriptor.
func (op Op) MapsMemory() bool { return op == OpGet || op == OpAlloc }

// ErrProtocol marks a malformed request or response.
var ErrProtocol = errors.New("fdpass: malformed message")

// Request is one call. A plain value.
type Request struct {
	Op      Op
	Session string
	// Segment is the segment of OpGet, OpFree and OpRelease.
	Segment uint64
	// Body is OpAlloc's AllocRequest proto.
	Body []byte
}

// Response carries the result: the descriptor, or the reason there is none.
// A plain value; whoever receives it owns File and must close it.
type Response struct {
	Err    error // nil on success
	File   *os.File
	Offset int64 // where the segment starts in File
	Length int64
	Body   []byte // OpAlloc: the new segment's Segment proto
}

// AppendRequest encodes r after b.
func AppendRequest(b []byte, r Request) ([]byte, error) {
	if len(r.Session) > maxSession {
		return b, fmt.Errorf("%w: session id of %d bytes exceeds %d", ErrProtocol, len(r.Session), maxSession)
	}
	body := r.Body
	switch r.Op {
	case OpGet, OpFree, OpRelease:
		body = binary.BigEndian.AppendUint64(nil, r.Segment)
	case OpAlloc:
		if len(body) > MaxBody {
			return b, fmt.Errorf("%w: body of %d bytes exceeds %d", ErrProtocol, len(body), MaxBody)
		}
	default:
		return b, fmt.Errorf("%w: unknown op %d", ErrProtocol, r.Op)
	}
	b = append(b, version, byte(r.Op))
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.Session)))
	b = append(b, r.Session...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...), nil
}

// ReadRequest decodes one request from r.
func ReadRequest(r io.Reader) (Request, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Request{}, err
	}
	if hdr[0] != version {
		return Request{}, fmt.Errorf("%w: version %d, this daemon speaks %d", ErrProtocol, hdr[0], version)
	}
	req := Request{Op: Op(hdr[1])}
	n := binary.BigEndian.Uint16(hdr[2:])
	if n > maxSession {
		return Request{}, fmt.Errorf("%w: session id of %d bytes exceeds %d", ErrProtocol, n, maxSession)
	}
	buf := make([]byte, int(n)+4)
	if _, err := io.ReadFull(r, buf); err != nil {
		return Request{}, fmt.Errorf("%w: truncated request: %w", ErrProtocol, err)
	}
	req.Session = string(buf[:n])
	bl := binary.BigEndian.Uint32(buf[n:])
	switch req.Op {
	case OpGet, OpFree, OpRelease:
		if bl != 8 {
			return Request{}, fmt.Errorf("%w: op %d with a %d-byte body, want 8", ErrProtocol, req.Op, bl)
		}
	case OpAlloc:
		if bl > MaxBody {
			return Request{}, fmt.Errorf("%w: body of %d bytes exceeds %d", ErrProtocol, bl, MaxBody)
		}
	default:
		return Request{}, fmt.Errorf("%w: unknown op %d", ErrProtocol, req.Op)
	}
	body := make([]byte, bl)
	if _, err := io.ReadFull(r, body); err != nil {
		return Request{}, fmt.Errorf("%w: truncated request: %w", ErrProtocol, err)
	}
	if req.Op == OpAlloc {
		req.Body = body
	} else {
		req.Segment = binary.BigEndian.Uint64(body)
	}
	return req, nil
}

// encodeResponse encodes everything of a response but the descriptor.
func encodeResponse(err error, off, length int64, body []byte) []byte {
	reason, msg := errs.Reason(err), ""
	if err != nil {
		msg = err.Error()
		if len(msg) > maxMessage {
			msg = msg[:maxMessage]
		}
	}
	b := make([]byte, 0, 1+len(reason)+2+len(msg)+16)
	b = append(b, byte(len(reason)))
	b = append(b, reason...)
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg)))
	b = append(b, msg...)
	b = binary.BigEndian.AppendUint64(b, uint64(off))
	b = binary.BigEndian.AppendUint64(b, uint64(length))
	b = binary.BigEndian.AppendUint32(b, uint32(len(body)))
	return append(b, body...)
}

// decodeResponse is the inverse of encodeResponse.
func decodeResponse(b []byte) (Response, error) {
	bad := fmt.Errorf("%w: response of %d bytes", ErrProtocol, len(b))
	if len(b) < 1 {
		return Response{}, bad
	}
	rl := int(b[0])
	if len(b) < 1+rl+2 {
		return Response{}, bad
	}
	reason := string(b[1 : 1+rl])
	ml := int(binary.BigEndian.Uint16(b[1+rl:]))
	rest := b[1+rl+2:]
	if len(rest) < ml+20 {
		return Response{}, bad
	}
	bl := int(binary.BigEndian.Uint32(rest[ml+16:]))
	if bl > MaxBody || len(rest) != ml+20+bl {
		return Response{}, bad
	}
	r := Response{
		Offset: int64(binary.BigEndian.Uint64(rest[ml:])),
		Length: int64(binary.BigEndian.Uint64(rest[ml+8:])),
	}
	if bl > 0 {
		r.Body = append([]byte(nil), rest[ml+20:]...)
	}
	if reason != "" {
		r.Err = errs.FromReason(reason, string(rest[:ml]))
	}
	return r, nil
}
