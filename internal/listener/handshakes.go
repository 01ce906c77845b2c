package listener

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// HandshakeLimits bound a Handshakes listener.
type HandshakeLimits struct {
	// Name labels the listener in logs, e.g. "control-plane". Required.
	Name string
	// Logger receives the rate-limited refusal warnings; nil discards them.
	Logger *slog.Logger
	// Total is the most connections whose handshake is unfinished; >= 1.
	Total int
	// PerSource is the most of those from one source address (an IP; all
	// unix-socket peers are one source); 1 <= PerSource <= Total.
	PerSource int
	// OnRefuse is called for every connection refused; nil: none.
	OnRefuse func(source string)
}

// Handshakes is a net.Listener that refuses a connection when too many
// connections are still in their handshake, in total or from its source.
// A connection counts from Accept until Settle or its Close. It is safe
// for concurrent use and owns the wrapped listener.
type Handshakes struct {
	net.Listener
	lim HandshakeLimits
	log *slog.Logger

	mu       sync.Mutex
	pending  int
	bySource map[string]int
	warn     warnings
}

// NewHandshakes wraps l; it returns an error for limits out of range.
func NewHandshakes(l net.Listener, lim HandshakeLimits) (*Handshakes, error) {
	if lim.Name == "" || lim.Total < 1 || lim.PerSource < 1 || lim.PerSource > lim.Total {
		return nil, fmt.Errorf("listener: handshake limits %q total %d per source %d: name one and use 1 <= per source <= total", lim.Name, lim.Total, lim.PerSource)
	}
	log := lim.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Handshakes{Listener: l, lim: lim, log: log, bySource: map[string]int{}, warn: warnings{every: DefaultLogEvery}}, nil
}

// Accept returns the next connection within the limits, closing the ones
// beyond them as they come.
func (h *Handshakes) Accept() (net.Conn, error) {
	for {
		c, err := h.Listener.Accept()
		if err != nil {
			return nil, err
		}
		src := source(c.RemoteAddr())
		if h.acquire(src) {
			return &pendingConn{Conn: c, h: h, src: src}, nil
		}
		c.Close()
		if h.lim.OnRefuse != nil {
			h.lim.OnRefuse(src)
		}
	}
}

// acquire takes a slot for src, or logs (rate-limited) why it cannot.
func (h *Handshakes) acquire(src string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.bySource[src]
	if h.pending < h.lim.Total && n < h.lim.PerSource {
		h.pending++
		h.bySource[src] = n + 1
		return true
	}
	if ok, suppressed := h.warn.allow(time.Now()); ok {
		h.log.Warn("refused a connection: too many unfinished handshakes", "listener", h.lim.Name, "source", src,
			"pending", h.pending, "from-source", n, "limit", h.lim.Total, "limit-per-source", h.lim.PerSource, "suppressed", suppressed)
	}
	return false
}

func (h *Handshakes) release(src string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pending--
	if h.bySource[src]--; h.bySource[src] <= 0 {
		delete(h.bySource, src)
	}
}

// Pending returns the number of connections in their handshake.
func (h *Handshakes) Pending() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.pending
}

// source is the address a connection's slot is counted under: its IP, or
// the network name for addresses without one (unix sockets).
func source(a net.Addr) string {
	if a == nil {
		return ""
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap().String()
	}
	return a.Network()
}

// pendingConn is a connection counted by its Handshakes until settled.
type pendingConn struct {
	net.Conn
	h    *Handshakes
	src  string
	once sync.Once
}

func (c *pendingConn) settle() { c.once.Do(func() { c.h.release(c.src) }) }

func (c *pendingConn) Close() error {
	c.settle()
	return c.Conn.Close()
}

// Settle marks the handshake of c, a connection from Handshakes.Accept,
// finished: it no longer counts against the limits. Other connections are
// left alone; settling twice does nothing.
func Settle(c net.Conn) {
	if p, ok := c.(*pendingConn); ok {
		p.settle()
	}
}
