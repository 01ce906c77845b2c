package dialer

import (
	"context"
	"errors"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/internal/verbs"
)

// scoped is a connection that knows what its device's atomics are atomic
// with: the verbs Conn.
type scoped interface {
	AtomicScope() verbs.AtomicScope
}

// routeAtomics returns conn as it is when its atomics may run on its
// device (see verbs.AtomicsOnDevice), else a connection that sends
// compare-and-swap and fetch-and-add over the tcp connection dialTCP opens,
// so that every atomic on a segment is executed by the home's CPU. A
// connection that does not report a scope (tcp) is returned as it is.
func routeAtomics(conn rdma.Conn, dialTCP func() (rdma.Conn, error)) (rdma.Conn, error) {
	sc, ok := conn.(scoped)
	if !ok || verbs.AtomicsOnDevice(sc.AtomicScope()) {
		return conn, nil
	}
	atomics, err := dialTCP()
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &splitConn{Conn: conn, atomics: atomics}, nil
}

// splitConn sends reads and writes over its device connection and atomics
// over the tcp connection. It is safe for concurrent use, as both are.
type splitConn struct {
	rdma.Conn           // reads and writes
	atomics   rdma.Conn // compare-and-swap and fetch-and-add
}

func (s *splitConn) CompareAndSwap64(ctx context.Context, r rdma.Region, off int64, old, new uint64) (uint64, bool, error) {
	return s.atomics.CompareAndSwap64(ctx, r, off, old, new)
}

func (s *splitConn) FetchAdd64(ctx context.Context, r rdma.Region, off int64, delta uint64) (uint64, error) {
	return s.atomics.FetchAdd64(ctx, r, off, delta)
}

// Do posts the reads and writes on the device connection and the atomics
// on the tcp one, and returns the first error in argument order.
func (s *splitConn) Do(ctx context.Context, ops ...*rdma.Op) error {
	var dev, cpu []*rdma.Op
	for _, op := range ops {
		if op == nil {
			continue
		}
		if op.Kind == rdma.OpCompareAndSwap || op.Kind == rdma.OpFetchAdd {
			cpu = append(cpu, op)
		} else {
			dev = append(dev, op)
		}
	}
	if len(dev) > 0 {
		s.Conn.Do(ctx, dev...)
	}
	if len(cpu) > 0 {
		s.atomics.Do(ctx, cpu...)
	}
	for _, op := range ops {
		if op != nil && op.Err != nil {
			return op.Err
		}
	}
	return nil
}

// Close closes both connections.
func (s *splitConn) Close() error {
	return errors.Join(s.atomics.Close(), s.Conn.Close())
}
