//go:build linux

package tcp

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/rdma"
)

// TestMemoryFault truncates the file behind an exported mapping, so that
// touching it raises SIGBUS (as a lost hugetlb page or a poisoned CXL line
// would). The server must mark the segment lost instead of crashing, and go
// on serving other segments.
func TestMemoryFault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "segment")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	const size = 2 * 4096
	require.NoError(t, f.Truncate(size))
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })

	s := startServer(t, ServerConfig{})
	key, err := s.Export(1, mem, 0)
	require.NoError(t, err)
	faulty := rdma.Region{Segment: 1, Key: key}
	goodMem, good := s.export(t, 2, 4096)
	c := dial(t, s.addr, WithConns(1))
	ctx := t.Context()

	require.NoError(t, c.Write(ctx, faulty, 0, []byte("before")))
	require.NoError(t, f.Truncate(0))

	_, err = c.FetchAdd64(ctx, faulty, 0, 1)
	require.ErrorIs(t, err, rdma.ErrSegmentLost)
	// Marked lost: later ops are refused without touching the memory.
	require.ErrorIs(t, c.Read(ctx, faulty, 0, make([]byte, 8)), rdma.ErrSegmentLost)
	require.ErrorIs(t, c.Write(ctx, faulty, 0, []byte("x")), rdma.ErrSegmentLost)

	require.NoError(t, c.Write(ctx, good, 0, []byte("alive")))
	require.Equal(t, "alive", string(goodMem[:5]))
	require.NoError(t, s.Revoke(1))
}

// TestWriteFault: a buffered WRITE payload copied into a faulting mapping.
func TestWriteFault(t *testing.T) {
	path := filepath.Join(t.TempDir(), "segment")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Truncate(4096))
	mem, err := unix.Mmap(int(f.Fd()), 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })

	s := startServer(t, ServerConfig{})
	key, err := s.Export(1, mem, 0)
	require.NoError(t, err)
	c := dial(t, s.addr, WithConns(1))
	require.NoError(t, f.Truncate(0))
	err = c.Write(t.Context(), rdma.Region{Segment: 1, Key: key}, 0, []byte("small payload"))
	require.ErrorIs(t, err, rdma.ErrSegmentLost)
	require.NoError(t, s.Revoke(1))
}

// TestFaultOverTLS: over TLS crypto/tls, not the kernel, copies payloads
// between the socket and a mapping, so a fault there is a panic the server
// must recover: a WRITE payload streamed into a faulting mapping and a READ
// from one fail on their connections, and the server goes on serving.
func TestFaultOverTLS(t *testing.T) {
	srvTLS, cliTLS := tlsConfigs(t)
	path := filepath.Join(t.TempDir(), "segment")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	const size = 1 << 20
	require.NoError(t, f.Truncate(size))
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { unix.Munmap(mem) })

	s := startServer(t, ServerConfig{TLS: srvTLS})
	key, err := s.Export(1, mem, 0)
	require.NoError(t, err)
	faulty := rdma.Region{Segment: 1, Key: key}
	goodMem, good := s.export(t, 2, 4096)
	ctx := t.Context()
	// The first half stays: the checks and the buffered start of a payload
	// pass, and the fault comes while crypto/tls copies the rest.
	require.NoError(t, f.Truncate(size/2))

	c := dial(t, s.addr, WithConns(1), WithTLS(cliTLS))
	require.Error(t, c.Write(ctx, faulty, 0, make([]byte, size)), "a WRITE streamed into a faulting mapping")
	c2 := dial(t, s.addr, WithConns(1), WithTLS(cliTLS))
	require.Error(t, c2.Read(ctx, faulty, size/2-4096, make([]byte, 64<<10)), "a READ from a faulting mapping")

	c3 := dial(t, s.addr, WithConns(1), WithTLS(cliTLS))
	require.NoError(t, c3.Write(ctx, good, 0, []byte("alive")))
	require.Equal(t, "alive", string(goodMem[:5]))
	require.NoError(t, s.Revoke(1))
}
