package dialer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/internal/verbs"
)

// scoped is a connection that knows what its device's atomics are atomic
// with: the verbs Conn.
type scoped interface {
	AtomicScope() verbs.AtomicScope
}

// split returns conn as it is when it is not a device connection (tcp),
// else a splitConn that sends over a tcp connection to the same data plane
// (dialTCP opens it) what the device connection cannot carry: messages
// (the verbs control protocol has none), and the atomics unless the
// device's are atomic with the CPU's (see verbs.AtomicsOnDevice), so that
// every atomic on a segment is executed by the home's CPU. The tcp
// connection is dialed at once for atomics, else on the first message.
func split(ctx context.Context, conn rdma.Conn, dialTCP func(context.Context) (rdma.Conn, error)) (rdma.Conn, error) {
	sc, ok := conn.(scoped)
	if !ok {
		return conn, nil
	}
	s := &splitConn{Conn: conn, atomicsOnTCP: !verbs.AtomicsOnDevice(sc.AtomicScope()), dialTCP: dialTCP}
	if s.atomicsOnTCP {
		if _, err := s.tcpConn(ctx); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return s, nil
}

// splitConn sends reads and writes, and atomics the device runs, over its
// device connection, and messages and other atomics over a tcp
// connection. It is safe for concurrent use, as both are.
type splitConn struct {
	rdma.Conn    // the device connection
	atomicsOnTCP bool
	dialTCP      func(context.Context) (rdma.Conn, error)

	mu     sync.Mutex
	tcp    rdma.Conn // nil until dialed
	closed bool
}

// tcpConn returns the tcp connection, dialing it on first use.
func (s *splitConn) tcpConn(ctx context.Context) (rdma.Conn, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("rdma/dialer: tcp side of a verbs connection: %w", rdma.ErrClosed)
	}
	if s.tcp == nil {
		c, err := s.dialTCP(ctx)
		if err != nil {
			return nil, err
		}
		s.tcp = c
	}
	return s.tcp, nil
}

// atomics is the connection that runs atomics.
func (s *splitConn) atomics(ctx context.Context) (rdma.Conn, error) {
	if !s.atomicsOnTCP {
		return s.Conn, nil
	}
	return s.tcpConn(ctx)
}

func (s *splitConn) CompareAndSwap64(ctx context.Context, r rdma.Region, off int64, old, new uint64) (uint64, bool, error) {
	c, err := s.atomics(ctx)
	if err != nil {
		return 0, false, err
	}
	return c.CompareAndSwap64(ctx, r, off, old, new)
}

func (s *splitConn) FetchAdd64(ctx context.Context, r rdma.Region, off int64, delta uint64) (uint64, error) {
	c, err := s.atomics(ctx)
	if err != nil {
		return 0, err
	}
	return c.FetchAdd64(ctx, r, off, delta)
}

// Message goes over the tcp connection.
func (s *splitConn) Message(ctx context.Context, r rdma.Region, req, resp []byte) (int, error) {
	c, err := s.tcpConn(ctx)
	if err != nil {
		return 0, err
	}
	return c.Message(ctx, r, req, resp)
}

// Do posts the reads and writes on the device connection and the atomics
// on the connection that runs them, and returns the first error in
// argument order.
func (s *splitConn) Do(ctx context.Context, ops ...*rdma.Op) error {
	if !s.atomicsOnTCP {
		return s.Conn.Do(ctx, ops...)
	}
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
		if c, err := s.tcpConn(ctx); err == nil {
			c.Do(ctx, cpu...)
		} else {
			for _, op := range cpu {
				op.Err = err
			}
		}
	}
	for _, op := range ops {
		if op != nil && op.Err != nil {
			return op.Err
		}
	}
	return nil
}

// Close closes both connections. Idempotent.
func (s *splitConn) Close() error {
	s.mu.Lock()
	tcp := s.tcp
	s.tcp, s.closed = nil, true
	s.mu.Unlock()
	var err error
	if tcp != nil {
		err = tcp.Close()
	}
	return errors.Join(err, s.Conn.Close())
}
