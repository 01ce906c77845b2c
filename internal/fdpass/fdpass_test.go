package fdpass

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/internal/errs"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRequestRoundTrip(t *testing.T) {
	for _, want := range []Request{
		{Op: OpGet, Session: "s-1", Segment: 42},
		{Op: OpFree, Session: "s-2", Segment: 7},
		{Op: OpAlloc, Session: "s-3", Body: []byte("proto bytes")},
	} {
		b, err := AppendRequest(nil, want)
		require.NoError(t, err)
		r, err := ReadRequest(bytes.NewReader(b))
		require.NoError(t, err)
		require.Equal(t, want, r)
		_, err = ReadRequest(bytes.NewReader(b[:len(b)-1]))
		require.ErrorIs(t, err, ErrProtocol)
	}
	_, err := AppendRequest(nil, Request{Op: OpGet, Session: string(make([]byte, 300))})
	require.ErrorIs(t, err, ErrProtocol)
	_, err = AppendRequest(nil, Request{Op: 9})
	require.ErrorIs(t, err, ErrProtocol)
	_, err = AppendRequest(nil, Request{Op: OpAlloc, Body: make([]byte, MaxBody+1)})
	require.ErrorIs(t, err, ErrProtocol)
	for _, bad := range [][]byte{
		{9, 1, 0, 0},                      // version
		{version, 9, 0, 0, 0, 0, 0, 0},    // op
		{version, 1, 0, 0, 0, 0, 0, 4},    // GET body of 4 bytes
		{version, 2, 0, 0, 0xff, 0, 0, 0}, // oversized body
	} {
		_, err := ReadRequest(bytes.NewReader(bad))
		require.ErrorIs(t, err, ErrProtocol, "%x", bad)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	r, err := decodeResponse(encodeResponse(nil, 4096, 1<<20, []byte("seg")))
	require.NoError(t, err)
	require.NoError(t, r.Err)
	require.Equal(t, int64(4096), r.Offset)
	require.Equal(t, int64(1<<20), r.Length)
	require.Equal(t, "seg", string(r.Body))

	r, err = decodeResponse(encodeResponse(fmt.Errorf("segment 7: %w", errs.ErrAccessDenied), 0, 0, nil))
	require.NoError(t, err)
	require.ErrorIs(t, r.Err, errs.ErrAccessDenied)
	require.Contains(t, r.Err.Error(), "segment 7")

	r, err = decodeResponse(encodeResponse(errors.New("disk on fire"), 0, 0, nil))
	require.NoError(t, err)
	require.EqualError(t, r.Err, "disk on fire")
}

func FuzzDecode(f *testing.F) {
	f.Add(encodeResponse(nil, 1, 2, nil))
	f.Add(encodeResponse(errs.ErrNotFound, 0, 0, nil))
	f.Add(encodeResponse(nil, 0, 4096, []byte("segment proto")))
	for _, r := range []Request{{Op: OpGet, Session: "abc", Segment: 1}, {Op: OpAlloc, Session: "s", Body: []byte{8, 1}}, {Op: OpFree, Segment: 3}, {Op: OpRelease, Session: "s", Segment: 9}} {
		req, _ := AppendRequest(nil, r)
		f.Add(req)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeResponse(b); err == nil && r.Err == nil && len(b) < 23 {
			t.Fatalf("accepted a %d-byte response", len(b))
		}
		_, _ = ReadRequest(bytes.NewReader(b))
	})
}
