package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	mathrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/farmem/farmem/alloc"
	"github.com/farmem/farmem/internal/syncbuf"
)

// poold and memctl are the binaries built once for these tests.
var poold, memctl string

// TestMain builds the real poold and memctl binaries, or, when re-executed
// as a client process, acts as an application: FARMEM_TEST_CLIENT set, one
// that allocates and then waits to be killed; FARMEM_TEST_ROLE set, one of
// the cluster tests' clientRoles.
func TestMain(m *testing.M) {
	if sock := os.Getenv("FARMEM_TEST_CLIENT"); sock != "" {
		os.Exit(clientProcess(sock))
	}
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	dir, err := os.MkdirTemp("", "poold-bin")
	if err != nil {
		panic(err)
	}
	poold, memctl = filepath.Join(dir, "poold"), filepath.Join(dir, "memctl")
	for _, b := range []struct{ out, pkg string }{{poold, "."}, {memctl, "../memctl"}} {
		out, err := exec.Command("go", append(append([]string{"build"}, raceFlags...), "-o", b.out, b.pkg)...).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", b.pkg, err, out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// clientProcess allocates 8 MiB on the CXL tier, writes it, says "ready"
// and blocks until killed.
func clientProcess(sock string) int {
	ctx := context.Background()
	c, err := alloc.Dial(ctx, sock)
	if err != nil {
		fmt.Println("dial:", err)
		return 1
	}
	seg, err := c.Alloc(ctx, 8<<20, alloc.WithTier(alloc.TierCXL))
	if err != nil {
		fmt.Println("alloc:", err)
		return 1
	}
	b, _ := seg.Bytes()
	for i := range b {
		b[i] = byte(i)
	}
	fmt.Println("ready", seg.ID())
	select {}
}

// memctlCommand runs the memctl binary with args. A binary built with
// -race sleeps a second at exit by default (GORACE atexit_sleep_ms, time
// for goroutines still running to show a race) which, for a command that
// has done its work, only makes every call and every poll through memctl
// a second longer: the command turns it off. A race memctl runs into
// while it works is still reported, and fails its call.
func memctlCommand(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, memctl, args...)
	cmd.Env = append(os.Environ(), "GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	return cmd
}

// daemon is one run of the poold binary.
type daemon struct {
	cmd    *exec.Cmd
	socket string
	data   string
	log    *syncbuf.Buffer
}

func startDaemon(t *testing.T, data, socket string, extra ...string) *daemon {
	t.Helper()
	return startDaemonVia(t, nil, data, socket, extra...)
}

// startDaemonVia is startDaemon with poold run by the command wrap (such
// as prlimit with its options), which must exec poold in its own process.
func startDaemonVia(t *testing.T, wrap []string, data, socket string, extra ...string) *daemon {
	t.Helper()
	d := launchDaemon(t, wrap, data, socket, extra...)
	// The socket file appears at bind, before listen: wait until it accepts.
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", socket)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond, "poold did not listen on its socket: %s", d.log)
	return d
}

// launchDaemon starts poold as startDaemonVia does, without waiting for it
// to serve: for a poold that is meant to exit by itself.
func launchDaemon(t *testing.T, wrap []string, data, socket string, extra ...string) *daemon {
	t.Helper()
	d := &daemon{socket: socket, data: data, log: new(syncbuf.Buffer)}
	argv := append(append(wrap[:len(wrap):len(wrap)], poold, "--data-dir", data, "--socket", socket, "--sysfs-root", "../../cxl/testdata/plain",
		"--emulate-cxl", "64MiB", "--local-size", "16MiB", "--lease-ttl", "1s", "--shm-dir", filepath.Join(data, "shm"), "--measure-tiers=false"), extra...)
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	require.NoError(t, d.cmd.Start())
	t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			d.cmd.Process.Kill()
			d.cmd.Wait() // before d.log is read: Wait ends the copying into it
		}
		if t.Failed() {
			t.Logf("poold log:\n%s", d.log)
		}
	})
	return d
}

func (d *daemon) kill9(t *testing.T) {
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGKILL))
	d.cmd.Wait()
}

// requireAlive fails the test if the process has exited, also when it is
// a zombie not yet reaped (which a signal 0 would still reach).
func requireAlive(t *testing.T, pid int) {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	require.NoError(t, err, "poold is gone")
	// The state follows the command name in parentheses.
	i := strings.LastIndexByte(string(b), ')')
	require.Positive(t, i)
	require.NotContains(t, []string{"Z", "X"}, strings.Fields(string(b[i+1:]))[0], "poold exited")
}

// freeAddr returns a loopback address with a port nobody uses now, for
// network "tcp", "udp", or "gossip" (free for both, as memberlist binds
// both); poold binds it next (another process taking it meanwhile fails
// the test, not silently). The port lies below the kernel's ephemeral
// range, from which every outgoing connection takes its local port: a
// poold killed and started again on its ports (the restart tests) found
// one of them taken by some connection of the machine's now and then
// ("bind: address already in use").
func freeAddr(t *testing.T, network string) string {
	t.Helper()
	lo, hi := 10000, ephemeralLow()
	if hi-lo < 1000 {
		lo = 1024
	}
	for range 1000 {
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(lo+mathrand.IntN(hi-lo)))
		if portFree(network, addr) {
			return addr
		}
	}
	t.Fatalf("no free loopback port for %s in [%d, %d) after 1000 tries", network, lo, hi)
	return ""
}

// portFree reports whether addr can be bound now for network (freeAddr's).
func portFree(network, addr string) bool {
	if network != "tcp" {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			return false
		}
		c.Close()
	}
	if network != "udp" {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range
// (net.ipv4.ip_local_port_range; Linux's default 32768 where unreadable).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n <= 1024 {
		return 32768
	}
	return n
}

func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "fm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// shmDir is a directory for a poold's segment files in /dev/shm, as a
// poold keeps them by default (memory, never written back to a disk), or
// under dir where /dev/shm is missing; it is removed at the end.
func shmDir(t *testing.T, dir string) string {
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		return filepath.Join(dir, "shm")
	}
	shm, err := os.MkdirTemp("/dev/shm", "fm")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(shm) })
	return shm
}

func TestKill9KeepsSegmentsAndBytes(t *testing.T) {
	data, sock := t.TempDir(), filepath.Join(shortDir(t), "p.sock")
	d := startDaemon(t, data, sock)
	ctx := t.Context()
	c, err := alloc.Dial(ctx, sock, alloc.WithClientID("kill9-app"))
	require.NoError(t, err)
	defer c.Close()

	type written struct {
		seg  *alloc.Segment
		want []byte
	}
	var segs []written
	for i, opt := range []alloc.AllocOption{alloc.WithName("named"), alloc.WithPersist(), nil} {
		opts := []alloc.AllocOption{alloc.WithTier(alloc.TierCXL)}
		if opt != nil {
			opts = append(opts, opt)
		}
		seg, err := c.Alloc(ctx, int64(1<<20+i*4096), opts...)
		require.NoError(t, err)
		want := make([]byte, seg.Size())
		rand.Read(want)
		_, err = seg.WriteAt(want, 0)
		require.NoError(t, err)
		segs = append(segs, written{seg, want})
	}
	before := listJSON(t, sock)

	d.kill9(t)
	startDaemon(t, data, sock)
	require.Equal(t, before, listJSON(t, sock), "the same segments after kill -9 and restart")

	// Every byte survived: through the mapping the client kept, and through a fresh mapping.
	for _, w := range segs {
		got := make([]byte, len(w.want))
		_, err := w.seg.ReadAt(got, 0)
		require.NoError(t, err)
		require.Equal(t, w.want, got)
		var fresh *alloc.Segment
		var lastErr error
		require.Eventually(t, func() bool {
			fresh, lastErr = c.Open(ctx, w.seg.ID())
			return lastErr == nil
		}, 5*time.Second, 20*time.Millisecond)
		require.NoError(t, lastErr)
		b, ok := fresh.Bytes()
		require.True(t, ok)
		require.Equal(t, w.want, b)
	}
	// The client reconnected by itself: it can allocate again.
	_, err = c.Alloc(ctx, 4096)
	require.NoError(t, err)
}

func listJSON(t *testing.T, sock string) string {
	out, err := memctlCommand(t.Context(), "--socket", sock, "segments").CombinedOutput()
	require.NoError(t, err, "%s", out)
	return string(out)
}

func TestKilledClientCapacityReturns(t *testing.T) {
	data, sock := t.TempDir(), filepath.Join(shortDir(t), "p.sock")
	startDaemon(t, data, sock)
	ctx := t.Context()
	watcher, err := alloc.Dial(ctx, sock)
	require.NoError(t, err)
	defer watcher.Close()

	client := exec.Command(os.Args[0], "-test.run=^$")
	client.Env = append(os.Environ(), "FARMEM_TEST_CLIENT="+sock)
	stdout, err := client.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, client.Start())
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "ready"), line)
	require.Equal(t, int64(8<<20), cxlUsed(t, watcher))

	require.NoError(t, client.Process.Signal(syscall.SIGKILL))
	client.Wait()
	// Lease TTL is 1s; allow generously for a loaded machine.
	require.Eventually(t, func() bool { return cxlUsed(t, watcher) == 0 }, 10*time.Second, 50*time.Millisecond)
}

func cxlUsed(t *testing.T, c *alloc.Client) int64 {
	tiers, err := c.Tiers(t.Context())
	require.NoError(t, err)
	for _, ti := range tiers {
		if ti.Tier == alloc.TierCXL {
			return ti.Capacity - ti.Free
		}
	}
	t.Fatal("no cxl tier")
	return 0
}

func TestSIGTERMStopsCleanly(t *testing.T) {
	data, sock := t.TempDir(), filepath.Join(shortDir(t), "p.sock")
	d := startDaemon(t, data, sock)
	c, err := alloc.Dial(t.Context(), sock)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, d.cmd.Wait(), "exit status 0 on SIGTERM: %s", d.log)
	_, err = os.Stat(sock)
	require.True(t, os.IsNotExist(err), "socket removed")
	require.Contains(t, d.log.String(), "shutting down")
}

func TestStartupErrors(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, []byte("x"), 0o600))
	shortKey := filepath.Join(t.TempDir(), "short.key")
	require.NoError(t, os.WriteFile(shortKey, []byte("AAAAAAAAAAAAAAAAAAAAAAAAAAA=\n"), 0o600))
	badCfg := filepath.Join(t.TempDir(), "bad.yaml")
	require.NoError(t, os.WriteFile(badCfg, []byte("emulate-cxl: 1GiB\nsockett: /x\n"), 0o600))
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"socket dir is a file", []string{"--socket", filepath.Join(file, "p.sock"), "--data-dir", t.TempDir()}, "--socket"},
		{"data dir is a file", []string{"--socket", filepath.Join(shortDir(t), "p.sock"), "--data-dir", filepath.Join(file, "d")}, "data"},
		{"unknown config key", []string{"--config", badCfg}, "line 2: unknown key sockett; did you mean socket?"},
		{"missing config", []string{"--config", "/nonexistent/farmem.yaml"}, "farmem.yaml"},
		{"bad size flag", []string{"--emulate-cxl", "big"}, "not a byte size"},
		{"emulated device smaller than a page", []string{"--emulate-cxl", "10", "--shm-dir", t.TempDir(), "--socket", filepath.Join(shortDir(t), "p.sock"), "--data-dir", t.TempDir()}, "emulate-cxl 10 is 10 B, less than one page of its memory (4.0 KiB); write a size like 1GiB"},
		{"bad ttl", []string{"--lease-ttl", "1ms", "--socket", filepath.Join(shortDir(t), "p.sock"), "--data-dir", t.TempDir()}, "lease-ttl"},
		{"gossip key of the wrong size", append(tlsGossipArgs(t, "n"), "--gossip-key-file", shortKey), "gossip key of 20 bytes; use 16, 24 or 32 bytes"},
		{"tls gossip without a key", tlsGossipArgs(t, "n"), "needs a gossip key: set gossip-key-file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, poold, append(tc.args, "--sysfs-root", "../../cxl/testdata/plain")...).CombinedOutput()
			require.Error(t, err)
			require.NotEqual(t, 0, err.(*exec.ExitError).ExitCode())
			s := strings.TrimSpace(string(out))
			require.Contains(t, s, tc.want)
			require.NotContains(t, s, "goroutine", "no stack trace")
			require.True(t, strings.HasPrefix(lastLine(s), "poold:"), s)
		})
	}
}

func lastLine(s string) string {
	lines := strings.Split(s, "\n")
	return lines[len(lines)-1]
}

func TestConfigFileAndFlagOverride(t *testing.T) {
	data, sock := t.TempDir(), filepath.Join(shortDir(t), "p.sock")
	cfgFile := filepath.Join(t.TempDir(), "poold.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte("node: from-file\nlocal-size: 8MiB\n"), 0o600))
	startDaemon(t, data, sock, "--config", cfgFile, "--local-size", "4MiB")
	c, err := alloc.Dial(t.Context(), sock)
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "from-file", c.Node())
	tiers, err := c.Tiers(t.Context())
	require.NoError(t, err)
	for _, ti := range tiers {
		if ti.Tier == alloc.TierLocal {
			require.Equal(t, int64(4<<20), ti.Capacity, "the flag overrides the file")
		}
	}
	_ = strconv.Itoa
}

// A second poold on a running one's data directory is told so first, with
// the holder's pid, whatever else it would share (here the shared-memory
// directory of its devices); and the directory is free again once the first
// one stops.
func TestSecondDaemonSameDataDir(t *testing.T) {
	data := t.TempDir()
	first := startDaemon(t, data, filepath.Join(shortDir(t), "p.sock"))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, poold, "--data-dir", data, "--socket", filepath.Join(shortDir(t), "q.sock"),
		"--sysfs-root", "../../cxl/testdata/plain", "--emulate-cxl", "64MiB", "--local-size", "16MiB",
		"--shm-dir", filepath.Join(data, "shm"), "--measure-tiers=false").CombinedOutput()
	require.Error(t, err, "a second poold on the same --data-dir must not start: %s", out)
	msg := lastLine(strings.TrimSpace(string(out)))
	require.Contains(t, msg, "data directory "+data+" is in use by another poold (pid "+strconv.Itoa(first.cmd.Process.Pid)+")")
	require.NotContains(t, msg, "--emulate-dir")
	require.NotContains(t, msg, "--export-size")

	require.NoError(t, first.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, first.cmd.Wait())
	startDaemon(t, data, filepath.Join(shortDir(t), "q.sock"))
}
