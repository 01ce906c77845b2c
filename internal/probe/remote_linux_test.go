//go:build linux

package probe

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

func TestRemoteRead(t *testing.T) {
	const size = 2 << 20
	mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, unix.Munmap(mem)) })
	srv := tcp.NewServer(tcp.DefaultConfig())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		l.Close()
		<-done
	})
	key, err := srv.Export(7, mem, 1)
	require.NoError(t, err)
	conn, err := tcp.Dial(t.Context(), l.Addr().String())
	require.NoError(t, err)
	defer conn.Close()

	r, err := RemoteRead(t.Context(), conn, rdma.Region{Segment: 7, Key: key, Epoch: 1}, size, 20, true)
	require.NoError(t, err)
	for _, res := range []Result{r.Read64, r.Read4K, r.Write64} {
		require.Equal(t, 20, res.Samples)
		require.Positive(t, res.P50)
		require.GreaterOrEqual(t, res.P99, res.P50)
	}
	require.Positive(t, r.ReadBandwidth)

	_, err = RemoteRead(t.Context(), conn, rdma.Region{Segment: 8, Key: key, Epoch: 1}, size, 1, false)
	require.ErrorIs(t, err, rdma.ErrAccessDenied)
}
