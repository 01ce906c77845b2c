package tcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/rdma"
)

func TestMain(m *testing.M) {
	if os.Getenv(benchServeEnv) != "" {
		if err := serveForBench(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// quietLogger drops records below Error so expected protocol violations do
// not flood test output.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError}))
}

type testServer struct {
	*Server
	addr string
}

// startServer serves cfg on 127.0.0.1 until the test ends.
func startServer(tb testing.TB, cfg ServerConfig) *testServer {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	return serveOn(tb, cfg, l)
}

// serveOn serves cfg on l until the test ends.
func serveOn(tb testing.TB, cfg ServerConfig, l net.Listener) *testServer {
	tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	s := NewServer(cfg)
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	tb.Cleanup(func() {
		require.NoError(tb, s.Close())
		require.NoError(tb, <-served)
	})
	return &testServer{Server: s, addr: l.Addr().String()}
}

// export maps size bytes and exports them as seg.
func (s *testServer) export(tb testing.TB, seg uint64, size int) ([]byte, rdma.Region) {
	tb.Helper()
	mem := mapMem(tb, size)
	key, err := s.Export(seg, mem, 1)
	require.NoError(tb, err)
	return mem, rdma.Region{Segment: seg, Key: key, Epoch: 1}
}

func dial(tb testing.TB, addr string, opts ...Option) *Client {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, addr, opts...)
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, c.Close()) })
	return c
}

// within fails the test if fn does not return in 20 s: a hang detector, not
// a performance assertion.
func within(tb testing.TB, what string, fn func()) {
	tb.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		tb.Fatalf("%s hung", what)
	}
}

// isClosedish reports whether err is what a client sees when its server goes
// away.
func isClosedish(err error) bool {
	return errors.Is(err, rdma.ErrClosed) || errors.Is(err, rdma.ErrSegmentLost)
}
