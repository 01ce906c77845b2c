package main

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/certs"
)

// floodConns is how many idle or slow connections one source opens in
// TestConnectionFlood, as in the hostile run that found the problem.
const floodConns = 25_000

// floodFrom opens n connections with dial, one after another, the way a
// hostile client does: it keeps each open until the server closes it
// (checked every few hundred dials), and every tenth first sends slow, a
// few bytes of a handshake, and then nothing. It returns the connections
// still open for the caller to close.
func floodFrom(t *testing.T, n int, dial func() (net.Conn, error), slow []byte) []net.Conn {
	t.Helper()
	var conns []net.Conn
	t.Cleanup(func() { closeAll(conns) })
	one := make([]byte, 1)
	for i := range n {
		c, err := dial()
		// A unix socket whose accept backlog is full refuses at once with
		// EAGAIN (the daemon is behind on a loaded machine): a flooding
		// client retries, as this one does, for up to 10 s.
		for wait := time.Now().Add(10 * time.Second); errors.Is(err, syscall.EAGAIN) && time.Now().Before(wait); {
			time.Sleep(time.Millisecond)
			c, err = dial()
		}
		require.NoError(t, err, "flood connection %d", i)
		if i%10 == 0 {
			c.Write(slow) // the server may have closed it already: no matter
		}
		conns = append(conns, c)
		if i%500 != 499 {
			continue
		}
		open := conns[:0]
		for _, c := range conns {
			if !closedByPeer(t, c, one) {
				open = append(open, c)
				continue
			}
			c.Close()
		}
		clear(conns[len(open):])
		conns = open
	}
	return conns
}

// closedByPeer reports whether the other end closed c, without waiting.
func closedByPeer(t *testing.T, c net.Conn, buf []byte) bool {
	rc, err := c.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	var closed bool
	require.NoError(t, rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), buf, unix.MSG_PEEK|unix.MSG_DONTWAIT)
		closed = n == 0 && err == nil || err != nil && !errors.Is(err, unix.EAGAIN)
		return true
	}))
	return closed
}

// requireFewFDs checks that poold (pid) holds fewer than 200 descriptors
// more than baseline while the flood is held. Connections it accepted
// and is refusing are closed a moment later, so the count may take a few
// seconds to settle under load; it must settle, not grow with the flood.
func requireFewFDs(t *testing.T, pid, baseline int, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		held := openFDs(t, pid)
		if held < baseline+200 {
			return
		}
		if time.Now().After(deadline) {
			require.Less(t, held, baseline+200, "poold holds %d descriptors for %s, %d before it", held, what, baseline)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// TestConnectionFlood opens 25,000 idle or slow connections from one source
// against poold's unix socket (one process), then against its TLS control
// plane (one IP). poold never exits; it holds only a bounded number of
// them (per process on the unix socket, unfinished handshakes per IP on the
// control plane) and closes the rest at once; a legitimate client's new
// dial and allocation succeed while the flood holds; and everything serves
// after.
func TestConnectionFlood(t *testing.T) {
	dir := shortDir(t)
	_, err := certs.Init(dir, certs.InitOptions{Nodes: []certs.Node{{Name: "n1"}}, Clients: []string{"app"}})
	require.NoError(t, err)
	data, sock := t.TempDir(), filepath.Join(shortDir(t), "p.sock")
	ctlAddr, metricsAddr := freeAddr(t, "tcp"), freeAddr(t, "tcp")
	d := startDaemon(t, data, sock, "--node", "n1", "--export-size", "16MiB", "--data-listen", freeAddr(t, "tcp"),
		"--metrics", metricsAddr, "--listen", ctlAddr,
		"--tls-cert", certs.CertFile(dir, "n1"), "--tls-key", certs.KeyFile(dir, "n1"), "--tls-ca", certs.CAFile(dir))
	p := openProbes(t, sock, metricsAddr)
	require.Eventually(t, func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	pid := d.cmd.Process.Pid
	baseline := openFDs(t, pid)
	tc, err := alloc.LoadTLS(certs.CertFile(dir, "app"), certs.KeyFile(dir, "app"), certs.CAFile(dir))
	require.NoError(t, err)

	alive := func() {
		t.Helper()
		requireAlive(t, pid)
		code, body := p.get("/readyz")
		require.Equal(t, http.StatusOK, code, body)
	}

	t.Run("unix socket", func(t *testing.T) {
		conns := floodFrom(t, floodConns, func() (net.Conn, error) { return net.Dial("unix", sock) }, []byte("PRI "))
		requireFewFDs(t, pid, baseline, "a flood from one process")
		// This process holds its share of the socket: the legitimate
		// client is another one.
		c := exec.Command(os.Args[0], "-test.run=^$")
		c.Env = append(os.Environ(), "FARMEM_TEST_CLIENT="+sock)
		out, err := c.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, c.Start())
		defer func() { c.Process.Kill(); c.Wait() }()
		line, err := bufio.NewReader(out).ReadString('\n')
		require.NoError(t, err)
		require.True(t, strings.HasPrefix(line, "ready "), "client during the flood: %q", line)
		alive()
		closeAll(conns)
	})

	t.Run("control plane", func(t *testing.T) {
		from := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
		conns := floodFrom(t, floodConns, func() (net.Conn, error) { return from.Dial("tcp", ctlAddr) }, []byte{0x16, 0x03, 0x01})
		requireFewFDs(t, pid, baseline, "a flood from one IP")
		serves(t, "tcp://"+ctlAddr, alloc.TierRDMA, alloc.WithTLS(tc))
		alive()
		closeAll(conns)
	})

	serves(t, sock, alloc.TierCXL)
	serves(t, "tcp://"+ctlAddr, alloc.TierRDMA, alloc.WithTLS(tc))
	alive()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, d.cmd.Wait(), "exit status 0 on SIGTERM: %s", d.log)
}
