//go:build linux

package testcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startEcho starts the echo server in h and waits until it listens.
func startEcho(t *testing.T, h *Host, addr string) *Process {
	t.Helper()
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := h.Command(context.Background(), exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), echoEnv+"="+addr)
	p := h.StartCmd(t, cmd)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	require.NoError(t, p.WaitOutput(ctx, "listening on"))
	return p
}

// echo dials addr from inside h, sends msg, and checks it comes back. It
// returns the connection's local address.
func echo(ctx context.Context, h *Host, addr, msg string) (netip.AddrPort, error) {
	ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	c, err := h.Dial(ctx, "tcp", addr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl.Add(2 * time.Second)); err != nil {
			return netip.AddrPort{}, err
		}
	}
	if _, err := io.WriteString(c, msg); err != nil {
		return netip.AddrPort{}, err
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(c, got); err != nil {
		return netip.AddrPort{}, err
	}
	if string(got) != msg {
		return netip.AddrPort{}, fmt.Errorf("echo from %s: got %q, want %q", addr, got, msg)
	}
	return c.LocalAddr().(*net.TCPAddr).AddrPort(), nil
}

func ipOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := ip(args...)
	require.NoError(t, err)
	return out
}

func TestEchoBetweenHosts(t *testing.T) {
	t.Parallel()
	c := New(t, Options{Hosts: 3})
	require.Len(t, c.Hosts, 3)
	for _, h := range c.Hosts {
		p := startEcho(t, h, "0.0.0.0:7007")
		// The process runs in the host's namespace, not the root one.
		require.Equal(t, h.Name, strings.TrimSpace(ipOut(t, "netns", "identify", strconv.Itoa(p.PID))))
	}
	for _, from := range c.Hosts {
		for _, to := range c.Hosts {
			if from == to {
				continue
			}
			addr := netip.AddrPortFrom(to.Addr, 7007).String()
			local, err := echo(t.Context(), from, addr, "ping from "+from.Name)
			require.NoError(t, err, "%s -> %s", from.Name, addr)
			// The socket was made in the dialing host's namespace.
			require.Equal(t, from.Addr, local.Addr())
		}
	}
}

func TestLoopbackIsPerHost(t *testing.T) {
	t.Parallel()
	c := New(t, Options{Hosts: 2})
	startEcho(t, c.Hosts[0], "127.0.0.1:7008")
	_, err := echo(t.Context(), c.Hosts[0], "127.0.0.1:7008", "local")
	require.NoError(t, err)
	// h1's loopback is its own: nothing listens there.
	_, err = echo(t.Context(), c.Hosts[1], "127.0.0.1:7008", "local")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	// Nor is h0's loopback server reachable on h0's address.
	_, err = echo(t.Context(), c.Hosts[1], netip.AddrPortFrom(c.Hosts[0].Addr, 7008).String(), "x")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
}

func TestNoRouteOutsideSubnet(t *testing.T) {
	t.Parallel()
	c := New(t, Options{Hosts: 2})
	for _, h := range c.Hosts {
		// No default route: the kernel refuses at connect, before any
		// packet is sent.
		_, err := h.Dial(t.Context(), "tcp", "10.255.255.1:80")
		require.ErrorIs(t, err, syscall.ENETUNREACH, h.Name)

		var routes []struct {
			Dst string `json:"dst"`
			Dev string `json:"dev"`
		}
		require.NoError(t, json.Unmarshal([]byte(ipOut(t, "-j", "-n", h.Name, "route", "show")), &routes))
		require.Len(t, routes, 1, "host %s must have only its subnet's route", h.Name)
		require.Equal(t, c.Subnet().String(), routes[0].Dst)
		require.Equal(t, "eth0", routes[0].Dev)
	}
	// The bridge has no address, and nothing was added to the root namespace.
	sw := ipOut(t, "-n", c.SwitchNamespace(), "-4", "addr", "show")
	require.NotContains(t, sw, "inet ")
	require.NotContains(t, ipOut(t, "link", "show"), c.Prefix())
}

func TestLinkDownPartitions(t *testing.T) {
	t.Parallel()
	c := New(t, Options{Hosts: 2})
	h0, h1 := c.Hosts[0], c.Hosts[1]
	startEcho(t, h1, "0.0.0.0:7009")
	startEcho(t, h0, "0.0.0.0:7009")
	to1 := netip.AddrPortFrom(h1.Addr, 7009).String()
	to0 := netip.AddrPortFrom(h0.Addr, 7009).String()
	_, err := echo(t.Context(), h0, to1, "before")
	require.NoError(t, err)

	h1.LinkDown(t)
	_, err = echo(t.Context(), h0, to1, "during")
	require.Error(t, err, "h1 is cut off, yet h0 reached it")
	_, err = echo(t.Context(), h1, to0, "during")
	require.ErrorIs(t, err, syscall.ENETUNREACH, "h1's route must be gone while its link is down")

	h1.LinkUp(t)
	// A neighbour entry that failed during the partition may need a fresh
	// probe; allow a few bounded attempts.
	for attempt := 1; ; attempt++ {
		_, err = echo(t.Context(), h0, to1, "after")
		if err == nil || attempt == 10 {
			break
		}
	}
	require.NoError(t, err, "h1 unreachable after LinkUp")
	_, err = echo(t.Context(), h1, to0, "after")
	require.NoError(t, err)
}

func TestDoRunsInNamespace(t *testing.T) {
	t.Parallel()
	c := New(t, Options{Hosts: 1})
	h := c.Hosts[0]
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat("/run/netns/"+h.Name, &st))
	want := fmt.Sprintf("net:[%d]", st.Ino)

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before, err := os.Readlink("/proc/thread-self/ns/net")
	require.NoError(t, err)
	require.NotEqual(t, want, before)

	var inside string
	require.NoError(t, h.Do(func() error {
		var err error
		inside, err = os.Readlink("/proc/thread-self/ns/net")
		return err
	}))
	require.Equal(t, want, inside)
	after, err := os.Readlink("/proc/thread-self/ns/net")
	require.NoError(t, err)
	require.Equal(t, before, after, "the caller's thread must stay in its namespace")

	errMine := errors.New("mine")
	require.ErrorIs(t, h.Do(func() error { return errMine }), errMine)
	require.PanicsWithValue(t, "boom", func() { _ = h.Do(func() error { panic("boom") }) })

	// A listener made in the namespace serves there: h reaches it on its
	// own address, and the connection's peer is h itself.
	l, err := h.Listen(t.Context(), "tcp4", netip.AddrPortFrom(h.Addr, 0).String())
	require.NoError(t, err)
	defer l.Close()
	accepted := make(chan error, 1)
	go func() {
		conn, err := l.Accept()
		if err == nil {
			_, err = io.Copy(conn, conn)
			conn.Close()
		}
		accepted <- err
	}()
	local, err := echo(t.Context(), h, l.Addr().String(), "in-process")
	require.NoError(t, err)
	require.Equal(t, h.Addr, local.Addr())
	require.NoError(t, <-accepted)

	pc, err := h.ListenPacket(t.Context(), "udp4", "127.0.0.1:0")
	require.NoError(t, err)
	require.NoError(t, pc.Close())
}

func TestCommand(t *testing.T) {
	t.Parallel()
	c := New(t, Options{Hosts: 2})
	for _, h := range c.Hosts {
		out, err := h.Command(t.Context(), "ip", "-br", "-4", "addr", "show").CombinedOutput()
		require.NoError(t, err)
		require.Contains(t, string(out), h.Addr.String())
		require.Regexp(t, `(?m)^lo\s+UNKNOWN\s+127\.0\.0\.1/8`, string(out))
	}
}

func TestProcessSignalAndKill9(t *testing.T) {
	t.Parallel()
	c := New(t, Options{Hosts: 1})
	h := c.Hosts[0]
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	p := h.Start(t, "sh", "-c", `trap 'echo got TERM; exit 3' TERM; echo ready; while :; do sleep 0.05; done`)
	require.NoError(t, p.WaitOutput(ctx, "ready"))
	require.NoError(t, p.Signal(syscall.SIGTERM))
	var exit *exec.ExitError
	require.ErrorAs(t, p.Wait(), &exit)
	require.Equal(t, 3, exit.ExitCode())
	require.Contains(t, p.Output(), "got TERM")
	require.ErrorIs(t, p.Signal(syscall.SIGTERM), os.ErrProcessDone)
	require.ErrorIs(t, p.WaitOutput(ctx, "never printed"), ErrNotReady)
	require.NoError(t, p.Kill9(), "killing an exited process is not an error")

	// Kill9 takes the children down too.
	p = h.Start(t, "sh", "-c", `sleep 600 & echo child $!; wait`)
	require.NoError(t, p.WaitOutput(ctx, "child "))
	require.NoError(t, p.Kill9())
	require.ErrorAs(t, p.Wait(), &exit)
	require.Equal(t, "signal: killed", exit.Error())
	require.Eventually(t, func() bool {
		return strings.TrimSpace(ipOut(t, "netns", "pids", h.Name)) == ""
	}, 10*time.Second, 20*time.Millisecond, "the child survived its group's SIGKILL")

	cmd := h.Command(ctx, "true")
	cmd.Stdout = io.Discard
	_, err := h.startCmd(cmd)
	require.ErrorIs(t, err, ErrCommand)
}

func TestCleanupLeavesNothing(t *testing.T) {
	t.Parallel()
	prefix := fmt.Sprintf("fmtt%d", os.Getpid())
	var managed *Process
	var unmanaged *exec.Cmd
	t.Run("cluster", func(t *testing.T) {
		c := New(t, Options{Hosts: 2, Prefix: prefix})
		managed = c.Hosts[0].Start(t, "sleep", "600")
		unmanaged = c.Hosts[1].Command(context.Background(), "sleep", "600")
		require.NoError(t, unmanaged.Start())
	})
	if managed == nil || unmanaged == nil {
		t.Skip("cluster not made (see the subtest)")
	}
	select {
	case <-managed.Done():
	default:
		t.Fatal("the started process outlived the cluster")
	}
	// The teardown killed the process the test started by hand, too.
	require.EqualError(t, unmanaged.Wait(), "signal: killed")
	left, err := namespaces(prefix)
	require.NoError(t, err)
	require.Empty(t, left)
	require.NotContains(t, ipOut(t, "netns", "list"), prefix)
	require.NotContains(t, ipOut(t, "link", "show"), prefix)
	require.NoError(t, Cleanup(prefix))
	require.NoError(t, Cleanup(prefix))
	require.ErrorIs(t, Cleanup("bad/prefix"), ErrInvalidOptions)
}

func TestNewRemovesLeftovers(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	prefix := fmt.Sprintf("fmtl%d", os.Getpid())
	t.Cleanup(func() { require.NoError(t, Cleanup(prefix)) })
	// A crashed run: a namespace with a process still inside.
	ipOut(t, "netns", "add", hostName(prefix, 0))
	orphan := exec.Command("ip", "netns", "exec", hostName(prefix, 0), "sleep", "600")
	require.NoError(t, orphan.Start())
	// Only a process already inside is a leftover New can find (one still
	// entering would outlive the namespace it is deleting).
	require.Eventually(t, func() bool {
		return strings.TrimSpace(ipOut(t, "netns", "pids", hostName(prefix, 0))) != ""
	}, time.Minute, 10*time.Millisecond, "the orphan never entered its namespace")

	c := New(t, Options{Hosts: 1, Prefix: prefix})
	waited := make(chan error, 1)
	go func() { waited <- orphan.Wait() }()
	select {
	case err := <-waited:
		require.EqualError(t, err, "signal: killed")
	case <-time.After(time.Minute):
		orphan.Process.Kill()
		<-waited
		t.Fatal("New left the leftover namespace's process running")
	}
	_, err := c.Hosts[0].Dial(t.Context(), "tcp", "10.255.255.1:80")
	require.ErrorIs(t, err, syscall.ENETUNREACH)
}

func TestNewSweepsDeadBinaries(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	// A pid that just died stands for a crashed test binary.
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	stale := fmt.Sprintf("fmt%dc0", dead.Process.Pid)
	t.Cleanup(func() { require.NoError(t, Cleanup(stale)) })
	ipOut(t, "netns", "add", switchName(stale))
	ipOut(t, "netns", "add", hostName(stale, 0))

	New(t, Options{Hosts: 1})
	left, err := namespaces(stale)
	require.NoError(t, err)
	require.Empty(t, left)
}

func TestDoNeverRunsOutsideTheNamespace(t *testing.T) {
	// No root needed: the namespace does not exist, so Do must fail before
	// fn runs, never run fn in the test's own namespace (which routes to
	// the real network).
	h := &Host{Name: "fmtmissing0-h0"}
	ran := false
	err := h.Do(func() error { ran = true; return nil })
	require.ErrorIs(t, err, syscall.ENOENT)
	require.False(t, ran)
	_, err = h.Dial(t.Context(), "tcp", "10.211.0.1:7000")
	require.ErrorIs(t, err, syscall.ENOENT)
}
