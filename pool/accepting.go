package pool

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"

	"github.com/farmem/farmem/internal/listener"
)

// Names of the daemon's listeners, as readiness, logs and the
// farmem_accept_errors_total metric show them.
const (
	listenerUnix    = "unix-socket"   // Config.Socket: local clients and memctl
	listenerControl = "control-plane" // Config.Listen: peers and remote memctl
	listenerData    = "data-plane"    // Config.DataListen: one-sided operations
	listenerMetrics = "metrics"       // Config.Metrics: /metrics, /healthz, /readyz
)

// listeners are the daemon's listeners, each wrapped so that its accept
// survives resource exhaustion (package internal/listener), for readiness,
// health and gossip to ask which of them is failing. A nil *listeners
// wraps without keeping (a data plane built without a daemon, in tests).
// Safe for concurrent use.
type listeners struct {
	log    *slog.Logger
	errors *prometheus.CounterVec // farmem_accept_errors_total{listener}

	mu  sync.Mutex
	all []*listener.Listener
}

func newListeners(log *slog.Logger, reg *prometheus.Registry) *listeners {
	ls := &listeners{log: log, errors: promFactory{reg}.counterVec("accept_errors_total",
		"Errors accepting a connection (EMFILE, ENFILE, ENOBUFS, ENOMEM, aborted connections), by listener; each is retried.", "listener")}
	for _, n := range []string{listenerUnix, listenerControl, listenerData, listenerMetrics} {
		ls.errors.WithLabelValues(n)
	}
	return ls
}

// wrap makes l's accept retry and keeps it under name.
func (ls *listeners) wrap(l net.Listener, name string) *listener.Listener {
	if ls == nil {
		return listener.New(l, listener.Config{Name: name})
	}
	c := ls.errors.WithLabelValues(name)
	wl := listener.New(l, listener.Config{Name: name, Logger: ls.log, OnError: func(error) { c.Inc() }})
	ls.mu.Lock()
	ls.all = append(ls.all, wl)
	ls.mu.Unlock()
	return wl
}

// statuses reports every listener, in the order they were made.
func (ls *listeners) statuses() []listener.Status {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	out := make([]listener.Status, len(ls.all))
	for i, l := range ls.all {
		out[i] = l.Status()
	}
	return out
}

// anyFailing reports whether some listener is failing to accept.
func (ls *listeners) anyFailing() bool {
	for _, s := range ls.statuses() {
		if s.Failing {
			return true
		}
	}
	return false
}

// Bounds of the TCP control plane's connections before they are
// established: a source that opens connections and never finishes their
// TLS handshake holds at most maxHandshakesPerSource of them at once, and
// everyone together maxHandshakes, each for at most handshakeTimeout.
const (
	maxHandshakes          = 512
	maxHandshakesPerSource = 64
	handshakeTimeout       = 10 * time.Second // TLS and HTTP/2 preface, both gRPC servers
)

// listenControl binds the TCP control plane with its accept retrying and
// its unfinished handshakes bounded. The gRPC server's credentials must
// call listener.Settle (settlingCreds) so that finished handshakes stop
// counting.
func listenControl(addr string, ls *listeners, log *slog.Logger) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w (choose another with --listen)", addr, err)
	}
	h, err := listener.NewHandshakes(ls.wrap(l, listenerControl), listener.Limits{
		Name: listenerControl, Logger: log, Total: maxHandshakes, PerSource: maxHandshakesPerSource,
	})
	if err != nil {
		l.Close()
		return nil, err
	}
	return h, nil
}

// settlingCreds are transport credentials that tell the control plane's
// listener when a connection's handshake is over (listener.Settle).
type settlingCreds struct {
	credentials.TransportCredentials
}

func (s settlingCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	defer listener.Settle(c)
	return s.TransportCredentials.ServerHandshake(c)
}

func (s settlingCreds) Clone() credentials.TransportCredentials {
	return settlingCreds{s.TransportCredentials.Clone()}
}

// listenerCheck is how often the daemon looks whether a listener fails to
// accept, to tell the health service.
const listenerCheck = 200 * time.Millisecond
