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
	b, err := AppendRequest(nil, Request{Session: "s-1", Segment: 42})
	require.NoError(t, err)
	r, err := ReadRequest(bytes.NewReader(b))
	require.NoError(t, err)
	require.Equal(t, Request{Session: "s-1", Segment: 42}, r)

	_, err = AppendRequest(nil, Request{Session: string(make([]byte, 300))})
	require.ErrorIs(t, err, ErrProtocol)
	_, err = ReadRequest(bytes.NewReader([]byte{9, 0, 0}))
	require.ErrorIs(t, err, ErrProtocol)
	_, err = ReadRequest(bytes.NewReader(b[:len(b)-1]))
	require.ErrorIs(t, err, ErrProtocol)
}

func TestResponseRoundTrip(t *testing.T) {
	r, err := decodeResponse(encodeResponse(nil, 4096, 1<<20))
	require.NoError(t, err)
	require.NoError(t, r.Err)
	require.Equal(t, int64(4096), r.Offset)
	require.Equal(t, int64(1<<20), r.Length)

	r, err = decodeResponse(encodeResponse(fmt.Errorf("segment 7: %w", errs.ErrAccessDenied), 0, 0))
	require.NoError(t, err)
	require.ErrorIs(t, r.Err, errs.ErrAccessDenied)
	require.Contains(t, r.Err.Error(), "segment 7")

	r, err = decodeResponse(encodeResponse(errors.New("disk on fire"), 0, 0))
	require.NoError(t, err)
	require.EqualError(t, r.Err, "disk on fire")
}

func FuzzDecode(f *testing.F) {
	f.Add(encodeResponse(nil, 1, 2))
	f.Add(encodeResponse(errs.ErrNotFound, 0, 0))
	req, _ := AppendRequest(nil, Request{Session: "abc", Segment: 1})
	f.Add(req)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if r, err := decodeResponse(b); err == nil && r.Err == nil && len(b) < 19 {
			t.Fatalf("accepted a %d-byte response", len(b))
		}
		_, _ = ReadRequest(bytes.NewReader(b))
	})
}
