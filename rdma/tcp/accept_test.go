package tcp

import (
	"net"
	"os"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// failingListener fails its first accepts with errs, as the kernel does
// when the process or the system runs out of descriptors or buffers, and
// then accepts from the real listener.
type failingListener struct {
	net.Listener
	mu   sync.Mutex
	errs []syscall.Errno
}

func (f *failingListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.errs) > 0 {
		e := f.errs[0]
		f.errs = f.errs[1:]
		f.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: f.Addr(), Err: os.NewSyscallError("accept4", e)}
	}
	f.mu.Unlock()
	return f.Listener.Accept()
}

// TestServeSurvivesAcceptErrors: accept failing with EMFILE, ENFILE,
// ENOBUFS, ENOMEM and ECONNABORTED does not end Serve; the next client is
// served.
func TestServeSurvivesAcceptErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	fl := &failingListener{Listener: l, errs: []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED}}
	s := serveOn(t, ServerConfig{}, fl)
	mem, r := s.export(t, 1, 4096)
	c := dial(t, s.addr)
	require.NoError(t, c.Write(t.Context(), r, 8, []byte("still serving")))
	require.Equal(t, "still serving", string(mem[8:21]))
	fl.mu.Lock()
	require.Empty(t, fl.errs)
	fl.mu.Unlock()
}
