package memnet

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Port is the port every memnet address uses; nodes differ by IP.
const Port = 7946

// DefaultQueue is the number of packets a Transport buffers for its
// memberlist before further packets are dropped.
const DefaultQueue = 256

// ErrNameInUse means a Transport with that name is still open on the
// Network. Shut the old one down first (a node restarting reuses its address).
var ErrNameInUse = errors.New("memnet: node name in use by an open transport; shut it down before starting the node again")

// ErrFull means the Network has handed out all its addresses (64,000).
var ErrFull = errors.New("memnet: no address left; a Network holds at most 64000 node names")

// ErrRefused is returned by a dial to an address nobody listens on, or across a cut link.
var ErrRefused = errors.New("memnet: connection refused")

// Stats counts what a Network carried. Values, safe to copy.
type Stats struct {
	Packets        uint64 // packets queued to a receiver
	PacketBytes    uint64 // their payload bytes
	Dropped        uint64 // packets dropped: no receiver, cut link, filter, or full queue
	Streams        uint64 // stream connections accepted
	DialsRefused   uint64 // dials refused or timed out
	OpenTransports int    // transports not shut down
}

// Network connects the Transports it makes. The zero value is not usable;
// call New. Safe for concurrent use.
type Network struct {
	queue int

	mu     sync.RWMutex
	byAddr map[string]*Transport    // open transports
	addrOf map[string]string        // name -> address, stable for the Network's life
	cut    map[[2]string]struct{}   // directed (from name, to name) pairs that drop traffic
	silent map[string]time.Duration // address -> how long a dial there hangs (Silence)
	filter atomic.Pointer[func(from, to string, packet []byte) bool]

	packets, packetBytes, dropped, streams, refused atomic.Uint64
}

// New returns an empty Network whose transports buffer queue packets each
// (queue <= 0 means DefaultQueue).
func New(queue int) *Network {
	if queue <= 0 {
		queue = DefaultQueue
	}
	return &Network{
		queue:  queue,
		byAddr: make(map[string]*Transport),
		addrOf: make(map[string]string),
		cut:    make(map[[2]string]struct{}),
		silent: make(map[string]time.Duration),
	}
}

// NewTransport opens a transport for the node name. The name keeps its
// address across restarts; it fails with ErrNameInUse while a transport of
// that name is open. The transport is owned by the memberlist it is given to,
// which shuts it down.
func (n *Network) NewTransport(name string) (*Transport, error) {
	if name == "" {
		return nil, errors.New("memnet: empty node name; give every node a unique name")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	addr, ok := n.addrOf[name]
	if !ok {
		i := len(n.addrOf)
		if i >= 250*256 {
			return nil, ErrFull
		}
		addr = net.JoinHostPort(fmt.Sprintf("127.1.%d.%d", i/250, i%250+1), strconv.Itoa(Port))
		n.addrOf[name] = addr
	}
	if _, open := n.byAddr[addr]; open {
		return nil, fmt.Errorf("%w: %q at %s", ErrNameInUse, name, addr)
	}
	t := &Transport{
		net:      n,
		name:     name,
		addr:     addr,
		packetCh: make(chan *memberlist.Packet, n.queue),
		streamCh: make(chan net.Conn),
		done:     make(chan struct{}),
	}
	n.byAddr[addr] = t
	return t, nil
}

// Addr returns the address the node name has (or will have) on this Network.
func (n *Network) Addr(name string) (string, bool) {
	n.mu.RLock()
	defer n.mu.RUnlock()
	a, ok := n.addrOf[name]
	return a, ok
}

// Cut drops all traffic, both directions, between node a and each of the
// nodes bs: packets vanish and dials are refused. Established streams keep
// working until they time out, as TCP connections would.
func (n *Network) Cut(a string, bs ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, b := range bs {
		n.cut[[2]string{a, b}] = struct{}{}
		n.cut[[2]string{b, a}] = struct{}{}
	}
}

// Heal removes every Cut.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.cut)
}

// Silence makes a dial to addr hang for hold (or until the dialing
// transport shuts down) and then fail with a timeout, as one to a host
// that is powered off does until TCP gives up, whatever timeout the
// dialer asked for; hold 0 removes it. Packets to addr are dropped as to
// any address nobody listens on.
func (n *Network) Silence(addr string, hold time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if hold <= 0 {
		delete(n.silent, addr)
		return
	}
	n.silent[addr] = hold
}

// Filter drops every packet for which drop returns true, given the
// sending and the receiving node's names and the packet's bytes; nil
// removes the filter. drop is called concurrently and must not keep the
// packet. Streams are not filtered. Tests use it to lose particular
// gossip messages without cutting a link, which failure detection would
// notice.
func (n *Network) Filter(drop func(from, to string, packet []byte) bool) {
	if drop == nil {
		n.filter.Store(nil)
		return
	}
	n.filter.Store(&drop)
}

// Stats returns the counters so far.
func (n *Network) Stats() Stats {
	n.mu.RLock()
	open := len(n.byAddr)
	n.mu.RUnlock()
	return Stats{
		Packets:        n.packets.Load(),
		PacketBytes:    n.packetBytes.Load(),
		Dropped:        n.dropped.Load(),
		Streams:        n.streams.Load(),
		DialsRefused:   n.refused.Load(),
		OpenTransports: open,
	}
}

// route returns the open transport at addr, or nil if there is none or the
// link from -> to is cut.
func (n *Network) route(from, addr string) *Transport {
	n.mu.RLock()
	defer n.mu.RUnlock()
	t := n.byAddr[addr]
	if t == nil {
		return nil
	}
	if _, cut := n.cut[[2]string{from, t.name}]; cut {
		return nil
	}
	return t
}

// Transport is one node's end of a Network. Safe for concurrent use.
type Transport struct {
	net      *Network
	name     string
	addr     string
	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	done     chan struct{}
	once     sync.Once
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// Addr returns the transport's address, host:port.
func (t *Transport) Addr() string { return t.addr }

// FinalAdvertiseAddr returns the transport's own address; the arguments are
// ignored because a memnet node has exactly one address.
func (t *Transport) FinalAdvertiseAddr(string, int) (net.IP, int, error) {
	host, _, _ := net.SplitHostPort(t.addr)
	return net.ParseIP(host).To4(), Port, nil
}

// WriteTo sends a packet to addr; see WriteToAddress.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress copies b and queues it at the transport listening on
// a.Addr without blocking. Like a UDP send it reports no error when the
// packet is lost; Network.Stats counts the drops. The node name in a is
// ignored: delivery is by address, as on a real network.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	if t.closed() {
		return now, fmt.Errorf("memnet: write from %s after shutdown", t.addr)
	}
	dst := t.net.route(t.name, a.Addr)
	if dst == nil || dst.closed() {
		t.net.dropped.Add(1)
		return now, nil
	}
	if drop := t.net.filter.Load(); drop != nil && (*drop)(t.name, dst.name, b) {
		t.net.dropped.Add(1)
		return now, nil
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: addr(t.addr), Timestamp: now}
	select {
	case dst.packetCh <- p:
		t.net.packets.Add(1)
		t.net.packetBytes.Add(uint64(len(b)))
	default:
		t.net.dropped.Add(1)
	}
	return now, nil
}

// PacketCh returns the channel memberlist reads packets from.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout dials addr; see DialAddressTimeout.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout connects to the transport listening on a.Addr with a
// synchronous in-memory pipe. It fails at once if nobody listens there or
// the link is cut, and with a timeout if the peer does not accept within
// timeout (zero means no timeout).
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if t.closed() {
		return nil, fmt.Errorf("memnet: dial %s from %s after shutdown", a.Addr, t.addr)
	}
	t.net.mu.RLock()
	hold := t.net.silent[a.Addr]
	t.net.mu.RUnlock()
	if hold > 0 {
		tm := time.NewTimer(hold)
		defer tm.Stop()
		select {
		case <-tm.C:
		case <-t.done:
		}
		return nil, &net.OpError{Op: "dial", Net: "memnet", Addr: addr(a.Addr), Err: errTimeout{}}
	}
	dst := t.net.route(t.name, a.Addr)
	if dst == nil {
		t.net.refused.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "memnet", Addr: addr(a.Addr), Err: ErrRefused}
	}
	var timer <-chan time.Time
	if timeout > 0 {
		tm := time.NewTimer(timeout)
		defer tm.Stop()
		timer = tm.C
	}
	local, remote := net.Pipe()
	c1 := &conn{Conn: local, local: addr(t.addr), remote: addr(dst.addr)}
	c2 := &conn{Conn: remote, local: addr(dst.addr), remote: addr(t.addr)}
	var err error
	select {
	case dst.streamCh <- c2:
		t.net.streams.Add(1)
		return c1, nil
	case <-dst.done:
		err = ErrRefused
	case <-t.done:
		err = fmt.Errorf("memnet: %s shut down while dialing", t.addr)
	case <-timer:
		err = errTimeout{}
	}
	_ = local.Close()
	_ = remote.Close()
	t.net.refused.Add(1)
	return nil, &net.OpError{Op: "dial", Net: "memnet", Addr: addr(a.Addr), Err: err}
}

// StreamCh returns the channel memberlist accepts streams from.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown detaches the transport from its Network: packets to its address
// are dropped and dials refused from now on. Idempotent.
func (t *Transport) Shutdown() error {
	t.once.Do(func() {
		t.net.mu.Lock()
		if t.net.byAddr[t.addr] == t {
			delete(t.net.byAddr, t.addr)
		}
		t.net.mu.Unlock()
		close(t.done)
	})
	return nil
}

func (t *Transport) closed() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// addr is a net.Addr for a memnet address.
type addr string

func (a addr) Network() string { return "memnet" }
func (a addr) String() string  { return string(a) }

// conn is a pipe end that reports memnet addresses.
type conn struct {
	net.Conn
	local, remote net.Addr
}

func (c *conn) LocalAddr() net.Addr  { return c.local }
func (c *conn) RemoteAddr() net.Addr { return c.remote }

// errTimeout is a net.Error that reports a timeout.
type errTimeout struct{}

func (errTimeout) Error() string   { return "memnet: dial timed out" }
func (errTimeout) Timeout() bool   { return true }
func (errTimeout) Temporary() bool { return true }
