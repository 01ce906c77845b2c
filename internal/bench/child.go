package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strings"
	"time"
)

// The servers that bench starts itself (tcp-raw, grpc) run by default in
// a process of their own, as poold, memcached and Redis do: a server in
// the client's process shares its Go scheduler (a response wakes the
// client without a cross-process wake-up) and its CPU time cannot be told
// apart from the client's.

// Serve runs the tcp-raw (values of up to maxSize bytes) or grpc server on
// 127.0.0.1, writes its address and a newline to out, and serves until
// stop returns (a child process passes a function that reads its stdin to
// the end, so it dies with its parent).
func Serve(kind string, maxSize int, out io.Writer, stop func()) error {
	var (
		addr  string
		close func() error
	)
	switch kind {
	case "tcp-raw":
		s, err := startRawServer(maxSize)
		if err != nil {
			return err
		}
		addr, close = s.addr(), s.close
	case "grpc":
		s, err := startGRPCServer()
		if err != nil {
			return err
		}
		addr, close = s.addr(), s.close
	default:
		return fmt.Errorf("%w: server %q: use tcp-raw or grpc", ErrInvalid, kind)
	}
	defer close()
	if _, err := fmt.Fprintln(out, addr); err != nil {
		return err
	}
	stop()
	return nil
}

// Child is a server process started by StartChild. Not safe for
// concurrent use.
type Child struct {
	// Addr is where the server listens; PID its process.
	Addr string
	PID  int

	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{}
}

// StartChild starts cmd, a process that calls Serve with its stdin as the
// stop signal, and reads the address it prints.
func StartChild(cmd *exec.Cmd) (*Child, error) {
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server process %s: %w", cmd.Path, err)
	}
	c := &Child{cmd: cmd, stdin: stdin, PID: cmd.Process.Pid, done: make(chan struct{})}
	line := make(chan string, 1)
	go func() {
		l, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- strings.TrimSpace(l)
		io.Copy(io.Discard, stdout)
		cmd.Wait()
		close(c.done)
	}()
	select {
	case c.Addr = <-line:
	case <-time.After(10 * time.Second):
	}
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		c.Close()
		return nil, fmt.Errorf("server process %s %s printed no address (%q)", cmd.Path, strings.Join(cmd.Args[1:], " "), c.Addr)
	}
	return c, nil
}

// Close ends the server (its stdin closes) and waits for it, killing it
// after 5 s. Idempotent.
func (c *Child) Close() error {
	c.stdin.Close()
	select {
	case <-c.done:
		return nil
	case <-time.After(5 * time.Second):
	}
	err := c.cmd.Process.Kill()
	<-c.done
	return errors.Join(err, errors.New("server process did not stop when its stdin closed; killed"))
}
