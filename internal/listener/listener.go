package listener

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/farmem/farmem/internal/logsample"
)

// Defaults of Config.
const (
	DefaultMinBackoff = 5 * time.Millisecond
	DefaultMaxBackoff = time.Second
	DefaultFailWindow = 3 * time.Second
)

// Config says how a Listener names itself, reports and backs off. Zero
// fields take the defaults.
type Config struct {
	// Name labels the listener in logs, metrics and readiness, e.g.
	// "data-plane". Required.
	Name string
	// Logger receives the warnings, at most one per logsample.Interval;
	// nil discards them.
	Logger *slog.Logger
	// OnError is called (without locks held) for every accept error, e.g.
	// to count it in metrics; nil: none.
	OnError func(err error)
	// MinBackoff is the first pause after a resource error; default 5ms.
	MinBackoff time.Duration
	// MaxBackoff caps the doubling pause; default 1s.
	MaxBackoff time.Duration
	// FailWindow is how long after its last resource error the listener
	// still reports failing when no connection was accepted since; default
	// 3s. It must exceed MaxBackoff, so that an error that recurs at every
	// retry keeps the listener failing without a gap.
	FailWindow time.Duration
}

func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.MinBackoff <= 0 {
		c.MinBackoff = DefaultMinBackoff
	}
	if c.MaxBackoff <= 0 {
		c.MaxBackoff = DefaultMaxBackoff
	}
	if c.FailWindow <= 0 {
		c.FailWindow = max(DefaultFailWindow, 2*c.MaxBackoff)
	}
	return c
}

// Status is what a Listener reports about its accepting. A value.
type Status struct {
	Name    string    // Config.Name
	Addr    string    // the address it listens on
	Failing bool      // a resource error within FailWindow and no accept since
	Err     error     // the last resource error while Failing, else nil
	Since   time.Time // when the current failing spell began (zero when not Failing)
	Errors  uint64    // accept errors since New, of any kind
}

// String says how the listener fares, for a readiness report: "accepting"
// or "accept failing since TIME: ERROR".
func (s Status) String() string {
	if !s.Failing {
		return "accepting"
	}
	return fmt.Sprintf("accept failing since %s: %v", s.Since.UTC().Format(time.RFC3339), s.Err)
}

// Listener is a net.Listener whose Accept retries instead of failing; see
// the package documentation. It is safe for concurrent use; it owns the
// wrapped listener and closes it in Close.
type Listener struct {
	net.Listener
	cfg Config

	// now and sleep are the clock; tests replace them. sleep returns false
	// when done was closed first.
	now   func() time.Time
	sleep func(d time.Duration, done <-chan struct{}) bool

	done      chan struct{}
	closeOnce sync.Once

	mu        sync.Mutex
	backoff   time.Duration // the current pause; 0 after a successful accept
	lastErr   error         // the last resource error, nil after a successful accept
	lastErrAt time.Time
	since     time.Time // first error of the current spell
	errors    uint64
	warn      logsample.Sampler[string] // by message
}

// New wraps l. It panics on an empty cfg.Name, a programming error.
func New(l net.Listener, cfg Config) *Listener {
	if cfg.Name == "" {
		panic("listener: Config.Name is empty")
	}
	cfg = cfg.withDefaults()
	return &Listener{Listener: l, cfg: cfg, now: time.Now, sleep: sleep, done: make(chan struct{})}
}

// Wrap is New, except that a *Listener is returned as it is: code that
// serves a listener it was given can make sure it retries without wrapping
// one that already does.
func Wrap(l net.Listener, cfg Config) *Listener {
	if rl, ok := l.(*Listener); ok {
		return rl
	}
	return New(l, cfg)
}

// sleep waits d or until done is closed, and reports whether d passed.
func sleep(d time.Duration, done <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// Accept waits for the next connection. It returns an error only after
// Close (or when the wrapped listener reports net.ErrClosed): every other
// error is counted, logged (rate-limited) and retried, after a backoff
// when it is a resource error.
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			l.accepted()
			return c, nil
		}
		select {
		case <-l.done:
			return nil, err
		default:
		}
		if errors.Is(err, net.ErrClosed) {
			return nil, err
		}
		if d := l.failed(err); d > 0 && !l.sleep(d, l.done) {
			return nil, fmt.Errorf("listener %s: closed while backing off after %w", l.cfg.Name, err)
		}
	}
}

// accepted ends a failing spell.
func (l *Listener) accepted() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lastErr == nil {
		return
	}
	// Spells that end as fast as they start (a process at its descriptor
	// limit, accepting between failures) would write this line each time:
	// it is sampled too, and one held back leaves the failures it ended
	// to the next line that reports them.
	if n, ok := l.warn.Take(msgAcceptingAgain); ok {
		l.cfg.Logger.Info(msgAcceptingAgain, "listener", l.cfg.Name, "failing-for", l.now().Sub(l.since).Round(time.Millisecond),
			"suppressed_since_last", l.warn.Flush(msgAcceptFailed), "spells_suppressed", n)
	}
	l.backoff, l.lastErr, l.since = 0, nil, time.Time{}
}

// msgAcceptingAgain is the line that ends a spell of accept errors, and
// its key in Listener.warn.
const msgAcceptingAgain = "accepting again"

// failed records an accept error and returns how long to pause.
func (l *Listener) failed(err error) time.Duration {
	conn := connError(err)
	l.mu.Lock()
	now := l.now()
	l.errors++
	var pause time.Duration
	if !conn {
		if l.lastErr == nil || now.Sub(l.lastErrAt) >= l.cfg.FailWindow {
			l.since = now
		}
		l.backoff = min(max(2*l.backoff, l.cfg.MinBackoff), l.cfg.MaxBackoff)
		l.lastErr, l.lastErrAt, pause = err, now, l.backoff
	}
	l.mu.Unlock()
	l.warn.Log(l.cfg.Logger, slog.LevelWarn, msgAcceptFailed, msgAcceptFailed, "listener", l.cfg.Name, "err", err, "backoff", pause)
	if l.cfg.OnError != nil {
		l.cfg.OnError(err)
	}
	return pause
}

// msgAcceptFailed is the warning about an accept error, and its key in
// Listener.warn: one line a second at most, however many errors.
const msgAcceptFailed = "accept failed; retrying"

// connError reports whether err concerns one connection that died in the
// backlog, not the listener or the process: retrying at once is right.
func connError(err error) bool {
	return errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPROTO) || errors.Is(err, syscall.EPERM)
}

// Status reports whether the listener is failing to accept.
func (l *Listener) Status() Status {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := Status{Name: l.cfg.Name, Addr: l.Addr().String(), Errors: l.errors}
	if l.lastErr != nil && l.now().Sub(l.lastErrAt) < l.cfg.FailWindow {
		s.Failing, s.Err, s.Since = true, l.lastErr, l.since
	}
	return s
}

// Close stops Accept, also one that is backing off, and closes the wrapped
// listener. It is idempotent; later calls return nil.
func (l *Listener) Close() (err error) {
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}
