//go:build linux

package testcluster

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// netnsDir is where `ip netns add` mounts named namespaces.
	netnsDir = "/run/netns"
	// bridge is the bridge's name inside the switch namespace.
	bridge = "br0"
	// hostLink is the host end's name inside each host namespace.
	hostLink = "eth0"
	// ipTimeout bounds one `ip` command.
	ipTimeout = 30 * time.Second
	// readyTimeout bounds waiting for a link to carry traffic.
	readyTimeout = 10 * time.Second
)

func newCluster(t testing.TB, cfg config) *Cluster {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2: 'ip' is not in PATH; apt-get install iproute2")
	}
	sweepStale(t)
	if err := Cleanup(cfg.prefix); err != nil {
		t.Fatalf("removing what an earlier run with prefix %q left: %v", cfg.prefix, err)
	}

	c := &Cluster{prefix: cfg.prefix, subnet: cfg.subnet}
	for i := range cfg.hosts {
		c.Hosts = append(c.Hosts, &Host{
			Name:    hostName(cfg.prefix, i),
			Addr:    hostAddr(cfg.subnet, i),
			Index:   i,
			cluster: c,
			port:    "p" + strconv.Itoa(i),
		})
	}
	// Registered before anything exists, so a set-up that fails half way
	// is removed too.
	t.Cleanup(func() { c.teardown(t) })

	sw := switchName(cfg.prefix)
	if _, err := ip("netns", "add", sw); err != nil {
		t.Skipf("needs 'ip netns' (network namespaces): %v", err)
	}
	steps := [][]string{
		{"-n", sw, "link", "add", bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", sw, "link", "set", bridge, "up"},
	}
	for _, h := range c.Hosts {
		cidr := fmt.Sprintf("%s/%d", h.Addr, cfg.subnet.Bits())
		steps = append(steps,
			[]string{"netns", "add", h.Name},
			// Both ends are born in their namespaces: nothing ever appears
			// in the root namespace, where interface names could clash.
			[]string{"-n", sw, "link", "add", h.port, "type", "veth", "peer", "name", hostLink, "netns", h.Name},
			[]string{"-n", sw, "link", "set", h.port, "master", bridge, "up"},
			[]string{"-n", h.Name, "link", "set", "lo", "up"},
			[]string{"-n", h.Name, "addr", "add", cidr, "dev", hostLink},
			[]string{"-n", h.Name, "link", "set", hostLink, "up"},
		)
	}
	for _, s := range steps {
		if _, err := ip(s...); err != nil {
			t.Fatalf("setting up cluster %s: %v", cfg.prefix, err)
		}
	}
	for _, h := range c.Hosts {
		if err := h.waitUp(); err != nil {
			t.Fatalf("setting up cluster %s: %v", cfg.prefix, err)
		}
	}
	return c
}

// teardown kills the processes the test started, then everything else in
// the namespaces, deletes the namespaces (which deletes the veths and the
// bridge), and checks that none is left.
func (c *Cluster) teardown(t testing.TB) {
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].stop(t)
	}
	if err := Cleanup(c.prefix); err != nil {
		t.Errorf("cleanup of cluster %s: %v", c.prefix, err)
	}
	left, err := namespaces(c.prefix)
	if err != nil {
		t.Errorf("cleanup of cluster %s: %v", c.prefix, err)
	} else if len(left) > 0 {
		t.Errorf("cleanup of cluster %s left namespaces %v; remove them with 'ip netns delete NAME'", c.prefix, left)
	}
}

// Cleanup removes every namespace of the cluster with that prefix, after
// killing (SIGKILL) every process still inside one; the veth pairs and the
// bridge live in those namespaces and go with them. Nothing is ever created
// in the root namespace, so nothing there is touched. It is idempotent and
// safe to call when nothing exists; New calls it for its own prefix first.
func Cleanup(prefix string) error {
	if err := checkPrefix(prefix); err != nil {
		return err
	}
	names, err := namespaces(prefix)
	if err != nil {
		return err
	}
	var errs []error
	// Kill everything first: a process in one namespace may hold a socket
	// or a child in another.
	for _, ns := range names {
		if err := killAll(ns); err != nil {
			errs = append(errs, err)
		}
	}
	// Hosts first, the switch last, so no veth is ever left dangling.
	slices.SortFunc(names, func(a, b string) int {
		return boolInt(a == switchName(prefix)) - boolInt(b == switchName(prefix))
	})
	for _, ns := range names {
		if _, err := ip("netns", "delete", ns); err != nil {
			if _, serr := os.Stat(filepath.Join(netnsDir, ns)); errors.Is(serr, fs.ErrNotExist) {
				continue // removed meanwhile by another Cleanup
			}
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// namespaces lists the named namespaces owned by prefix.
func namespaces(prefix string) ([]string, error) {
	all, err := allNamespaces()
	if err != nil {
		return nil, err
	}
	var mine []string
	for _, n := range all {
		if owns(prefix, n) {
			mine = append(mine, n)
		}
	}
	return mine, nil
}

// allNamespaces lists every named namespace, as `ip netns list` does.
func allNamespaces() ([]string, error) {
	ents, err := os.ReadDir(netnsDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("testcluster: listing namespaces in %s: %w", netnsDir, err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

// killAll SIGKILLs every process in namespace ns and waits, bounded, until
// none is left.
func killAll(ns string) error {
	deadline := time.Now().Add(readyTimeout)
	for {
		out, err := ip("netns", "pids", ns)
		if err != nil {
			if _, serr := os.Stat(filepath.Join(netnsDir, ns)); errors.Is(serr, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		var pids []int
		for _, f := range strings.Fields(out) {
			// Never ourselves: the test binary shows up here if its main
			// thread was discarded inside the namespace by Do.
			if pid, err := strconv.Atoi(f); err == nil && pid > 1 && pid != os.Getpid() {
				pids = append(pids, pid)
			}
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testcluster: processes %v in namespace %s survive SIGKILL; see 'ip netns pids %s'", pids, ns, ns)
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL) // ESRCH: gone already
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sweepStale removes namespaces with a default prefix whose test binary
// (the pid in the name) is dead: a binary killed by -timeout or a crash
// runs no cleanup. A live binary's namespaces, another engineer's
// included, are never touched.
func sweepStale(t testing.TB) {
	all, err := allNamespaces()
	if err != nil {
		t.Logf("testcluster: not sweeping stale namespaces: %v", err)
		return
	}
	seen := map[string]bool{}
	for _, n := range all {
		pid, prefix, ok := staleOwner(n)
		if !ok || seen[prefix] || pid == os.Getpid() || alive(pid) {
			continue
		}
		seen[prefix] = true
		if err := Cleanup(prefix); err != nil {
			t.Logf("testcluster: removing namespaces %s-* of dead pid %d: %v", prefix, pid, err)
		} else {
			t.Logf("testcluster: removed namespaces %s-* left by dead pid %d", prefix, pid)
		}
	}
}

func alive(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || errors.Is(err, unix.EPERM)
}

// ip runs one iproute2 command and returns its output.
func ip(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), ipTimeout)
	defer cancel()
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%w: ip %s: %v: %s", ErrIP, strings.Join(args, " "), err, bytes.TrimSpace(out.Bytes()))
	}
	return out.String(), nil
}

// setLink sets both ends of the host's veth pair up or down; up waits for
// the link to carry traffic.
func (h *Host) setLink(state string) error {
	sw := switchName(h.cluster.prefix)
	if _, err := ip("-n", h.Name, "link", "set", hostLink, state); err != nil {
		return err
	}
	if _, err := ip("-n", sw, "link", "set", h.port, state); err != nil {
		return err
	}
	if state == "up" {
		return h.waitUp()
	}
	return nil
}

// linkState is the part of `ip -j -d link show` that waitUp reads.
type linkState struct {
	Operstate string `json:"operstate"`
	Linkinfo  struct {
		SlaveData struct {
			State string `json:"state"`
		} `json:"info_slave_data"`
	} `json:"linkinfo"`
}

// waitUp waits until the host's eth0 and its bridge port are up, the port
// forwarding, and the host's route to the subnet back.
func (h *Host) waitUp() error {
	sw := switchName(h.cluster.prefix)
	deadline := time.Now().Add(readyTimeout)
	var last string
	for {
		ok, state, err := h.linkReady(sw)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
		last = state
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: link of host %s not up after %v: %s", ErrNotReady, h.Name, readyTimeout, last)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (h *Host) linkReady(sw string) (bool, string, error) {
	var host, port []linkState
	out, err := ip("-j", "-n", h.Name, "link", "show", "dev", hostLink)
	if err != nil {
		return false, "", err
	}
	if err := json.Unmarshal([]byte(out), &host); err != nil || len(host) != 1 {
		return false, "", fmt.Errorf("%w: unexpected output of ip -j link show in %s: %q", ErrIP, h.Name, out)
	}
	out, err = ip("-j", "-d", "-n", sw, "link", "show", "dev", h.port)
	if err != nil {
		return false, "", err
	}
	if err := json.Unmarshal([]byte(out), &port); err != nil || len(port) != 1 {
		return false, "", fmt.Errorf("%w: unexpected output of ip -j -d link show in %s: %q", ErrIP, sw, out)
	}
	routes, err := ip("-n", h.Name, "route", "show", "dev", hostLink)
	if err != nil {
		return false, "", err
	}
	subnet := h.cluster.subnet.String()
	state := fmt.Sprintf("%s is %s, bridge port %s is %s/%s, routes %q", hostLink, host[0].Operstate, h.port,
		port[0].Operstate, port[0].Linkinfo.SlaveData.State, strings.TrimSpace(routes))
	ok := host[0].Operstate == "UP" && port[0].Operstate == "UP" &&
		port[0].Linkinfo.SlaveData.State == "forwarding" && strings.HasPrefix(routes, subnet+" ")
	return ok, state, nil
}

// do runs fn on an OS thread locked to this call and moved into the
// namespace, then moves the thread back to where it was. Only if moving
// back fails does the thread stay locked, so it dies with the goroutine
// instead of serving others from the wrong namespace.
func (h *Host) do(fn func() error) error {
	type result struct {
		err      error
		panicked bool
		value    any
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var r result
		defer func() { ch <- r }()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			r.err = fmt.Errorf("testcluster: opening this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		defer func() {
			if v := recover(); v != nil {
				r.panicked, r.value = true, v
			}
			if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
				r.err = errors.Join(r.err, fmt.Errorf("testcluster: moving a thread back from namespace %s (the thread is discarded): %w", h.Name, err))
				return // still locked: the runtime ends the thread with the goroutine
			}
			runtime.UnlockOSThread()
		}()
		if err := enterNamespace(filepath.Join(netnsDir, h.Name)); err != nil {
			r.err = err
			return
		}
		r.err = fn()
	}()
	r := <-ch
	if r.panicked {
		panic(r.value)
	}
	return r.err
}

// enterNamespace moves the calling thread into the network namespace
// mounted at path, and checks that it arrived: fn must never run, and so
// never send, from the root namespace, which has a route to the world.
func enterNamespace(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("testcluster: opening network namespace %s: %w (was the cluster cleaned up?)", path, err)
	}
	defer unix.Close(fd)
	if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("testcluster: entering network namespace %s: %w", path, err)
	}
	var want, got unix.Stat_t
	if err := unix.Fstat(fd, &want); err != nil {
		return fmt.Errorf("testcluster: checking network namespace %s: %w", path, err)
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &got); err != nil {
		return fmt.Errorf("testcluster: checking this thread's network namespace: %w", err)
	}
	if want.Dev != got.Dev || want.Ino != got.Ino {
		return fmt.Errorf("testcluster: thread is in network namespace inode %d after setns to %s (inode %d); refusing to run", got.Ino, path, want.Ino)
	}
	return nil
}

func (h *Host) startCmd(cmd *exec.Cmd) (*Process, error) {
	if cmd.Process != nil || cmd.Stdout != nil || cmd.Stderr != nil {
		return nil, fmt.Errorf("%w: %v", ErrCommand, cmd.Args)
	}
	p := &Process{Host: h, cmd: cmd, out: newOutputBuffer(), done: make(chan struct{})}
	cmd.Stdout = p.out
	cmd.Stderr = p.out
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	// A group of its own, so Kill9 reaches the children too. Pdeathsig
	// kills the process if the test binary dies without cleaning up; it
	// fires when the *thread* that forked exits, so the fork happens on a
	// thread locked until the process has been reaped.
	cmd.SysProcAttr.Setpgid = true
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if cmd.WaitDelay == 0 {
		cmd.WaitDelay = waitDelay
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.PID = cmd.Process.Pid
		started <- nil
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("testcluster: starting %v in %s: %w", cmd.Args, h.Name, err)
	}
	return p, nil
}

func (p *Process) kill9() error {
	if p.exited() {
		return nil
	}
	// While any member lives the group id cannot be reused, so this never
	// reaches a stranger; ESRCH means the group is gone already.
	if err := unix.Kill(-p.PID, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
		return fmt.Errorf("testcluster: SIGKILL to process group of %s: %w", p, err)
	}
	return nil
}
