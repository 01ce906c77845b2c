package listener

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeListener hands out its script in order: an error, or (nil) a
// connection; past the end it blocks until closed.
type fakeListener struct {
	mu     sync.Mutex
	script []error
	closed chan struct{}
	once   sync.Once
}

func newFake(script ...error) *fakeListener {
	return &fakeListener{script: script, closed: make(chan struct{})}
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.script) > 0 {
		err := f.script[0]
		f.script = f.script[1:]
		f.mu.Unlock()
		if err != nil {
			return nil, err
		}
		c, _ := net.Pipe()
		return c, nil
	}
	f.mu.Unlock()
	<-f.closed
	return nil, &net.OpError{Op: "accept", Net: "tcp", Err: net.ErrClosed}
}

func (f *fakeListener) Close() error   { f.once.Do(func() { close(f.closed) }); return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1} }

// acceptErr is what the net package returns for errno e from accept4.
func acceptErr(e syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
}

// fakeClock advances only when the listener sleeps.
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	slept  []time.Duration
	onStep func() // called after each sleep, under no lock
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *fakeClock) advance(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func (c *fakeClock) sleep(d time.Duration, done <-chan struct{}) bool {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.slept = append(c.slept, d)
	step := c.onStep
	c.mu.Unlock()
	if step != nil {
		step()
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

func newTest(t *testing.T, f net.Listener, cfg Config) (*Listener, *fakeClock, *bytes.Buffer, *[]error) {
	t.Helper()
	var logs bytes.Buffer
	var mu sync.Mutex
	var seen []error
	cfg.Logger = slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))
	cfg.OnError = func(err error) { mu.Lock(); seen = append(seen, err); mu.Unlock() }
	if cfg.Name == "" {
		cfg.Name = "data-plane"
	}
	l := New(f, cfg)
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	l.now, l.sleep = clk.now, clk.sleep
	l.warn.SetClock(clk.now)
	t.Cleanup(func() { l.Close() })
	return l, clk, &logs, &seen
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// TestResourceErrorsBackOffAndRetry: EMFILE, ENFILE, ENOBUFS and ENOMEM
// from accept make Accept pause 5ms, 10ms, 20ms ... (capped at 1s) and try
// again; the connection that finally comes is returned, each error is
// counted, and the listener reports failing while it backs off.
func TestResourceErrorsBackOffAndRetry(t *testing.T) {
	script := []error{acceptErr(syscall.EMFILE), acceptErr(syscall.ENFILE), acceptErr(syscall.ENOBUFS), acceptErr(syscall.ENOMEM)}
	for range 8 {
		script = append(script, acceptErr(syscall.EMFILE))
	}
	script = append(script, nil)
	l, clk, _, seen := newTest(t, newFake(script...), Config{})
	var during []Status
	clk.onStep = func() { during = append(during, l.Status()) }

	c, err := l.Accept()
	require.NoError(t, err)
	c.Close()
	want := []time.Duration{5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000, 1000}
	for i := range want {
		want[i] *= time.Millisecond
	}
	require.Equal(t, want, clk.slept)
	require.Len(t, *seen, 12)
	for i, s := range during {
		require.True(t, s.Failing, "status after error %d", i)
		require.ErrorIs(t, s.Err, script[i].(*net.OpError).Err.(*os.SyscallError).Err)
	}
	st := l.Status()
	require.False(t, st.Failing, "a successful accept ends the failing spell")
	require.NoError(t, st.Err)
	require.Equal(t, uint64(12), st.Errors)

	// The next spell starts from the shortest pause again.
	l2, clk2, _, _ := newTest(t, newFake(acceptErr(syscall.EMFILE), nil), Config{})
	c, err = l2.Accept()
	require.NoError(t, err)
	c.Close()
	require.Equal(t, []time.Duration{5 * time.Millisecond}, clk2.slept)
}

// TestConnectionErrorsRetryAtOnce: an error about one connection (it was
// aborted in the backlog) is counted but neither paused on nor reported as
// the listener failing.
func TestConnectionErrorsRetryAtOnce(t *testing.T) {
	l, clk, _, seen := newTest(t, newFake(acceptErr(syscall.ECONNABORTED), acceptErr(syscall.ECONNRESET), acceptErr(syscall.EPROTO), nil), Config{})
	c, err := l.Accept()
	require.NoError(t, err)
	c.Close()
	require.Empty(t, clk.slept)
	require.Len(t, *seen, 3)
	require.False(t, l.Status().Failing)
}

// TestFailingExpires: a listener that failed and then accepted nothing
// (no client came) stops reporting failing FailWindow after its last
// error, without any accept.
func TestFailingExpires(t *testing.T) {
	l, clk, _, _ := newTest(t, newFake(acceptErr(syscall.EMFILE)), Config{FailWindow: 3 * time.Second})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, err := l.Accept()
		require.ErrorIs(t, err, net.ErrClosed)
	}()
	require.Eventually(t, func() bool { return l.Status().Errors == 1 }, 10*time.Second, time.Millisecond)
	st := l.Status()
	require.True(t, st.Failing)
	require.Contains(t, st.String(), "accept failing since 2026-01-01T00:00:00Z")
	require.Contains(t, st.String(), "too many open files")
	clk.advance(3*time.Second - 6*time.Millisecond) // the error came before the 5ms sleep
	require.True(t, l.Status().Failing)
	clk.advance(2 * time.Millisecond)
	require.False(t, l.Status().Failing)
	require.Equal(t, "accepting", l.Status().String())
	require.NoError(t, l.Close())
	<-done
}

// TestWarningsRateLimited: a thousand errors within one second log one
// warning; the next warning, a second later, says how many were left out,
// and so does the line that says it accepts again (one more error came
// right after that warning).
func TestWarningsRateLimited(t *testing.T) {
	script := make([]error, 0, 1003)
	for range 1000 {
		script = append(script, acceptErr(syscall.ECONNABORTED))
	}
	script = append(script, acceptErr(syscall.EMFILE), acceptErr(syscall.EMFILE), nil)
	l, clk, logs, seen := newTest(t, newFake(script...), Config{})
	n := 0
	l.cfg.OnError = func(error) {
		n++
		if n == 1000 {
			clk.advance(time.Second) // the 1001st error comes a second after the first
		}
	}
	c, err := l.Accept()
	require.NoError(t, err)
	c.Close()
	require.Empty(t, *seen) // OnError replaced
	require.Equal(t, 1002, n)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 3, logs.String())
	require.Contains(t, lines[0], "accept failed; retrying")
	require.Contains(t, lines[0], "suppressed_since_last=0")
	require.Contains(t, lines[1], "suppressed_since_last=999")
	require.Contains(t, lines[1], "too many open files")
	require.Contains(t, lines[2], "accepting again")
	require.Contains(t, lines[2], "suppressed_since_last=1")
}

// TestRecoveriesSampled: a listener that fails and accepts by turns (at
// its descriptor limit, each closed connection frees the next accept)
// writes one "accepting again" line a second, not one per spell, and the
// failures a held-back recovery ended are counted by the next line.
func TestRecoveriesSampled(t *testing.T) {
	var script []error
	for range 100 {
		script = append(script, acceptErr(syscall.EMFILE), nil)
	}
	script = append(script, acceptErr(syscall.EMFILE), nil)
	l, clk, logs, _ := newTest(t, newFake(script...), Config{})
	for i := range 101 {
		if i == 100 {
			clk.advance(time.Second)
		}
		c, err := l.Accept()
		require.NoError(t, err)
		c.Close()
	}
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	require.Len(t, lines, 4, logs.String())
	require.Contains(t, lines[0], "accept failed; retrying")
	require.Contains(t, lines[1], "accepting again")
	require.Contains(t, lines[1], "spells_suppressed=0")
	require.Contains(t, lines[2], "accept failed; retrying")
	require.Contains(t, lines[2], "suppressed_since_last=99")
	require.Contains(t, lines[3], "accepting again")
	require.Contains(t, lines[3], "spells_suppressed=99")
}

// TestCloseEndsBackoff: Close during a pause makes Accept return at once
// with an error, and Close is idempotent.
func TestCloseEndsBackoff(t *testing.T) {
	f := newFake(acceptErr(syscall.EMFILE))
	l := New(f, Config{Name: "unix-socket"})
	inSleep := make(chan struct{})
	l.sleep = func(d time.Duration, done <-chan struct{}) bool {
		close(inSleep)
		<-done
		return false
	}
	errc := make(chan error, 1)
	go func() { _, err := l.Accept(); errc <- err }()
	<-inSleep
	require.NoError(t, l.Close())
	require.NoError(t, l.Close())
	err := <-errc
	require.Error(t, err)
	require.Contains(t, err.Error(), "listener unix-socket: closed while backing off")
	require.ErrorIs(t, err, syscall.EMFILE)
}

// TestClosedListenerReturns: net.ErrClosed from the wrapped listener ends
// Accept at once (nobody to retry for).
func TestClosedListenerReturns(t *testing.T) {
	l, clk, _, seen := newTest(t, newFake(fmt.Errorf("accept: %w", net.ErrClosed)), Config{})
	_, err := l.Accept()
	require.ErrorIs(t, err, net.ErrClosed)
	require.Empty(t, clk.slept)
	require.Empty(t, *seen)
}

// TestRealListenerAcceptsAfterWrap: over a real TCP listener the wrapper
// is transparent, and Wrap does not wrap twice.
func TestRealListenerAcceptsAfterWrap(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := New(tl, Config{Name: "metrics"})
	defer l.Close()
	require.Same(t, l, Wrap(l, Config{Name: "other"}))
	go func() {
		c, err := net.Dial("tcp", l.Addr().String())
		if err == nil {
			c.Close()
		}
	}()
	c, err := l.Accept()
	require.NoError(t, err)
	c.Close()
	require.False(t, errors.Is(l.Status().Err, syscall.EMFILE))
}

// TestNewNeedsName: an unnamed listener is a programming error.
func TestNewNeedsName(t *testing.T) {
	require.Panics(t, func() { New(newFake(), Config{}) })
}
