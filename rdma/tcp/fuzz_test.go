package tcp

import (
	"bytes"
	"testing"

	"github.com/farmem/farmem/rdma"
)

// The decoders face bytes from the network. Each fuzz target checks that
// decoding never panics and that whatever decodes re-encodes to the same
// bytes (no field is silently ignored).
//
//	go test -run '^$' -fuzz FuzzDecodeRequest -fuzztime 30s ./rdma/tcp

func FuzzDecodeRequest(f *testing.F) {
	for _, h := range []reqHeader{
		{id: 1, op: opRead, seg: 1, epoch: 1, off: 64, length: 4096},
		{id: 2, op: opWrite, seg: 1, length: 5, payloadLen: 5},
		{id: 3, op: opCAS, length: 8, arg0: 1, arg1: 2},
		{id: 4, op: opFADD, length: 8, arg0: 7},
		{id: 5, op: 99, flags: 1, payloadLen: 3},
		{id: 6, op: opFADD, flags: reqFlagOnce | reqFlagRetry, slot: 3, seq: 9, length: 8, arg0: 1},
		{id: 7, op: opXor, seg: 2, off: 24, length: 16, payloadLen: 16},
		{id: 8, op: opWrite, flags: reqFlagOnce | reqFlagForward, slot: 1, seq: 2, length: 8, payloadLen: 8 + originSize + 7},
	} {
		b := make([]byte, reqHeaderSize)
		encodeRequest(b, &h)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h reqHeader
		if err := decodeRequest(b, &h); err != nil {
			return
		}
		if h.payloadLen > maxRequestPayload(h.flags) || h.length > MaxPayload {
			t.Fatalf("decoded a header over the limits: %+v", h)
		}
		out := make([]byte, reqHeaderSize)
		encodeRequest(out, &h)
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, out)
		}
	})
}

func FuzzDecodeResponse(f *testing.F) {
	for _, h := range []respHeader{
		{id: 1, status: statusOK, payloadLen: 4096},
		{id: 2, status: statusOK, flags: respFlagSwapped, value: 9},
		{id: 3, status: statusLeaseExpired},
		{id: 4, status: statusIndeterminate},
	} {
		b := make([]byte, respHeaderSize)
		encodeResponse(b, &h)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h respHeader
		if err := decodeResponse(b, &h); err != nil {
			return
		}
		if h.payloadLen > MaxPayload || (h.status != statusOK && h.payloadLen != 0) {
			t.Fatalf("decoded an invalid header: %+v", h)
		}
		out := make([]byte, respHeaderSize)
		encodeResponse(out, &h)
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, out)
		}
	})
}

// FuzzHandshake feeds both handshake decoders: the server's hello reader and
// the client's reply decoder.
func FuzzHandshake(f *testing.F) {
	f.Add(appendHello(nil, hello{version: 1, cred: []byte("credential")}))
	f.Add(appendHello(nil, hello{version: Version, cred: nil}))
	f.Add(appendHello(nil, hello{version: Version, cred: []byte("credential"), session: [sessionIDSize]byte{1, 2, 3}, resume: true}))
	f.Add(appendHello(nil, hello{version: 7, cred: []byte("x")}))
	var rb [replySize]byte
	encodeReply(rb[:], reply{version: Version, maxPayload: MaxPayload})
	f.Add(rb[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, code, err := readHello(bytes.NewReader(b))
		if err == nil {
			if code != replyAccept || len(h.cred) > MaxCredential {
				t.Fatalf("accepted a bad hello: code %d, %d-byte credential", code, len(h.cred))
			}
			if out := appendHello(nil, h); !bytes.Equal(out, b[:len(out)]) {
				t.Fatalf("re-encoding differs:\n in %x\nout %x", b, out)
			}
		} else if code == replyAccept {
			t.Fatalf("error %v with an accepting code", err)
		}
		if len(b) >= replySize {
			r, err := decodeReply(b[:replySize])
			if err == nil {
				var out [replySize]byte
				encodeReply(out[:], r)
				if !bytes.Equal(out[:], b[:replySize]) {
					t.Fatalf("reply re-encoding differs:\n in %x\nout %x", b[:replySize], out)
				}
				_ = replyError("fuzz:1", r)
			}
		}
	})
}

// FuzzDecodeOrigin feeds the origin block decoder (the payload prefix of a
// forwarded op): whatever decodes re-encodes to the same bytes, and never
// names a slot past the session's.
func FuzzDecodeOrigin(f *testing.F) {
	for _, o := range []origin{
		{key: sessionKey{name: "p:poold/a/app", id: [sessionIDSize]byte{1, 2}}, slot: 3, seq: 9, value: 40},
		{key: sessionKey{name: "c:credential", id: [sessionIDSize]byte{9}}, slot: rdma.SessionSlots - 1, seq: 1 << 31, flags: respFlagSwapped, value: 7},
		{key: sessionKey{name: "p:"}, status: statusOK},
	} {
		f.Add(appendOrigin(nil, &o))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		o, err := decodeOrigin(b)
		if err != nil {
			return
		}
		if int(o.slot) >= rdma.SessionSlots || len(o.key.name) > MaxOriginName {
			t.Fatalf("decoded an invalid origin: %+v", o)
		}
		if out := appendOrigin(nil, &o); !bytes.Equal(out, b) {
			t.Fatalf("re-encoding differs:\n in %x\nout %x", b, out)
		}
	})
}
