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
	cfg := ServerConfig{Message: func(ctx context.Context, seg uint64, mem []byte, req []byte, maxResp int) ([]byte, error) {
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
