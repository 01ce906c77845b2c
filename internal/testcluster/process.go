package testcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// maxOutput bounds a Process's captured output; past it the oldest half is
// dropped, so a chatty daemon cannot exhaust the test's memory.
const maxOutput = 8 << 20

// waitDelay bounds how long Wait waits for the output pipes to close once
// the process has exited (a grandchild may hold them).
const waitDelay = 2 * time.Second

// Process is a long-running process started by Host.Start inside a host's
// namespace. It is safe for concurrent use.
type Process struct {
	// PID is the process id, in the test's pid namespace.
	PID int
	// Host is where the process runs.
	Host *Host

	cmd  *exec.Cmd
	out  *outputBuffer
	done chan struct{}
	err  error // Wait's result; written before done is closed

	stopOnce sync.Once
}

// Output returns everything the process wrote to stdout and stderr so far,
// interleaved as written (at most the last 4 to 8 MiB).
func (p *Process) Output() string { s, _ := p.out.snapshot(); return s }

// Done is closed once the process has exited and its output is complete.
func (p *Process) Done() <-chan struct{} { return p.done }

// Wait waits for the process to exit and returns its exit error as
// exec.Cmd.Wait does (nil for status 0, an *exec.ExitError otherwise). It
// may be called any number of times, from any goroutine.
func (p *Process) Wait() error {
	<-p.done
	return p.err
}

// WaitOutput waits until the output contains s, the process exits, or ctx
// is done; only the first case returns nil. Use it to wait for a daemon's
// "listening" line.
func (p *Process) WaitOutput(ctx context.Context, s string) error {
	for {
		out, grew := p.out.snapshot()
		if strings.Contains(out, s) {
			return nil
		}
		select {
		case <-grew:
		case <-p.done:
			if out := p.Output(); strings.Contains(out, s) {
				return nil
			}
			return fmt.Errorf("%w: %s exited (%v) before printing %q; its output: %s", ErrNotReady, p, p.err, s, tail(p.Output()))
		case <-ctx.Done():
			return fmt.Errorf("%w: %s did not print %q: %w; its output so far: %s", ErrNotReady, p, s, ctx.Err(), tail(p.Output()))
		}
	}
}

// Signal sends sig to the process alone (not its group). It returns
// os.ErrProcessDone if the process has exited.
func (p *Process) Signal(sig os.Signal) error {
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("testcluster: signal %v to %s: %w", sig, p, err)
	}
	return nil
}

// Kill9 sends SIGKILL to the process's whole group, so children it forked
// die with it, as on a host that loses power. It does not wait; call Wait.
// Killing a process that has exited is not an error.
func (p *Process) Kill9() error { return p.kill9() }

// String names the process for messages: pid, host and command line.
func (p *Process) String() string {
	args := p.cmd.Args
	if len(args) > 4 && args[0] == "ip" {
		args = args[4:] // drop "ip netns exec NS"
	}
	return fmt.Sprintf("pid %d on %s (%s)", p.PID, p.Host.Name, strings.Join(args, " "))
}

// stop kills the process group and waits for the process; it is run by
// t.Cleanup and by the cluster's teardown, whichever comes first.
func (p *Process) stop(t testing.TB) {
	p.stopOnce.Do(func() {
		if err := p.Kill9(); err != nil {
			t.Errorf("cleanup: %v", err)
		}
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			t.Errorf("cleanup: %s did not exit 10s after SIGKILL", p)
			return
		}
		if t.Failed() {
			t.Logf("output of %s (exit: %v):\n%s", p, p.err, tail(p.Output()))
		}
	})
}

// exited reports whether the process has been reaped.
func (p *Process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail keeps the last 4 KiB of s for messages.
func tail(s string) string {
	const n = 4 << 10
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// outputBuffer collects a process's output; readers wait on grew, which
// is closed and replaced on every write.
type outputBuffer struct {
	mu   sync.Mutex
	b    bytes.Buffer
	grew chan struct{}
}

func newOutputBuffer() *outputBuffer { return &outputBuffer{grew: make(chan struct{})} }

// Write appends to the buffer; it never fails.
func (o *outputBuffer) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.b.Write(p)
	if o.b.Len() > maxOutput {
		keep := bytes.Clone(o.b.Bytes()[o.b.Len()-maxOutput/2:])
		o.b.Reset()
		o.b.Write(keep)
	}
	close(o.grew)
	o.grew = make(chan struct{})
	return len(p), nil
}

func (o *outputBuffer) snapshot() (string, <-chan struct{}) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String(), o.grew
}
