package rdma_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/rdma"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestKeyRoundTrip(t *testing.T) {
	k, err := rdma.NewKey()
	require.NoError(t, err)
	require.False(t, k.IsZero())
	s := k.String()
	require.Len(t, s, 32)
	p, err := rdma.ParseKey(s)
	require.NoError(t, err)
	require.Equal(t, k, p)

	txt, err := k.MarshalText()
	require.NoError(t, err)
	var u rdma.Key
	require.NoError(t, u.UnmarshalText(txt))
	require.Equal(t, k, u)

	k2, err := rdma.NewKey()
	require.NoError(t, err)
	require.NotEqual(t, k, k2, "two random keys collided")
}

func TestParseKeyErrors(t *testing.T) {
	for _, tc := range []struct{ name, in string }{
		{"empty", ""},
		{"short", "abcd"},
		{"long", "00112233445566778899aabbccddeeff00"},
		{"not hex", "zz112233445566778899aabbccddeeff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := rdma.ParseKey(tc.in)
			require.Error(t, err)
		})
	}
}

func TestNotSupportedError(t *testing.T) {
	var err error = &rdma.NotSupportedError{Feature: "verbs transport", Reason: "built without the verbs tag"}
	require.ErrorIs(t, err, rdma.ErrNotSupported)
	require.ErrorIs(t, fmt.Errorf("wrapped: %w", err), rdma.ErrNotSupported)
	require.NotErrorIs(t, err, rdma.ErrAccessDenied)
	require.Contains(t, err.Error(), "verbs transport")
}

type fakeTransport struct {
	name string
	err  error
	hits int
}

func (f *fakeTransport) Name() string { return f.name }

func (f *fakeTransport) Dial(context.Context, string, []byte) (rdma.Conn, error) {
	f.hits++
	if f.err != nil {
		return nil, f.err
	}
	return fakeConn{}, nil
}

type fakeConn struct{ rdma.Conn }

func TestPick(t *testing.T) {
	unsupported := &rdma.NotSupportedError{Feature: "verbs", Reason: "no device"}
	refused := errors.New("connection refused")
	for _, tc := range []struct {
		name     string
		ts       []*fakeTransport
		wantName string
		wantErr  error
		wantHits []int
	}{
		{"first works", []*fakeTransport{{name: "verbs"}, {name: "tcp"}}, "verbs", nil, []int{1, 0}},
		{"fallback", []*fakeTransport{{name: "verbs", err: unsupported}, {name: "tcp"}}, "tcp", nil, []int{1, 1}},
		{"hard error stops", []*fakeTransport{{name: "verbs", err: refused}, {name: "tcp"}}, "", refused, []int{1, 0}},
		{"all unsupported", []*fakeTransport{{name: "verbs", err: unsupported}}, "", rdma.ErrNotSupported, []int{1}},
		{"none", nil, "", rdma.ErrNotSupported, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := make([]rdma.Transport, len(tc.ts))
			for i, f := range tc.ts {
				ts[i] = f
			}
			c, tr, err := rdma.Pick(t.Context(), "127.0.0.1:1", nil, ts...)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Nil(t, c)
			} else {
				require.NoError(t, err)
				require.Equal(t, tc.wantName, tr.Name())
			}
			for i, f := range tc.ts {
				require.Equal(t, tc.wantHits[i], f.hits, "transport %s", f.name)
			}
		})
	}
}

func TestOpKindString(t *testing.T) {
	require.Equal(t, "READ", rdma.OpRead.String())
	require.Equal(t, "FADD", rdma.OpFetchAdd.String())
	require.Equal(t, "OpKind(9)", rdma.OpKind(9).String())
}
