package listener

import (
	"log/slog"
	"net"
	"slices"
	"sync"
)

// Conns is a net.Listener that bounds the connections open at once, in
// total and from each source IP (Limits), for a server whose clients keep
// connections open and idle between requests (HTTP keep-alive). At a
// limit it makes room by closing the oldest idle connection: the source's
// own at the per-source limit, anyone's at the total. It refuses (closes)
// the new connection only when every connection it could close is busy.
// So a client that holds its source's connections idle cannot keep that
// source's other clients (a local health probe, a scraper) out, and a
// request being served is never cut.
//
// A connection counts from Accept until its Close. It is idle from Accept
// until the server marks it busy with SetIdle (net/http: from its
// ConnState hook), so one that never sends a request can be closed too.
// Accept and Close scan the connections open, so Total is meant to be
// small (tens). Safe for concurrent use; it owns the wrapped listener.
type Conns struct {
	net.Listener
	limited

	mu       sync.Mutex
	open     []*trackedConn // oldest first; at most Total
	bySource map[string]int
}

// NewConns wraps l; it returns an error for limits out of range.
func NewConns(l net.Listener, lim Limits) (*Conns, error) {
	c := &Conns{Listener: l, bySource: map[string]int{}}
	if err := c.init(lim); err != nil {
		return nil, err
	}
	return c, nil
}

// Accept returns the next connection, closing an idle one to make room
// for it when a limit is reached, and closing the ones no room can be
// made for as they come.
func (c *Conns) Accept() (net.Conn, error) {
	for {
		nc, err := c.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if tc := c.admit(nc); tc != nil {
			return tc, nil
		}
		nc.Close()
	}
}

// msgClosedIdle is the line about an idle connection closed to make room,
// and its key in limited.warn.
const msgClosedIdle = "closed the oldest idle connection to make room"

// admit counts nc, closing the oldest idle connection if a limit is
// reached; nil when every connection that could make room is busy.
func (c *Conns) admit(nc net.Conn) *trackedConn {
	src := source(nc.RemoteAddr())
	c.mu.Lock()
	n := c.bySource[src]
	var victim *trackedConn
	if n >= c.lim.PerSource || len(c.open) >= c.lim.Total {
		own := n >= c.lim.PerSource // room from src's own, which also frees one of the total
		for _, tc := range c.open {
			if tc.idle && (!own || tc.src == src) {
				victim = tc
				break
			}
		}
		if victim == nil {
			held := len(c.open)
			c.mu.Unlock()
			c.refuse(src, held, n)
			return nil
		}
		c.forget(victim)
	}
	tc := &trackedConn{Conn: nc, owner: c, src: src, idle: true}
	c.open = append(c.open, tc)
	c.bySource[src]++
	held := len(c.open)
	c.mu.Unlock()
	if victim != nil {
		victim.Conn.Close()
		c.warn.Log(c.log, slog.LevelInfo, msgClosedIdle, msgClosedIdle, "listener", c.lim.Name, "source", src,
			"closed-from", victim.src, "held", held, "limit", c.lim.Total, "limit-per-source", c.lim.PerSource)
	}
	return tc
}

// forget stops counting tc, once; c.mu is held.
func (c *Conns) forget(tc *trackedConn) {
	if tc.gone {
		return
	}
	tc.gone = true
	i := slices.Index(c.open, tc)
	c.open = slices.Delete(c.open, i, i+1)
	if c.bySource[tc.src]--; c.bySource[tc.src] <= 0 {
		delete(c.bySource, tc.src)
	}
}

// trackedConn is a connection counted by its Conns until closed.
type trackedConn struct {
	net.Conn
	owner *Conns
	src   string
	idle  bool // may be closed to make room; guarded by owner.mu
	gone  bool // no longer counted; guarded by owner.mu
}

func (tc *trackedConn) Close() error {
	tc.owner.mu.Lock()
	tc.owner.forget(tc)
	tc.owner.mu.Unlock()
	return tc.Conn.Close()
}

// SetIdle marks c, a connection from Conns.Accept, idle (between
// requests: Accept may close it to make room) or busy (serving a request:
// it is not closed). Other connections are left alone. A request whose
// first bytes arrive as its idle connection is closed fails as one that
// meets an idle timeout does; HTTP clients retry it on a new connection.
func SetIdle(c net.Conn, idle bool) {
	if tc, ok := c.(*trackedConn); ok {
		tc.owner.mu.Lock()
		tc.idle = idle
		tc.owner.mu.Unlock()
	}
}
