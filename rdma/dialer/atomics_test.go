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

func (f *fakeConn) Close() error { f.closed = true; return nil }

// deviceConn is a verbs connection whose device reports scope.
type deviceConn struct {
	fakeConn
	scope verbs.AtomicScope
}

func (d *deviceConn) AtomicScope() verbs.AtomicScope { return d.scope }

// TestRouteAtomics: atomics stay on the device only when its atomics are
// atomic with the CPU's (IBV_ATOMIC_GLOB); otherwise they go over tcp,
// where the home's CPU runs them, and reads and writes stay on the device.
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
		conn, err := routeAtomics(dev, func() (rdma.Conn, error) { return tcpc, nil })
		require.NoError(t, err)
		require.Equal(t, tc.onDevice, verbs.AtomicsOnDevice(tc.scope))
		ctx := t.Context()
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
			require.Same(t, rdma.Conn(dev), conn)
			require.Empty(t, tcpc.got)
			continue
		}
		require.Equal(t, atomics, tcpc.got, "scope %d: atomics over tcp", tc.scope)
		require.Equal(t, []rdma.OpKind{rdma.OpWrite, rdma.OpRead, rdma.OpWrite}, dev.got, "scope %d: reads and writes on the device", tc.scope)
		ops := []*rdma.Op{{Kind: rdma.OpWrite}, {Kind: rdma.OpFetchAdd}}
		require.ErrorContains(t, conn.Do(ctx, ops...), "tcp refused", "the tcp side's error is returned")
		require.NoError(t, conn.Close())
		require.True(t, dev.closed && tcpc.closed)
	}
}

// TestRouteAtomicsDialFails: when the tcp connection for atomics cannot be
// dialed, the device connection is closed and the error returned.
func TestRouteAtomicsDialFails(t *testing.T) {
	dev := &deviceConn{scope: verbs.AtomicHCA}
	boom := errors.New("no tcp")
	_, err := routeAtomics(dev, func() (rdma.Conn, error) { return nil, boom })
	require.ErrorIs(t, err, boom)
	require.True(t, dev.closed)
	tcpc := &fakeConn{}
	conn, err := routeAtomics(tcpc, func() (rdma.Conn, error) { t.Fatal("dialed for a tcp connection"); return nil, nil })
	require.NoError(t, err)
	require.Same(t, rdma.Conn(tcpc), conn)
}
