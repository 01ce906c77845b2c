package verbs

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

func testQP() qpInfo {
	q := qpInfo{QPN: 0x1234, PSN: 0xabcdef, LID: 7, MTU: 3, GRH: 1}
	copy(q.GID[:], []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 169, 254, 77, 1})
	return q
}

func TestHelloRoundTrip(t *testing.T) {
	for _, cred := range [][]byte{nil, []byte("token"), bytes.Repeat([]byte{1}, MaxCredential)} {
		b := appendHello(nil, testQP(), cred)
		require.Len(t, b, helloLen+len(cred))
		r := bytes.NewReader(b[4:])
		q, got, err := readHello(r, [4]byte(b[:4]))
		require.NoError(t, err)
		require.Equal(t, testQP(), q)
		require.Equal(t, len(cred), len(got))
	}
}

func TestHelloRefused(t *testing.T) {
	good := appendHello(nil, testQP(), nil)
	tests := []struct {
		name string
		mod  func([]byte) []byte
		code uint16
	}{
		{"tcp magic", func(b []byte) []byte { copy(b, tcpMagic[:]); return b }, codeBadMagic},
		{"version", func(b []byte) []byte { b[4] = 9; return b }, codeBadVersion},
		{"reserved", func(b []byte) []byte { b[6] = 1; return b }, codeBadMagic},
		{"credential too long", func(b []byte) []byte { b[9] = 0x20; return b }, codeCredTooLong},
		{"zero qpn", func(b []byte) []byte { copy(b[12:16], []byte{0, 0, 0, 0}); return b }, codeBadMagic},
		{"mtu", func(b []byte) []byte { b[12+10] = 9; return b }, codeBadMagic},
		{"truncated", func(b []byte) []byte { return b[:20] }, codeBadMagic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := tt.mod(bytes.Clone(good))
			_, _, err := readHello(bytes.NewReader(b[4:]), [4]byte(b[:4]))
			var he *helloError
			require.ErrorAs(t, err, &he)
			require.Equal(t, tt.code, he.code)
		})
	}
}

func TestReply(t *testing.T) {
	q, err := readReply(bytes.NewReader(encodeReply(codeAccept, testQP())))
	require.NoError(t, err)
	require.Equal(t, testQP(), q)

	tests := []struct {
		name string
		b    []byte
		want error
	}{
		{"auth", encodeReply(codeAuthFailed, qpInfo{}), rdma.ErrAccessDenied},
		{"shutting down", encodeReply(codeShuttingDown, qpInfo{}), rdma.ErrClosed},
		{"internal", encodeReply(codeInternal, qpInfo{}), rdma.ErrProtocol},
		{"bad qp", encodeReply(codeAccept, qpInfo{}), rdma.ErrProtocol},
		// What rdma/tcp answers a verbs hello with: the picker must fall back.
		{"tcp server", append(tcpMagic[:], 1, 0, 1, 0, 0, 0, 0, 0), rdma.ErrNotSupported},
		{"garbage", []byte("HTTP/1.1 400 Bad Request\r\n\r\n..........."), rdma.ErrProtocol},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := readReply(bytes.NewReader(tt.b))
			require.ErrorIs(t, err, tt.want)
		})
	}
}

func TestRequestResponse(t *testing.T) {
	q := request{Op: opResolve, Flags: flagWrite, Seg: 99, Key: rdma.Key{1, 2, 3}, Epoch: 5}
	got, err := decodeRequest(q.encode())
	require.NoError(t, err)
	require.Equal(t, q, got)
	b := q.encode()
	b[5] = 1
	_, err = decodeRequest(b)
	require.ErrorIs(t, err, rdma.ErrProtocol)
	_, err = decodeRequest(b[:10])
	require.ErrorIs(t, err, rdma.ErrProtocol)

	p := response{Status: statusOK, RKey: 0xfeed, Addr: 0x7f0000000000, Size: 1 << 20, Epoch: 3}
	gp, err := decodeResponse(p.encode())
	require.NoError(t, err)
	require.Equal(t, p, gp)
	pb := p.encode()
	pb[2] = 1
	_, err = decodeResponse(pb)
	require.ErrorIs(t, err, rdma.ErrProtocol)
}

func TestStatusErr(t *testing.T) {
	tests := []struct {
		st   uint16
		want error
	}{
		{statusAccessDenied, rdma.ErrAccessDenied},
		{statusSegmentLost, rdma.ErrSegmentLost},
		{statusLeaseExpired, rdma.ErrLeaseExpired},
		{statusUnsupported, rdma.ErrNotSupported},
		{99, rdma.ErrProtocol},
	}
	require.NoError(t, statusErr(statusOK, 1))
	for _, tt := range tests {
		require.ErrorIs(t, statusErr(tt.st, 1), tt.want, "status %d", tt.st)
	}
	// An internal failure is no answer about the segment: callers retry.
	err := statusErr(statusInternal, 1)
	require.Error(t, err)
	for _, s := range []error{rdma.ErrAccessDenied, rdma.ErrSegmentLost, rdma.ErrLeaseExpired, rdma.ErrOutOfRange} {
		require.False(t, errors.Is(err, s))
	}
}

// FuzzReadHello: any bytes are refused or parsed, never a panic, and a
// parsed hello re-encodes to the same bytes.
func FuzzReadHello(f *testing.F) {
	f.Add(appendHello(nil, testQP(), []byte("cred")))
	f.Add(appendHello(nil, testQP(), nil)[:15])
	f.Add([]byte("FMRD\x01\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < 4 {
			return
		}
		q, cred, err := readHello(bytes.NewReader(b[4:]), [4]byte(b[:4]))
		if err != nil {
			return
		}
		require.Equal(t, b[:helloLen+len(cred)], appendHello(nil, q, cred))
	})
}
