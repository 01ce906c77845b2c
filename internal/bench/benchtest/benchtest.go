// Package benchtest starts the servers that bench's comparisons run
// against — memcached and redis-server — on 127.0.0.1 on free ports for a
// test, and stops them when it ends. A test whose server binary is missing
// is skipped with the reason.
//
// Concurrency: the functions may be called from parallel tests; each
// starts a server of its own.
//
// OS and build tags: none; the servers must be on PATH (Debian: apt-get
// install memcached redis-server).
package benchtest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"
)

// Memcached starts memcached on 127.0.0.1 and returns its address.
func Memcached(t testing.TB) string {
	return start(t, "memcached", func(port int) []string {
		args := []string{"-l", "127.0.0.1", "-p", strconv.Itoa(port), "-U", "0", "-m", "64"}
		if os.Geteuid() == 0 {
			args = append(args, "-u", "root") // memcached refuses to run as root otherwise
		}
		return args
	})
}

// Redis starts redis-server on 127.0.0.1, without persistence, and returns
// its address.
func Redis(t testing.TB) string {
	return start(t, "redis-server", func(port int) []string {
		return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--daemonize", "no"}
	})
}

// start runs bin on a free port, waits until it accepts connections, and
// stops it when the test ends. A port taken between choosing and binding
// is retried with another.
func start(t testing.TB, bin string, args func(port int) []string) string {
	t.Helper()
	path, err := exec.LookPath(bin)
	if err != nil {
		t.Skipf("%s is not installed (apt-get install %s; .ci/run installs it): %v", bin, map[string]string{"memcached": "memcached", "redis-server": "redis-server"}[bin], err)
	}
	var lastErr error
	for range 3 {
		port, err := freePort()
		if err != nil {
			t.Fatalf("find a free port for %s: %v", bin, err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		cmd := exec.Command(path, args(port)...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", bin, err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		if lastErr = waitListening(addr, exited); lastErr == nil {
			t.Cleanup(func() {
				cmd.Process.Kill()
				<-exited
			})
			return addr
		}
		cmd.Process.Kill()
		<-exited
	}
	t.Fatalf("%s did not start: %v", bin, lastErr)
	return ""
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitListening polls addr until it accepts a connection, the process
// exits, or 10 s pass.
func waitListening(addr string, exited <-chan struct{}) error {
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("it exited before listening on %s", addr)
		default:
		}
		if c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("nothing listens on %s after 10s", addr)
}
