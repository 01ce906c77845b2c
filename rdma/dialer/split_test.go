package dialer

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/internal/verbs"
)

// fakeConn records which ops reach it.
type fakeConn struct {
	name   string
	got    []rdma.OpKind
	msgs   int // Message calls
	closed bool
}

func (f *fakeConn) Read(context.Context, rdma.Region, int64, []byte) error {
	f.got = append(f.got, rdma.OpRead)
	return nil
}

func (f *fakeConn) Write(context.Context, rdma.Region, int64, []byte) error {
	f.got = append(f.got, rdma.OpWrite)
	return nil
}

func (f *fakeConn) CompareAndSwap64(context.Context, rdma.Region, int64, uint64, uint64) (uint64, bool, error) {
	f.got = append(f.got, rdma.OpCompareAndSwap)
	return 0, true, nil
}

func (f *fakeConn) FetchAdd64(context.Context, rdma.Region, int64, uint64) (uint64, error) {
	f.got = append(f.got, rdma.OpFetchAdd)
	return 0, nil
}

func (f *fakeConn) Do(_ context.Context, ops ...*rdma.Op) error {
	for _, op := range ops {
		if op == nil {
			continue
		}
		f.got = append(f.got, op.Kind)
		if op.Kind == rdma.OpFetchAdd && op.Delta == 0 {
			op.Err = errors.New(f.name + " refused")
		}
	}
	return nil
}

func (f *fakeConn) Message(_ context.Context, _ rdma.Region, req, resp []byte) (int, error) {
	f.msgs++
	return copy(resp, req), nil
}

func (f *fakeConn) Close() error { f.closed = true; return nil }

// deviceConn is a verbs connection whose device reports scope.
type deviceConn struct {
	fakeConn
	scope verbs.AtomicScope
}

func (d *deviceConn) AtomicScope() verbs.AtomicScope { return d.scope }

// dialOnce returns a dialTCP that hands out c and counts its calls.
func dialOnce(c rdma.Conn, dials *int) func(context.Context) (rdma.Conn, error) {
	return func(context.Context) (rdma.Conn, error) {
		*dials++
		return c, nil
	}
}

// TestRouteAtomics: atomics stay on the device only when its atomics are
// atomic with the CPU's (IBV_ATOMIC_GLOB); otherwise they go over tcp,
// where the home's CPU runs them, and reads and writes stay on the device.
// Messages, which the verbs control protocol lacks, always go over tcp,
// dialed on the first message when the atomics did not need it.
func TestRouteAtomics(t *testing.T) {
	for _, tc := range []struct {
		scope    verbs.AtomicScope
		onDevice bool
	}{
		{verbs.AtomicGlobal, true},
		{verbs.AtomicHCA, false},
		{verbs.AtomicNone, false},
	} {
		dev := &deviceConn{fakeConn: fakeConn{name: "device"}, scope: tc.scope}
		tcpc := &fakeConn{name: "tcp"}
		var dials int
		ctx := t.Context()
		conn, err := split(ctx, dev, dialOnce(tcpc, &dials))
		require.NoError(t, err)
		require.Equal(t, tc.onDevice, verbs.AtomicsOnDevice(tc.scope))
		_, err = conn.FetchAdd64(ctx, rdma.Region{}, 0, 1)
		require.NoError(t, err)
		_, _, err = conn.CompareAndSwap64(ctx, rdma.Region{}, 0, 0, 1)
		require.NoError(t, err)
		require.NoError(t, conn.Write(ctx, rdma.Region{}, 0, []byte{1}))
		err = conn.Do(ctx,
			&rdma.Op{Kind: rdma.OpRead}, &rdma.Op{Kind: rdma.OpFetchAdd, Delta: 1},
			&rdma.Op{Kind: rdma.OpWrite}, &rdma.Op{Kind: rdma.OpCompareAndSwap}, nil)
		require.NoError(t, err)
		atomics := []rdma.OpKind{rdma.OpFetchAdd, rdma.OpCompareAndSwap, rdma.OpFetchAdd, rdma.OpCompareAndSwap}
		if tc.onDevice {
			require.Zero(t, dials, "no tcp connection before a message")
			require.Equal(t, []rdma.OpKind{rdma.OpFetchAdd, rdma.OpCompareAndSwap, rdma.OpWrite, rdma.OpRead, rdma.OpFetchAdd, rdma.OpWrite, rdma.OpCompareAndSwap}, dev.got)
			require.Empty(t, tcpc.got)
		} else {
			require.Equal(t, 1, dials)
			require.Equal(t, atomics, tcpc.got, "scope %d: atomics over tcp", tc.scope)
			require.Equal(t, []rdma.OpKind{rdma.OpWrite, rdma.OpRead, rdma.OpWrite}, dev.got, "scope %d: reads and writes on the device", tc.scope)
			ops := []*rdma.Op{{Kind: rdma.OpWrite}, {Kind: rdma.OpFetchAdd}}
			require.ErrorContains(t, conn.Do(ctx, ops...), "tcp refused", "the tcp side's error is returned")
		}
		resp := make([]byte, 4)
		for range 2 {
			n, err := conn.Message(ctx, rdma.Region{}, []byte("ping"), resp)
			require.NoError(t, err)
			require.Equal(t, "ping", string(resp[:n]))
		}
		require.Equal(t, 2, tcpc.msgs, "scope %d: messages over tcp", tc.scope)
		require.Zero(t, dev.msgs)
		require.Equal(t, 1, dials, "one tcp connection, dialed once")
		require.NoError(t, conn.Close())
		require.True(t, dev.closed && tcpc.closed)
		_, err = conn.Message(ctx, rdma.Region{}, nil, resp)
		require.ErrorIs(t, err, rdma.ErrClosed, "no redial after Close")
	}
}

// TestRouteAtomicsDialFails: when the tcp connection for atomics cannot be
// dialed, the device connection is closed and the error returned; a tcp
// connection is returned as it is.
func TestRouteAtomicsDialFails(t *testing.T) {
	dev := &deviceConn{scope: verbs.AtomicHCA}
	boom := errors.New("no tcp")
	_, err := split(t.Context(), dev, func(context.Context) (rdma.Conn, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	require.True(t, dev.closed)
	tcpc := &fakeConn{}
	conn, err := split(t.Context(), tcpc, func(context.Context) (rdma.Conn, error) { t.Fatal("dialed for a tcp connection"); return nil, nil })
	require.NoError(t, err)
	require.Same(t, rdma.Conn(tcpc), conn)
}
