package tcp

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/logsample"
	"github.com/farmem/farmem/internal/syncbuf"
)

// rawConn opens a plain TCP connection to addr, closed when the test ends.
func rawConn(t *testing.T, addr string) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	require.NoError(t, nc.SetDeadline(time.Now().Add(20*time.Second)))
	return nc
}

// handshake performs a good handshake on a raw connection.
func handshake(t *testing.T, nc net.Conn) {
	t.Helper()
	_, err := nc.Write(appendHello(nil, hello{version: Version}))
	require.NoError(t, err)
	require.Equal(t, replyAccept, readReply(t, nc).code)
}

func readReply(t *testing.T, nc net.Conn) reply {
	t.Helper()
	var b [replySize]byte
	_, err := io.ReadFull(nc, b[:])
	require.NoError(t, err)
	r, err := decodeReply(b[:])
	require.NoError(t, err)
	return r
}

func requestFrame(t *testing.T, h *reqHeader) []byte {
	t.Helper()
	b := make([]byte, reqHeaderSize)
	encodeRequest(b, h)
	return b
}

func readResponse(t *testing.T, nc net.Conn) respHeader {
	t.Helper()
	var b [respHeaderSize]byte
	_, err := io.ReadFull(nc, b[:])
	require.NoError(t, err)
	var h respHeader
	require.NoError(t, decodeResponse(b[:], &h))
	return h
}

// expectClosed reads until the server closes the connection; a timeout
// means the server kept it open.
func expectClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	_, err := io.Copy(io.Discard, nc)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "server kept the connection open: %v", err)
}

func TestMalformedHandshake(t *testing.T) {
	s := startServer(t, ServerConfig{})
	hb := appendHello(nil, hello{version: Version, cred: []byte("cred")})
	for _, tc := range []struct {
		name string
		send []byte
		code int // -1: no reply expected
	}{
		{"bad magic", append([]byte("XXXX"), hb[4:]...), int(replyBadMagic)},
		{"http", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), int(replyBadMagic)},
		{"version 0", appendHello(nil, hello{version: 0, cred: nil}), int(replyBadVersion)},
		{"version 3", appendHello(nil, hello{version: 3, cred: nil}), int(replyBadVersion)},
		{"undefined flag", func() []byte { b := bytes.Clone(hb); b[6] = 2; return b }(), int(replyBadMagic)},
		{"resume flag in version 1", func() []byte { b := appendHello(nil, hello{version: 1}); b[6] = 1; return b }(), int(replyBadMagic)},
		{"credential too long", appendHello(nil, hello{version: Version, cred: make([]byte, MaxCredential+1)})[:helloSize], int(replyCredTooLong)},
		{"truncated", hb[:7], -1},
		{"truncated credential", hb[:helloSize+2], -1},
		{"truncated session id", hb[:len(hb)-3], -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nc := rawConn(t, s.addr)
			_, err := nc.Write(tc.send)
			require.NoError(t, err)
			if tc.code < 0 {
				nc.(*net.TCPConn).CloseWrite()
			} else {
				require.EqualValues(t, tc.code, readReply(t, nc).code)
			}
			expectClosed(t, nc)
		})
	}
}

// TestMalformedFrames sends broken frames over a real connection: each one
// closes that connection without touching memory, and the server keeps
// serving another client.
func TestMalformedFrames(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 1, 4096)
	good := dial(t, s.addr, WithConns(1))
	valid := reqHeader{id: 1, op: opWrite, seg: 1, key: r.Key, epoch: 1, length: 8, payloadLen: 8}
	with := func(f func(h *reqHeader)) []byte {
		h := valid
		f(&h)
		return append(requestFrame(t, &h), bytes.Repeat([]byte{0xFF}, int(min(h.payloadLen, 64)))...)
	}
	patch := func(off int, v byte) []byte {
		b := append(requestFrame(t, &valid), bytes.Repeat([]byte{0xFF}, 8)...)
		b[off] = v
		return b
	}
	for _, tc := range []struct {
		name string
		send []byte
	}{
		{"reserved u16", patch(10, 1)},
		{"reserved u32", patch(61, 1)},
		{"oversized payload", with(func(h *reqHeader) { h.payloadLen, h.length = MaxPayload+1, MaxPayload+1 })},
		{"oversized read", with(func(h *reqHeader) { h.op, h.payloadLen, h.length = opRead, 0, math.MaxUint32 })},
		{"payload contradicts length", with(func(h *reqHeader) { h.payloadLen = 4 })},
		{"read with payload", with(func(h *reqHeader) { h.op = opRead })},
		{"cas with payload", with(func(h *reqHeader) { h.op = opCAS })},
		{"fadd with length 4", with(func(h *reqHeader) { h.op, h.payloadLen, h.length = opFADD, 0, 4 })},
		{"truncated header", requestFrame(t, &valid)[:40]},
		{"garbage", bytes.Repeat([]byte{0xFF}, 200)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := bytes.Clone(mem)
			nc := rawConn(t, s.addr)
			handshake(t, nc)
			_, err := nc.Write(tc.send)
			require.NoError(t, err)
			nc.(*net.TCPConn).CloseWrite()
			expectClosed(t, nc)
			require.Equal(t, before, mem, "a malformed frame touched memory")
			require.NoError(t, good.Write(t.Context(), r, 100, []byte("alive")), "server stopped serving others")
			copy(mem[100:], make([]byte, 5))
		})
	}
}

// TestRefusedFramesKeepTheConnection: well-formed requests that are refused
// are answered, consume their payload, and leave the connection usable.
func TestRefusedFramesKeepTheConnection(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 1, 4096)
	nc := rawConn(t, s.addr)
	handshake(t, nc)
	wrong := r.Key
	wrong[3] ^= 0x80
	payload := bytes.Repeat([]byte{0xAA}, 100)
	for _, tc := range []struct {
		name    string
		h       reqHeader
		payload []byte
		status  uint16
	}{
		{"unknown opcode", reqHeader{id: 10, op: 99, payloadLen: 100}, payload, statusUnsupported},
		{"flags", reqHeader{id: 11, op: opRead, flags: 1, length: 8, seg: 1, key: r.Key}, nil, statusUnsupported},
		{"wrong key write", reqHeader{id: 12, op: opWrite, seg: 1, key: wrong, length: 100, payloadLen: 100}, payload, statusAccessDenied},
		{"overflowing read", reqHeader{id: 13, op: opRead, seg: 1, key: r.Key, off: math.MaxUint64 - 7, length: 16}, nil, statusOutOfRange},
		{"overflowing write", reqHeader{id: 14, op: opWrite, seg: 1, key: r.Key, epoch: 1, off: math.MaxUint64 - 7, length: 100, payloadLen: 100}, payload, statusOutOfRange},
		{"overflowing cas", reqHeader{id: 15, op: opCAS, seg: 1, key: r.Key, epoch: 1, off: math.MaxUint64 - 7, length: 8}, nil, statusOutOfRange},
		{"unaligned fadd", reqHeader{id: 16, op: opFADD, seg: 1, key: r.Key, epoch: 1, off: 12, length: 8}, nil, statusUnaligned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := bytes.Clone(mem)
			_, err := nc.Write(append(requestFrame(t, &tc.h), tc.payload...))
			require.NoError(t, err)
			resp := readResponse(t, nc)
			require.Equal(t, tc.h.id, resp.id)
			require.Equal(t, tc.status, resp.status)
			require.Equal(t, before, mem)
		})
	}
	// Still in sync: a valid read works on the same connection.
	copy(mem, "synced")
	_, err := nc.Write(requestFrame(t, &reqHeader{id: 20, op: opRead, seg: 1, key: r.Key, length: 6}))
	require.NoError(t, err)
	require.Equal(t, "synced", string(readOKPayload(t, nc)))
}

// readOKPayload reads a response that must be OK and returns its payload.
func readOKPayload(t *testing.T, nc net.Conn) []byte {
	t.Helper()
	resp := readResponse(t, nc)
	require.Equal(t, statusOK, resp.status)
	got := make([]byte, resp.payloadLen)
	_, err := io.ReadFull(nc, got)
	require.NoError(t, err)
	return got
}

// TestTruncatedWritePayload: a WRITE cut short leaves at most a prefix of its
// payload in memory (a torn write, as with RDMA) and closes the connection.
func TestTruncatedWritePayload(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 1, 4096)
	nc := rawConn(t, s.addr)
	handshake(t, nc)
	frame := requestFrame(t, &reqHeader{id: 1, op: opWrite, seg: 1, key: r.Key, off: 1000, length: 1000, payloadLen: 1000})
	_, err := nc.Write(append(frame, bytes.Repeat([]byte{0xCC}, 300)...))
	require.NoError(t, err)
	nc.(*net.TCPConn).CloseWrite()
	expectClosed(t, nc)
	require.Equal(t, make([]byte, 1000), mem[:1000], "bytes before the write changed")
	require.Equal(t, make([]byte, 4096-1300), mem[1300:], "bytes past the received prefix changed")
}

// TestConnWarningsSampled: the warnings an authenticated client can
// provoke at will are sampled per message and principal. 1,000 malformed
// origin blocks on one connection (each answered PROTOCOL and observed),
// and 1,000 connections closed for a malformed frame, log one line each
// within a logsample.Interval; the next line, an Interval later, counts
// the ones held back.
func TestConnWarningsSampled(t *testing.T) {
	var logs syncbuf.Buffer
	var protocol atomic.Int64
	cfg := fwdConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.Observe = func(o Observation) {
		if o.Status == OpStatus(statusProtocol) {
			protocol.Add(1)
		}
	}
	s := startServer(t, cfg)
	_, r := s.export(t, 1, 4096)
	t0 := time.Unix(1000, 0)
	s.connLog.SetClock(func() time.Time { return t0 })
	const n = 1000

	org := origin{key: sessionKey{name: "c:someone", id: [sessionIDSize]byte{7}}, slot: 5, seq: 3}
	bad := appendOrigin(nil, &org)
	bad[33] = 1 // a reserved byte
	fwd := rawConn(t, s.addr)
	handshake(t, fwd)
	malformed := func(id uint64) {
		t.Helper()
		h := reqHeader{id: id, op: opWrite, flags: reqFlagOnce | reqFlagForward, slot: 1, seq: uint32(id), seg: 1, key: r.Key, epoch: 1, length: 4, payloadLen: uint32(len(bad) + 4)}
		_, err := fwd.Write(append(append(requestFrame(t, &h), bad...), 1, 2, 3, 4))
		require.NoError(t, err)
		require.Equal(t, statusProtocol, readResponse(t, fwd).status)
	}
	closed := func() {
		t.Helper()
		nc := rawConn(t, s.addr)
		handshake(t, nc)
		_, err := nc.Write(bytes.Repeat([]byte{0xFF}, reqHeaderSize))
		require.NoError(t, err)
		expectClosed(t, nc)
		nc.Close()
	}
	for id := range uint64(n) {
		malformed(id + 1)
	}
	for range n {
		closed()
	}
	require.Eventually(t, func() bool { return protocol.Load() == n }, 10*time.Second, time.Millisecond, "every malformed op is observed")
	origins, closes := strings.Count(logs.String(), "malformed origin block"), strings.Count(logs.String(), "closing connection")
	t.Logf("%d malformed origin blocks: %d lines; %d connections closed: %d lines", n, origins, n, closes)
	require.Equal(t, 1, origins)
	require.Equal(t, 1, closes)

	s.connLog.SetClock(func() time.Time { return t0.Add(logsample.Interval) })
	malformed(n + 1)
	closed()
	require.Equal(t, 2, strings.Count(logs.String(), fmt.Sprintf("suppressed_since_last=%d", n-1)), logs.String())
}
