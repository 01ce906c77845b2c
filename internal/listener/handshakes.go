package listener

import (
	"net"
	"net/netip"
	"sync"
)

// Handshakes is a net.Listener that refuses (closes at once) a connection
// when too many connections are still in their handshake, in total or from
// its source IP. A connection counts from Accept until Settle or its Close.
// It is safe for concurrent use and owns the wrapped listener.
type Handshakes struct {
	net.Listener
	slots *Slots
}

// NewHandshakes wraps l; it returns an error for limits out of range.
func NewHandshakes(l net.Listener, lim Limits) (*Handshakes, error) {
	s, err := NewSlots(lim)
	if err != nil {
		return nil, err
	}
	return &Handshakes{Listener: l, slots: s}, nil
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
		if h.slots.Acquire(src) {
			return &pendingConn{Conn: c, slots: h.slots, src: src}, nil
		}
		c.Close()
	}
}

// Pending returns the number of connections in their handshake.
func (h *Handshakes) Pending() int { return h.slots.Held() }

// Source is the source a limit per source counts a connection from a by:
// its IPv4 address, or its IPv6 /64 (a host is usually given a whole /64).
// ok is false for an address that is not TCP (a test's pipe).
func Source(a net.Addr) (src netip.Prefix, ok bool) {
	ta, isTCP := a.(*net.TCPAddr)
	if !isTCP {
		return netip.Prefix{}, false
	}
	ip := ta.AddrPort().Addr().Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	src, err := ip.Prefix(bits)
	return src, err == nil
}

// source is the key a connection's slot is counted under: its Source, or
// the network name for addresses without one.
func source(a net.Addr) string {
	if src, ok := Source(a); ok {
		return src.Addr().String()
	}
	if a == nil {
		return ""
	}
	return a.Network()
}

// pendingConn is a connection counted by its Handshakes until settled.
type pendingConn struct {
	net.Conn
	slots *Slots
	src   string
	once  sync.Once
}

func (c *pendingConn) settle() { c.once.Do(func() { c.slots.Release(c.src) }) }

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
