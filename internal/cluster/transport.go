package cluster

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// counters are the gossip traffic counters of one node.
type counters struct {
	packetsOut, packetBytesOut atomic.Uint64
	packetsIn, packetBytesIn   atomic.Uint64
	streams                    atomic.Uint64
	streamBytesOut             atomic.Uint64
	streamBytesIn              atomic.Uint64
	handoffDrops               atomic.Uint64 // see Stats
	broadcastCalls             atomic.Uint64
	broadcastRoom              atomic.Uint64
	capacitySends              atomic.Uint64
	resyncs                    atomic.Uint64
	lanePackets                atomic.Uint64
	reconnects, reconnected    atomic.Uint64
}

// countingTransport wraps the node's transport to count gossip bytes. One
// goroutine forwards inbound packets and streams (a channel receive cannot be
// intercepted otherwise); it stops in Shutdown, after the inner transport.
type countingTransport struct {
	inner    memberlist.NodeAwareTransport
	c        *counters
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	done     chan struct{}
	wg       sync.WaitGroup
	once     sync.Once
	err      error
}

var _ memberlist.NodeAwareTransport = (*countingTransport)(nil)

func newCountingTransport(inner memberlist.NodeAwareTransport, c *counters) *countingTransport {
	t := &countingTransport{
		inner:    inner,
		c:        c,
		packetCh: make(chan *memberlist.Packet),
		streamCh: make(chan net.Conn),
		done:     make(chan struct{}),
	}
	t.wg.Add(1)
	go t.forward()
	return t
}

func (t *countingTransport) forward() {
	defer t.wg.Done()
	pin, sin := t.inner.PacketCh(), t.inner.StreamCh()
	for {
		select {
		case p := <-pin:
			t.c.packetsIn.Add(1)
			t.c.packetBytesIn.Add(uint64(len(p.Buf)))
			select {
			case t.packetCh <- p:
			case <-t.done:
				return
			}
		case conn := <-sin:
			t.c.streams.Add(1)
			select {
			case t.streamCh <- &countingConn{Conn: conn, c: t.c}:
			case <-t.done:
				_ = conn.Close()
				return
			}
		case <-t.done:
			return
		}
	}
}

func (t *countingTransport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return t.inner.FinalAdvertiseAddr(ip, port)
}

func (t *countingTransport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (t *countingTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	ts, err := t.inner.WriteToAddress(b, a)
	if err == nil {
		t.c.packetsOut.Add(1)
		t.c.packetBytesOut.Add(uint64(len(b)))
	}
	return ts, err
}

func (t *countingTransport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

func (t *countingTransport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *countingTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	conn, err := t.inner.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	t.c.streams.Add(1)
	return &countingConn{Conn: conn, c: t.c}, nil
}

func (t *countingTransport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown stops the inner transport first (its listeners may be blocked
// handing us a packet, which forward still drains), then the forwarder.
func (t *countingTransport) Shutdown() error {
	t.once.Do(func() {
		t.err = t.inner.Shutdown()
		close(t.done)
		t.wg.Wait()
	})
	return t.err
}

// countingConn counts stream bytes in both directions.
type countingConn struct {
	net.Conn
	c *counters
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.c.streamBytesIn.Add(uint64(n))
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.c.streamBytesOut.Add(uint64(n))
	return n, err
}
