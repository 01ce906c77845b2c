package dialer

import (
	"crypto/x509"
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

// TestServerForwards: without verbs the data plane forwards a segment's
// writes through the tcp transport (Forward passed through), and refuses
// read-only principals' writes (AllowReaders passed through).
func TestServerForwards(t *testing.T) {
	serve := func() (*Server, string, []byte, rdma.Region) {
		mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
		require.NoError(t, err)
		t.Cleanup(func() { unix.Munmap(mem) })
		cfg := tcp.DefaultConfig()
		cfg.Identify = func(cred []byte, _ *x509.Certificate) (string, string, error) { return string(cred), "", nil }
		srv := NewServer(cfg)
		key, err := srv.Export(1, mem, 1)
		require.NoError(t, err)
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		go srv.Serve(l)
		t.Cleanup(func() { srv.Close() })
		return srv, l.Addr().String(), mem, rdmaRegion(key)
	}
	prim, paddr, pmem, pr := serve()
	back, baddr, bmem, br := serve()
	link, err := tcp.Dial(t.Context(), baddr, tcp.WithCredential([]byte("primary")))
	require.NoError(t, err)
	defer link.Close()
	require.Equal(t, "tcp", prim.Transport())
	require.NoError(t, prim.Forward(1, &tcp.Forwarding{Mode: tcp.ForwardCopy, Targets: []tcp.ForwardTarget{{Conn: link, Region: br}}}))
	require.ErrorIs(t, prim.Forward(2, nil), rdma.ErrNotExported)
	require.NoError(t, back.AllowReaders(1, []string{"app"}))

	app, _, err := Dial(t.Context(), paddr, []byte("app"))
	require.NoError(t, err)
	defer app.Close()
	require.NoError(t, app.Write(t.Context(), pr, 0, []byte("forwarded")))
	require.Equal(t, "forwarded", string(pmem[:9]))
	require.Equal(t, "forwarded", string(bmem[:9]))

	onBackup, _, err := Dial(t.Context(), baddr, []byte("app"))
	require.NoError(t, err)
	defer onBackup.Close()
	buf := make([]byte, 9)
	require.NoError(t, onBackup.Read(t.Context(), br, 0, buf))
	require.Equal(t, "forwarded", string(buf))
	require.ErrorIs(t, onBackup.Write(t.Context(), br, 0, []byte("x")), rdma.ErrAccessDenied)
	require.NoError(t, prim.Forward(1, nil))
}
