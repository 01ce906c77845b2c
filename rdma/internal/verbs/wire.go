package verbs

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/farmem/farmem/rdma"
)

// The control protocol (see doc.go for the frames). It has no cgo, so it
// builds, is tested and is fuzzed everywhere.

// Protocol constants.
const (
	// Version is the control protocol version this package speaks.
	Version = 1
	// MaxCredential is the longest credential a hello may carry.
	MaxCredential = 4096

	helloLen    = 12 + qpInfoLen
	replyLen    = 8 + qpInfoLen
	qpInfoLen   = 28
	requestLen  = 40
	responseLen = 32
)

// magic opens every hello and reply of the verbs control protocol.
var magic = [4]byte{'F', 'M', 'V', 'B'}

// tcpMagic is what a server that speaks only rdma/tcp answers with; a client
// that reads it knows the peer serves no verbs.
var tcpMagic = [4]byte{'F', 'M', 'R', 'D'}

// Reply codes (append only).
const (
	codeAccept       uint16 = 0
	codeBadMagic     uint16 = 1
	codeBadVersion   uint16 = 2
	codeAuthFailed   uint16 = 3
	codeCredTooLong  uint16 = 4
	codeShuttingDown uint16 = 6
	codeInternal     uint16 = 7
)

// Request opcodes (append only).
const (
	opResolve uint8 = 1
)

// Request flags.
const (
	flagWrite uint8 = 1 // the caller will WRITE or run atomics: its epoch must be current
)

// Response status codes (append only; the same numbers as rdma/tcp).
const (
	statusOK           uint16 = 0
	statusAccessDenied uint16 = 1
	statusSegmentLost  uint16 = 3
	statusLeaseExpired uint16 = 4
	statusProtocol     uint16 = 6
	statusUnsupported  uint16 = 7
	statusInternal     uint16 = 8
)

// qpInfo is what one side of an RC queue pair tells the other to connect.
type qpInfo struct {
	QPN uint32   // queue pair number (24 bits)
	PSN uint32   // first packet sequence number (24 bits)
	LID uint16   // port LID (InfiniBand); 0 on RoCE
	MTU uint8    // ibv_mtu of the port (1 = 256 ... 5 = 4096)
	GRH uint8    // 1 when the peer must be addressed by GID (RoCE)
	GID [16]byte // port GID the QP sends from
}

func (q qpInfo) put(b []byte) {
	binary.LittleEndian.PutUint32(b[0:], q.QPN)
	binary.LittleEndian.PutUint32(b[4:], q.PSN)
	binary.LittleEndian.PutUint16(b[8:], q.LID)
	b[10], b[11] = q.MTU, q.GRH
	copy(b[12:28], q.GID[:])
}

func getQPInfo(b []byte) qpInfo {
	q := qpInfo{
		QPN: binary.LittleEndian.Uint32(b[0:]),
		PSN: binary.LittleEndian.Uint32(b[4:]),
		LID: binary.LittleEndian.Uint16(b[8:]),
		MTU: b[10], GRH: b[11],
	}
	copy(q.GID[:], b[12:28])
	return q
}

func (q qpInfo) valid() error {
	switch {
	case q.QPN == 0 || q.QPN >= 1<<24:
		return fmt.Errorf("queue pair number %d is outside 1..2^24-1", q.QPN)
	case q.PSN >= 1<<24:
		return fmt.Errorf("packet sequence number %d is outside 0..2^24-1", q.PSN)
	case q.MTU < 1 || q.MTU > 5:
		return fmt.Errorf("MTU code %d is outside 1..5", q.MTU)
	case q.GRH > 1:
		return fmt.Errorf("GRH flag %d is not 0 or 1", q.GRH)
	}
	return nil
}

// appendHello encodes a client's hello.
func appendHello(b []byte, q qpInfo, cred []byte) []byte {
	h := make([]byte, helloLen)
	copy(h, magic[:])
	binary.LittleEndian.PutUint16(h[4:], Version)
	binary.LittleEndian.PutUint32(h[8:], uint32(len(cred)))
	q.put(h[12:])
	return append(append(b, h...), cred...)
}

// helloError is a hello the server refuses, with the reply code to send.
type helloError struct {
	code uint16
	msg  string
}

func (e *helloError) Error() string { return "rdma/verbs: bad hello: " + e.msg }

// readHello reads a hello whose first four bytes (the magic) were already
// read into first.
func readHello(r io.Reader, first [4]byte) (qpInfo, []byte, error) {
	if first != magic {
		return qpInfo{}, nil, &helloError{codeBadMagic, fmt.Sprintf("magic %q", first[:])}
	}
	h := make([]byte, helloLen-4)
	if _, err := io.ReadFull(r, h); err != nil {
		return qpInfo{}, nil, &helloError{codeBadMagic, "truncated: " + err.Error()}
	}
	if v := binary.LittleEndian.Uint16(h[0:]); v != Version {
		return qpInfo{}, nil, &helloError{codeBadVersion, fmt.Sprintf("version %d, this server speaks %d", v, Version)}
	}
	if binary.LittleEndian.Uint16(h[2:]) != 0 {
		return qpInfo{}, nil, &helloError{codeBadMagic, "reserved bits set"}
	}
	n := binary.LittleEndian.Uint32(h[4:])
	if n > MaxCredential {
		return qpInfo{}, nil, &helloError{codeCredTooLong, fmt.Sprintf("credential of %d bytes, limit %d", n, MaxCredential)}
	}
	q := getQPInfo(h[8:])
	if err := q.valid(); err != nil {
		return qpInfo{}, nil, &helloError{codeBadMagic, err.Error()}
	}
	cred := make([]byte, n)
	if _, err := io.ReadFull(r, cred); err != nil {
		return qpInfo{}, nil, &helloError{codeBadMagic, "truncated credential: " + err.Error()}
	}
	return q, cred, nil
}

func encodeReply(code uint16, q qpInfo) []byte {
	b := make([]byte, replyLen)
	copy(b, magic[:])
	binary.LittleEndian.PutUint16(b[4:], Version)
	binary.LittleEndian.PutUint16(b[6:], code)
	q.put(b[8:])
	return b
}

// readReply reads the server's answer to a hello. A peer that speaks only
// rdma/tcp answers with that protocol's magic, which is reported as
// rdma.ErrNotSupported so the picker falls back to tcp.
func readReply(r io.Reader) (qpInfo, error) {
	b := make([]byte, replyLen)
	if _, err := io.ReadFull(r, b[:4]); err != nil {
		return qpInfo{}, fmt.Errorf("rdma/verbs: read handshake reply: %w", err)
	}
	if [4]byte(b[:4]) == tcpMagic {
		return qpInfo{}, &rdma.NotSupportedError{Feature: "verbs transport", Reason: "the peer's data plane serves only the tcp transport (no RDMA device there, or built without -tags verbs)"}
	}
	if [4]byte(b[:4]) != magic {
		return qpInfo{}, fmt.Errorf("rdma/verbs: handshake reply starts with %q: %w", b[:4], rdma.ErrProtocol)
	}
	if _, err := io.ReadFull(r, b[4:]); err != nil {
		return qpInfo{}, fmt.Errorf("rdma/verbs: read handshake reply: %w", err)
	}
	code := binary.LittleEndian.Uint16(b[6:])
	switch code {
	case codeAccept:
	case codeAuthFailed:
		return qpInfo{}, fmt.Errorf("rdma/verbs: the server refused the credential: %w", rdma.ErrAccessDenied)
	case codeShuttingDown:
		return qpInfo{}, fmt.Errorf("rdma/verbs: the server is shutting down: %w", rdma.ErrClosed)
	case codeBadVersion:
		return qpInfo{}, fmt.Errorf("rdma/verbs: the server speaks version %d, not %d: %w", binary.LittleEndian.Uint16(b[4:]), Version, rdma.ErrProtocol)
	default:
		return qpInfo{}, fmt.Errorf("rdma/verbs: the server refused the connection (code %d): %w", code, rdma.ErrProtocol)
	}
	q := getQPInfo(b[8:])
	if err := q.valid(); err != nil {
		return qpInfo{}, fmt.Errorf("rdma/verbs: server's queue pair: %s: %w", err, rdma.ErrProtocol)
	}
	return q, nil
}

// request is a RESOLVE: the client asks for the remote address and rkey of
// a segment, proving it holds the segment's key.
type request struct {
	Op    uint8
	Flags uint8
	Seg   uint64
	Key   rdma.Key
	Epoch uint64
}

func (q request) encode() []byte {
	b := make([]byte, requestLen)
	b[0], b[1] = q.Op, q.Flags
	binary.LittleEndian.PutUint64(b[8:], q.Seg)
	copy(b[16:32], q.Key[:])
	binary.LittleEndian.PutUint64(b[32:], q.Epoch)
	return b
}

func decodeRequest(b []byte) (request, error) {
	if len(b) != requestLen {
		return request{}, fmt.Errorf("rdma/verbs: request of %d bytes, want %d: %w", len(b), requestLen, rdma.ErrProtocol)
	}
	if b[2] != 0 || b[3] != 0 || binary.LittleEndian.Uint32(b[4:]) != 0 {
		return request{}, fmt.Errorf("rdma/verbs: request with reserved bytes set: %w", rdma.ErrProtocol)
	}
	q := request{Op: b[0], Flags: b[1], Seg: binary.LittleEndian.Uint64(b[8:]), Epoch: binary.LittleEndian.Uint64(b[32:])}
	copy(q.Key[:], b[16:32])
	return q, nil
}

// response answers a RESOLVE.
type response struct {
	Status uint16
	RKey   uint32
	Addr   uint64 // the segment's first byte in the server's address space
	Size   uint64
	Epoch  uint64 // the segment's current lease epoch
}

func (p response) encode() []byte {
	b := make([]byte, responseLen)
	binary.LittleEndian.PutUint16(b[0:], p.Status)
	binary.LittleEndian.PutUint32(b[4:], p.RKey)
	binary.LittleEndian.PutUint64(b[8:], p.Addr)
	binary.LittleEndian.PutUint64(b[16:], p.Size)
	binary.LittleEndian.PutUint64(b[24:], p.Epoch)
	return b
}

func decodeResponse(b []byte) (response, error) {
	if len(b) != responseLen {
		return response{}, fmt.Errorf("rdma/verbs: response of %d bytes, want %d: %w", len(b), responseLen, rdma.ErrProtocol)
	}
	if binary.LittleEndian.Uint16(b[2:]) != 0 {
		return response{}, fmt.Errorf("rdma/verbs: response with reserved bytes set: %w", rdma.ErrProtocol)
	}
	return response{
		Status: binary.LittleEndian.Uint16(b[0:]),
		RKey:   binary.LittleEndian.Uint32(b[4:]),
		Addr:   binary.LittleEndian.Uint64(b[8:]),
		Size:   binary.LittleEndian.Uint64(b[16:]),
		Epoch:  binary.LittleEndian.Uint64(b[24:]),
	}, nil
}

// statusErr maps a response status to the rdma sentinels.
func statusErr(st uint16, seg uint64) error {
	switch st {
	case statusOK:
		return nil
	case statusAccessDenied:
		return fmt.Errorf("rdma/verbs: segment %d: %w", seg, rdma.ErrAccessDenied)
	case statusSegmentLost:
		return fmt.Errorf("rdma/verbs: segment %d: %w", seg, rdma.ErrSegmentLost)
	case statusLeaseExpired:
		return fmt.Errorf("rdma/verbs: segment %d: %w", seg, rdma.ErrLeaseExpired)
	case statusUnsupported:
		return fmt.Errorf("rdma/verbs: segment %d: the server does not know this request: %w", seg, rdma.ErrNotSupported)
	case statusInternal:
		return fmt.Errorf("rdma/verbs: segment %d: the server failed to register the segment's memory with its RDMA device; see the server's log", seg)
	default:
		return fmt.Errorf("rdma/verbs: segment %d: status %d: %w", seg, st, rdma.ErrProtocol)
	}
}
