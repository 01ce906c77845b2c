package tcp

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/internal/verbs"
)

// TestChecks covers every refusal a client can get for a single op, and
// checks that a refused op never changes memory.
func TestChecks(t *testing.T) {
	s := startServer(t, ServerConfig{})
	const size = 4096
	mem, r := s.export(t, 1, size)
	lostMem, lost := s.export(t, 2, size)
	_ = lostMem
	require.NoError(t, s.MarkLost(2))
	require.NoError(t, s.SetEpoch(1, 5))
	cur := r
	cur.Epoch = 5
	c := dial(t, s.addr)
	ctx := t.Context()

	wrongKey := cur
	wrongKey.Key[0] ^= 1
	unknown := cur
	unknown.Segment = 99
	zeroKey := cur
	zeroKey.Key = rdma.Key{}

	type opFn func(rdma.Region, int64) error
	read := func(n int) opFn {
		return func(r rdma.Region, off int64) error { return c.Read(ctx, r, off, make([]byte, n)) }
	}
	write := func(n int) opFn {
		return func(r rdma.Region, off int64) error { return c.Write(ctx, r, off, make([]byte, n)) }
	}
	cas := func(r rdma.Region, off int64) error {
		_, _, err := c.CompareAndSwap64(ctx, r, off, 0, 1)
		return err
	}
	fadd := func(r rdma.Region, off int64) error {
		_, err := c.FetchAdd64(ctx, r, off, 1)
		return err
	}

	for _, tc := range []struct {
		name string
		fn   opFn
		r    rdma.Region
		off  int64
		want error
	}{
		{"read wrong key", read(8), wrongKey, 0, rdma.ErrAccessDenied},
		{"write wrong key", write(100), wrongKey, 0, rdma.ErrAccessDenied},
		{"cas wrong key", cas, wrongKey, 0, rdma.ErrAccessDenied},
		{"fadd zero key", fadd, zeroKey, 0, rdma.ErrAccessDenied},
		{"unknown segment", read(8), unknown, 0, rdma.ErrAccessDenied},
		{"read lost", read(8), lost, 0, rdma.ErrSegmentLost},
		{"write lost", write(8), lost, 0, rdma.ErrSegmentLost},
		{"write stale epoch", write(8), r, 0, rdma.ErrLeaseExpired},
		{"cas stale epoch", cas, r, 0, rdma.ErrLeaseExpired},
		{"fadd stale epoch", fadd, r, 0, rdma.ErrLeaseExpired},
		{"read past end", read(2), cur, size - 1, rdma.ErrOutOfRange},
		{"read at end", read(1), cur, size, rdma.ErrOutOfRange},
		{"write past end", write(size + 1), cur, 0, rdma.ErrOutOfRange},
		{"read huge offset", read(8), cur, math.MaxInt64 - 8, rdma.ErrOutOfRange},
		{"read overflowing offset", read(16), cur, math.MaxInt64 - 8, rdma.ErrOutOfRange},
		{"negative offset", read(8), cur, -8, rdma.ErrOutOfRange},
		{"cas past end", cas, cur, size, rdma.ErrOutOfRange},
		{"fadd unaligned", fadd, cur, 4, rdma.ErrUnaligned},
		{"cas unaligned", cas, cur, 1, rdma.ErrUnaligned},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := string(mem)
			err := tc.fn(tc.r, tc.off)
			require.ErrorIs(t, err, tc.want)
			require.Equal(t, before, string(mem), "a refused op changed memory")
		})
	}

	t.Run("read with stale epoch is allowed", func(t *testing.T) {
		require.NoError(t, c.Read(ctx, r, 0, make([]byte, 8)))
	})
	t.Run("the connection survives refusals", func(t *testing.T) {
		require.NoError(t, c.Write(ctx, cur, 0, []byte("still here")))
		require.Equal(t, "still here", string(mem[:10]))
	})
	t.Run("zero length at the end is in range", func(t *testing.T) {
		require.NoError(t, c.Read(ctx, cur, size, nil))
	})
}

func TestExporterErrors(t *testing.T) {
	s := NewServer(ServerConfig{Logger: quietLogger()})
	defer s.Close()
	mem := mapMem(t, 4096)

	_, err := s.Export(1, nil, 0)
	require.Error(t, err)
	_, err = s.Export(1, mem[1:], 0)
	require.ErrorContains(t, err, "aligned")

	k1, err := s.Export(1, mem, 3)
	require.NoError(t, err)
	_, err = s.Export(1, mem, 3)
	require.ErrorIs(t, err, rdma.ErrAlreadyExported)

	k2, err := s.Export(2, mem[8:], 0)
	require.NoError(t, err)
	require.NotEqual(t, k1, k2)

	require.NoError(t, s.SetEpoch(1, 3))
	require.NoError(t, s.SetEpoch(1, 4))
	require.ErrorContains(t, s.SetEpoch(1, 2), "epochs only grow")

	require.ErrorIs(t, s.Revoke(9), rdma.ErrNotExported)
	require.ErrorIs(t, s.SetEpoch(9, 1), rdma.ErrNotExported)
	require.ErrorIs(t, s.MarkLost(9), rdma.ErrNotExported)

	require.NoError(t, s.Revoke(1))
	require.ErrorIs(t, s.Revoke(1), rdma.ErrNotExported)
	require.NoError(t, s.Revoke(2))

	// A restarting daemon re-exports under the key clients hold.
	require.ErrorContains(t, s.ExportKey(3, mem, 0, rdma.Key{}), "zero key")
	require.NoError(t, s.ExportKey(3, mem, 0, k1))
	require.ErrorIs(t, s.ExportKey(3, mem, 0, k1), rdma.ErrAlreadyExported)
	require.NoError(t, s.Revoke(3))

	// The id is free again.
	_, err = s.Export(1, mem, 0)
	require.NoError(t, err)
	require.NoError(t, s.Revoke(1))
}

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	require.NoError(t, ServerConfig{}.Validate())
	for _, tc := range []struct {
		name string
		cfg  ServerConfig
		want string
	}{
		{"inflight negative", ServerConfig{MaxInflightPerConn: -1}, "MaxInflightPerConn"},
		{"inflight huge", ServerConfig{MaxInflightPerConn: 5000}, "MaxInflightPerConn"},
		{"conns", ServerConfig{MaxConns: -1}, "MaxConns"},
		{"handshake", ServerConfig{HandshakeTimeout: -1}, "HandshakeTimeout"},
		{"write", ServerConfig{WriteTimeout: -1}, "WriteTimeout"},
		{"buffer", ServerConfig{ReadBufferSize: 100}, "ReadBufferSize"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			require.ErrorContains(t, err, tc.want)
			// An invalid server is inert: it refuses exports and serving.
			s := NewServer(tc.cfg)
			_, xerr := s.Export(1, mapMem(t, 8), 0)
			require.Equal(t, err, xerr)
			require.NoError(t, s.Close())
		})
	}
}

func TestHandshake(t *testing.T) {
	secret := []byte("pool secret")
	s := startServer(t, ServerConfig{Authenticate: func(cred []byte) error {
		if string(cred) != string(secret) {
			return errors.New("wrong secret")
		}
		return nil
	}})
	ctx := t.Context()

	c, err := Dial(ctx, s.addr, WithCredential(secret), WithConns(1))
	require.NoError(t, err)
	require.NoError(t, c.Close())
	require.NoError(t, c.Close(), "Close is idempotent")

	_, err = Dial(ctx, s.addr, WithCredential([]byte("guess")))
	require.ErrorIs(t, err, rdma.ErrAccessDenied)

	_, err = Dial(ctx, s.addr, WithCredential(make([]byte, MaxCredential+1)))
	require.ErrorContains(t, err, "credential")

	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = Dial(cctx, s.addr, WithCredential(secret))
	require.ErrorIs(t, err, context.Canceled)
}

func TestMaxConns(t *testing.T) {
	s := startServer(t, ServerConfig{MaxConns: 2})
	c := dial(t, s.addr, WithConns(2))
	_ = c
	_, err := Dial(t.Context(), s.addr, WithConns(1))
	require.ErrorContains(t, err, "connection limit")
}

// TestPick checks that the picker skips the verbs stub and lands on tcp.
func TestPick(t *testing.T) {
	s := startServer(t, ServerConfig{})
	mem, r := s.export(t, 1, 4096)
	conn, tr, err := rdma.Pick(t.Context(), s.addr, nil, verbs.Transport{}, NewTransport(WithConns(1)))
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "tcp", tr.Name())
	require.NoError(t, conn.Write(t.Context(), r, 0, []byte("picked")))
	require.Equal(t, "picked", string(mem[:6]))

	_, err = NewTransport().Dial(t.Context(), "127.0.0.1:1", nil)
	require.Error(t, err)
}
