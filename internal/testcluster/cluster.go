package testcluster

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"sync"
	"testing"
)

// Cluster is a set of test hosts, each in its own network namespace, joined
// by a bridge in a namespace of its own. New builds it and removes it when
// the test ends. A Cluster is safe for concurrent use; its exported fields
// are set by New and must not be changed.
type Cluster struct {
	// Hosts are the test hosts, Hosts[i] being "<prefix>-h<i>".
	Hosts []*Host

	prefix string
	subnet netip.Prefix

	mu    sync.Mutex
	procs []*Process // every process started by Start/StartCmd, for teardown
}

// Host is one test host: a network namespace with one interface, eth0,
// holding Addr, plus lo. A Host is safe for concurrent use; its exported
// fields are set by New and must not be changed.
type Host struct {
	// Name is the network namespace's name, as `ip netns list` shows it.
	Name string
	// Addr is the host's IPv4 address on eth0.
	Addr netip.Addr
	// Index is the host's position in Cluster.Hosts.
	Index int

	cluster *Cluster
	port    string // the bridge port (veth end in the switch namespace)
}

// New creates a cluster of opts.Hosts test hosts and registers t.Cleanup
// to kill every process started in them and delete every namespace. It
// first removes whatever an earlier run with the same prefix, or a crashed
// test binary with a default prefix, left behind. It skips the test when
// not root, when not on Linux, or when `ip` or `ip netns` is missing, and
// fails it on invalid options or when a step of the set-up fails.
func New(t testing.TB, opts Options) *Cluster {
	t.Helper()
	cfg, err := opts.resolve()
	if err != nil {
		t.Fatal(err)
	}
	return newCluster(t, cfg)
}

// Prefix returns the name prefix of the cluster's namespaces.
func (c *Cluster) Prefix() string { return c.prefix }

// Subnet returns the hosts' network.
func (c *Cluster) Subnet() netip.Prefix { return c.subnet }

// SwitchNamespace returns the name of the namespace that holds the bridge.
func (c *Cluster) SwitchNamespace() string { return switchName(c.prefix) }

func (c *Cluster) track(p *Process) {
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
}

// Command returns a command that runs name inside the host's namespace, as
// `ip netns exec <Name> name args...`; ip execs name in place, so the
// command's process is name itself. The caller starts and waits for it as
// with any exec.Cmd; namespaces' processes still running at cleanup are
// killed.
func (h *Host) Command(ctx context.Context, name string, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", h.Name, name}, args...)...)
}

// Start starts name inside the host's namespace in a process group of its
// own, with stdout and stderr captured, and registers t.Cleanup to SIGKILL
// the group (logging the output when the test failed). It fails the test
// if the process cannot be started. Do not call it inside Do.
func (h *Host) Start(t testing.TB, name string, args ...string) *Process {
	t.Helper()
	return h.StartCmd(t, h.Command(context.Background(), name, args...))
}

// StartCmd is Start for a command made by Command, so the caller can set
// Env, Dir or ExtraFiles first. Its Stdout and Stderr must be nil: they are
// set to the capture buffer.
func (h *Host) StartCmd(t testing.TB, cmd *exec.Cmd) *Process {
	t.Helper()
	p, err := h.startCmd(cmd)
	if err != nil {
		t.Fatal(err)
	}
	h.cluster.track(p)
	t.Cleanup(func() { p.stop(t) })
	return p
}

// LinkDown cuts the host off: it sets both ends of its veth pair down, so
// the host's own sends fail at once (no route is left) and traffic to it is
// dropped at the bridge. It fails the test if `ip` fails.
func (h *Host) LinkDown(t testing.TB) {
	t.Helper()
	if err := h.setLink("down"); err != nil {
		t.Fatal(err)
	}
}

// LinkUp undoes LinkDown and waits until the link carries traffic again
// (both ends up, bridge port forwarding). It fails the test if `ip` fails
// or the link is not up within 10 seconds.
func (h *Host) LinkUp(t testing.TB) {
	t.Helper()
	if err := h.setLink("up"); err != nil {
		t.Fatal(err)
	}
}

// Do runs fn on an OS thread that is inside the host's namespace, so
// sockets fn creates belong to the host and keep belonging to it. The
// thread is locked to fn and moved back afterwards (or, if moving back
// fails, discarded), so no other goroutine ever runs in the namespace.
// Goroutines fn starts run in the test's own namespace; fn must not call
// Start. A panic in fn is re-raised in the caller.
func (h *Host) Do(fn func() error) error { return h.do(fn) }

// Dial connects from inside the host's namespace, for a client in the test
// process (a gRPC or alloc client) that must talk to a daemon in another
// host. network is tcp, tcp4, tcp6, udp, udp4 or udp6; addr must be a
// literal IP:port, as no name is resolved inside a namespace. Its signature
// matches net.Dialer.DialContext.
func (h *Host) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if err := checkDial(network, addr, "tcp", "udp"); err != nil {
		return nil, err
	}
	var c net.Conn
	err := h.Do(func() error {
		var d net.Dialer
		var err error
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

// Listen opens a TCP listener inside the host's namespace, for a server in
// the test process; the connections it accepts belong to the host too.
// network is tcp, tcp4 or tcp6; addr is a literal IP:port (port 0 picks
// one, 0.0.0.0 means every address of the host).
func (h *Host) Listen(ctx context.Context, network, addr string) (net.Listener, error) {
	if err := checkDial(network, addr, "tcp"); err != nil {
		return nil, err
	}
	var l net.Listener
	err := h.Do(func() error {
		var lc net.ListenConfig
		var err error
		l, err = lc.Listen(ctx, network, addr)
		return err
	})
	return l, err
}

// ListenPacket opens a UDP socket inside the host's namespace (for gossip
// such as memberlist's). network is udp, udp4 or udp6; addr is a literal
// IP:port.
func (h *Host) ListenPacket(ctx context.Context, network, addr string) (net.PacketConn, error) {
	if err := checkDial(network, addr, "udp"); err != nil {
		return nil, err
	}
	var pc net.PacketConn
	err := h.Do(func() error {
		var lc net.ListenConfig
		var err error
		pc, err = lc.ListenPacket(ctx, network, addr)
		return err
	})
	return pc, err
}

// checkDial accepts networks of the given families and literal IP:port
// addresses only: a host name would be resolved by a resolver that may run
// on another thread, outside the namespace.
func checkDial(network, addr string, families ...string) error {
	ok := false
	for _, f := range families {
		if network == f || network == f+"4" || network == f+"6" {
			ok = true
		}
	}
	if !ok {
		return fmt.Errorf("%w: got %q", ErrNetwork, network)
	}
	if _, err := netip.ParseAddrPort(addr); err != nil {
		return fmt.Errorf("%w: got %q: %v", ErrAddress, addr, err)
	}
	return nil
}
