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
	version    = 1
	maxSession = 256
	maxMessage = 4096
)

// ErrProtocol marks a malformed request or response.
var ErrProtocol = errors.New("fdpass: malformed message")

// Request asks for one segment's descriptor. A plain value.
type Request struct {
	Session string
	Segment uint64
}

// Response carries the descriptor or the reason there is none. A plain
// value; whoever receives it owns File and must close it.
type Response struct {
	Err    error // nil on success
	File   *os.File
	Offset int64 // where the segment starts in File
	Length int64
}

// AppendRequest encodes r after b.
func AppendRequest(b []byte, r Request) ([]byte, error) {
	if len(r.Session) > maxSession {
		return b, fmt.Errorf("%w: session id of %d bytes exceeds %d", ErrProtocol, len(r.Session), maxSession)
	}
	b = append(b, version)
	b = binary.BigEndian.AppendUint16(b, uint16(len(r.Session)))
	b = append(b, r.Session...)
	return binary.BigEndian.AppendUint64(b, r.Segment), nil
}

// ReadRequest decodes one request from r.
func ReadRequest(r io.Reader) (Request, error) {
	var hdr [3]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Request{}, err
	}
	if hdr[0] != version {
		return Request{}, fmt.Errorf("%w: version %d, this daemon speaks %d", ErrProtocol, hdr[0], version)
	}
	n := binary.BigEndian.Uint16(hdr[1:])
	if n > maxSession {
		return Request{}, fmt.Errorf("%w: session id of %d bytes exceeds %d", ErrProtocol, n, maxSession)
	}
	buf := make([]byte, int(n)+8)
	if _, err := io.ReadFull(r, buf); err != nil {
		return Request{}, fmt.Errorf("%w: truncated request: %w", ErrProtocol, err)
	}
	return Request{Session: string(buf[:n]), Segment: binary.BigEndian.Uint64(buf[n:])}, nil
}

// encodeResponse encodes everything of a response but the descriptor.
func encodeResponse(err error, off, length int64) []byte {
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
	return binary.BigEndian.AppendUint64(b, uint64(length))
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
	if len(rest) != ml+16 {
		return Response{}, bad
	}
	r := Response{
		Offset: int64(binary.BigEndian.Uint64(rest[ml:])),
		Length: int64(binary.BigEndian.Uint64(rest[ml+8:])),
	}
	if reason != "" {
		r.Err = errs.FromReason(reason, string(rest[:ml]))
	}
	return r, nil
}
