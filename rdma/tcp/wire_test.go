package tcp

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

func TestRequestRoundTrip(t *testing.T) {
	key, err := rdma.NewKey()
	require.NoError(t, err)
	for _, h := range []reqHeader{
		{id: 1, op: opRead, seg: 2, key: key, epoch: 3, off: 4, length: 4096},
		{id: 1 << 40, op: opWrite, seg: 7, key: key, off: 1 << 50, length: MaxPayload, payloadLen: MaxPayload},
		{id: 9, op: opCAS, length: 8, arg0: 1, arg1: 2},
		{id: 9, op: opFADD, length: 8, arg0: ^uint64(0)},
		{id: 5, op: 200, flags: 3, payloadLen: 17, length: 3},
	} {
		b := make([]byte, reqHeaderSize)
		encodeRequest(b, &h)
		var got reqHeader
		require.NoError(t, decodeRequest(b, &got))
		require.Equal(t, h, got)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	for _, h := range []respHeader{
		{id: 1, status: statusOK, payloadLen: 4096},
		{id: 2, status: statusOK, flags: respFlagSwapped, value: 42},
		{id: 3, status: statusAccessDenied},
	} {
		b := make([]byte, respHeaderSize)
		encodeResponse(b, &h)
		var got respHeader
		require.NoError(t, decodeResponse(b, &got))
		require.Equal(t, h, got)
	}
	b := make([]byte, respHeaderSize)
	encodeResponse(b, &respHeader{status: statusOutOfRange, payloadLen: 1})
	require.ErrorIs(t, decodeResponse(b, &respHeader{}), rdma.ErrProtocol)
}

func TestHelloRoundTrip(t *testing.T) {
	b := appendHello(nil, hello{version: Version, cred: []byte("secret")})
	h, code, err := readHello(bytes.NewReader(b))
	require.NoError(t, err)
	require.Equal(t, replyAccept, code)
	require.Equal(t, "secret", string(h.cred))

	var rb [replySize]byte
	encodeReply(rb[:], reply{version: Version, code: replyBusy, maxPayload: MaxPayload})
	r, err := decodeReply(rb[:])
	require.NoError(t, err)
	require.Equal(t, replyBusy, r.code)
	require.ErrorContains(t, replyError("h:1", r), "connection limit")
	r.code = replyBadVersion
	require.ErrorIs(t, replyError("h:1", r), rdma.ErrNotSupported)
}

func TestStatusErrors(t *testing.T) {
	for status, want := range map[uint16]error{
		statusAccessDenied: rdma.ErrAccessDenied,
		statusOutOfRange:   rdma.ErrOutOfRange,
		statusSegmentLost:  rdma.ErrSegmentLost,
		statusLeaseExpired: rdma.ErrLeaseExpired,
		statusUnaligned:    rdma.ErrUnaligned,
		statusProtocol:     rdma.ErrProtocol,
		statusUnsupported:  rdma.ErrNotSupported,
		statusMoved:        rdma.ErrMoved,
		999:                rdma.ErrProtocol,
	} {
		err := statusError(status, 0, rdma.OpRead, 1, 2, 3)
		require.ErrorIs(t, err, want, "status %d", status)
		require.Contains(t, err.Error(), "segment 1 offset 2")
	}
}
