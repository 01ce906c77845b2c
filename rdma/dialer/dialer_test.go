package dialer

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestFallsBackToTCP: without the verbs build tag the verbs transport says
// it is not supported, and the TCP fallback carries the connection.
func TestFallsBackToTCP(t *testing.T) {
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(mem)
	srv := tcp.NewServer(tcp.DefaultConfig())
	key, err := srv.Export(1, mem, 1)
	require.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(l)
	defer srv.Close()

	conn, name, err := Dial(t.Context(), l.Addr().String(), nil)
	require.NoError(t, err)
	defer conn.Close()
	require.Equal(t, "tcp", name)
	_, err = conn.FetchAdd64(t.Context(), rdmaRegion(key), 0, 5)
	require.NoError(t, err)
	require.EqualValues(t, 5, mem[0])
}

func rdmaRegion(key [16]byte) rdma.Region { return rdma.Region{Segment: 1, Key: key, Epoch: 1} }
