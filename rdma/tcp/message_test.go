package tcp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

func TestMessage(t *testing.T) {
	release := make(chan struct{})
	cfg := ServerConfig{Message: func(ctx context.Context, m MessageCall) ([]byte, error) {
		seg, mem, req, maxResp := m.Seg, m.Mem, m.Req, m.MaxResp
		switch string(req) {
		case "lost":
			return nil, fmt.Errorf("test: %w", rdma.ErrSegmentLost)
		case "big":
			return make([]byte, maxResp+1), nil
		case "hang":
			<-ctx.Done() // only Close ends it
		case "block":
			select { // a long poll: ends when released or the server closes
			case <-release:
			case <-ctx.Done():
			}
		}
		return append([]byte(fmt.Sprintf("seg %d mem %d: ", seg, len(mem))), req...), nil
	}}
	s := startServer(t, cfg)
	_, r := s.export(t, 7, 4096)
	c := dial(t, s.addr, WithConns(1))
	ctx := t.Context()

	cases := []struct {
		name string
		r    rdma.Region
		req  string
		want string
		err  error
	}{
		{"echo", r, "hello", "seg 7 mem 4096: hello", nil},
		{"empty", r, "", "seg 7 mem 4096: ", nil},
		{"hook error", r, "lost", "", rdma.ErrSegmentLost},
		{"wrong key", rdma.Region{Segment: 7, Epoch: 1}, "hello", "", rdma.ErrAccessDenied},
		{"unknown segment", rdma.Region{Segment: 8, Key: r.Key}, "hello", "", rdma.ErrAccessDenied},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			buf := make([]byte, 256)
			n, err := c.Message(ctx, tc.r, []byte(tc.req), buf)
			if tc.err != nil {
				require.ErrorIs(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, string(buf[:n]))
		})
	}

	t.Run("blocking hook holds only its own connection", func(t *testing.T) {
		poll := dial(t, s.addr, WithConns(1))
		done := make(chan error, 1)
		go func() {
			_, err := poll.Message(ctx, r, []byte("block"), make([]byte, 256))
			done <- err
		}()
		within(t, "a read beside a blocked MSG", func() {
			require.NoError(t, c.Read(ctx, r, 0, make([]byte, 8)))
		})
		close(release)
		within(t, "the released MSG", func() { require.NoError(t, <-done) })
	})

	t.Run("server without the hook answers unsupported", func(t *testing.T) {
		s2 := startServer(t, ServerConfig{})
		_, r2 := s2.export(t, 1, 4096)
		c2 := dial(t, s2.addr)
		_, err := c2.Message(ctx, r2, []byte("x"), make([]byte, 8))
		require.ErrorIs(t, err, rdma.ErrNotSupported)
	})

	t.Run("close ends a blocked hook", func(t *testing.T) {
		s3 := startServer(t, cfg)
		_, r3 := s3.export(t, 1, 4096)
		c3 := dial(t, s3.addr, WithConns(1))
		done := make(chan error, 1)
		go func() {
			_, err := c3.Message(ctx, r3, []byte("hang"), make([]byte, 256))
			done <- err
		}()
		time.Sleep(20 * time.Millisecond)
		within(t, "Close with a blocked MSG", func() { require.NoError(t, s3.Close()) })
		<-done
	})
}

// TestMessageCheckedBeforePayload: a MSG is checked (its segment, its
// length) before its payload is read, so that a client cannot make the
// server buffer a payload it will refuse: the answer comes while the
// payload is still withheld, and the connection stays in sync once the
// payload (skipped) follows.
func TestMessageCheckedBeforePayload(t *testing.T) {
	s := startServer(t, ServerConfig{Message: func(_ context.Context, m MessageCall) ([]byte, error) {
		return []byte(fmt.Sprintf("%d bytes", len(m.Req))), nil
	}})
	_, r := s.export(t, 1, 4096)
	nc := rawConn(t, s.addr)
	handshake(t, nc)
	for _, tc := range []struct {
		name   string
		h      reqHeader
		status uint16
	}{
		{"unexported segment", reqHeader{id: 1, op: opMsg, seg: 2, key: r.Key, payloadLen: MaxMessage, length: 64}, statusAccessDenied},
		{"wrong key", reqHeader{id: 2, op: opMsg, seg: 1, payloadLen: MaxMessage, length: 64}, statusAccessDenied},
		{"over MaxMessage", reqHeader{id: 3, op: opMsg, seg: 1, key: r.Key, payloadLen: MaxMessage + 1, length: 64}, statusOutOfRange},
		{"16 MiB", reqHeader{id: 4, op: opMsg, seg: 1, key: r.Key, payloadLen: MaxPayload, length: 64}, statusOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := nc.Write(requestFrame(t, &tc.h))
			require.NoError(t, err)
			resp := readResponse(t, nc) // before the payload: the check read none of it
			require.Equal(t, tc.h.id, resp.id)
			require.Equal(t, tc.status, resp.status)
			_, err = nc.Write(make([]byte, tc.h.payloadLen))
			require.NoError(t, err)
		})
	}
	// Still in sync: a MSG within the limit is served on the same connection.
	_, err := nc.Write(append(requestFrame(t, &reqHeader{id: 5, op: opMsg, seg: 1, key: r.Key, payloadLen: 3, length: 64}), "abc"...))
	require.NoError(t, err)
	require.Equal(t, "3 bytes", string(readOKPayload(t, nc)))

	c := dial(t, s.addr)
	_, err = c.Message(t.Context(), r, make([]byte, MaxMessage+1), make([]byte, 64))
	require.ErrorIs(t, err, rdma.ErrOutOfRange, "the client refuses what the server would")
}
