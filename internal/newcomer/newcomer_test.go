package newcomer

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestFollowTheReadme does what README.md tells a newcomer, in a scratch
// copy of the checkout (see the package doc for what it substitutes).
func TestFollowTheReadme(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the newcomer test builds poold and memctl and starts three pools")
	}
	root := checkout(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	readme := string(b)

	// The scratch copy's path is the same on every run from this checkout:
	// the build cache keys compiled packages by their directory, so the
	// README's build then takes seconds, not a rebuild of every package.
	// Short, as unix socket paths are limited to 107 bytes.
	src := filepath.Join(os.TempDir(), fmt.Sprintf("farmem-newcomer-%x", sha256.Sum256([]byte(root)))[:len("farmem-newcomer-")+12])
	require.NoError(t, os.RemoveAll(src))
	t.Cleanup(func() { os.RemoveAll(src) })
	copyCheckout(t, root, src)
	require.NoError(t, os.Mkdir(filepath.Join(src, "t"), 0o700))
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	// FARMEM_SOCKET names a socket nobody serves, so that a poold running
	// on this host is never what the quick start finds.
	env := append(os.Environ(), "FARMEM_SOCKET=t/none.sock")

	t.Run("quick start", func(t *testing.T) {
		var line string
		for _, c := range commands(readmeBlocks(t, readme, "Quick start")[0]) {
			if strings.HasPrefix(c, "go run ./examples/quickstart") {
				line = c
			}
		}
		require.NotEmpty(t, line, "README.md's Quick start no longer runs go run ./examples/quickstart")
		out := run(t, ctx, src, env, line)
		require.Contains(t, out, "started one")
		require.Regexp(t, `cxl\s+emulated\s+EMULATED\s+\S+ MiB\s+yes`, out)
		require.Regexp(t, `local\s+dram\s+real\s+\S+ MiB\s+yes`, out)
		require.Regexp(t, `rdma\s+loopback\s+EMULATED\s+\S+ MiB\s+yes`, out)
	})
	if t.Failed() {
		return
	}

	s := newSubst(t)
	var (
		sockets   []string // each poold's --socket, in README order
		nodes     []string // each poold's --node
		seen      = map[string]string{}
		clusterUp bool
	)
	for _, c := range commands(readmeBlocks(t, readme, "A pool of several hosts")[0]) {
		c = s.apply(c)
		switch {
		case strings.HasPrefix(c, "go build"):
			run(t, ctx, src, env, c)
			for _, bin := range []string{"poold", "memctl"} {
				_, err := os.Stat(filepath.Join(src, bin))
				require.NoError(t, err, "README.md's build line %q left no ./%s, which the next lines run", c, bin)
			}
			seen["build"] = c
		case strings.HasPrefix(c, "./poold "):
			args := strings.Fields(strings.TrimSpace(strings.TrimSuffix(c, "&")))
			require.True(t, strings.HasSuffix(c, "&"), "a poold of the recipe runs in the background: %s", c)
			node, sock := flagValue(t, args, "--node"), flagValue(t, args, "--socket")
			args = append(args, "--shm-dir", "t/shm-"+node)
			startDaemon(t, src, env, args)
			nodes, sockets = append(nodes, node), append(sockets, sock)
		case strings.HasPrefix(c, "./memctl certs "):
			run(t, ctx, src, env, c)
			seen["certs"] = c
		case strings.HasPrefix(c, "./memctl --socket "):
			require.GreaterOrEqual(t, len(sockets), 2, "the recipe starts two poolds before its memctl commands")
			if !clusterUp {
				waitCluster(t, ctx, src, env, sockets[0], nodes)
				clusterUp = true
			}
			args := strings.Fields(c)
			sub := args[3]
			out := run(t, ctx, src, env, c)
			switch sub {
			case "nodes":
				for _, n := range nodes {
					require.Regexp(t, `(?m)^`+regexp.QuoteMeta(n)+`\s.*alive`, out, "memctl nodes shows %s alive", n)
				}
			case "alloc":
				require.Equal(t, "rdma", flagValue(t, args, "--tier"), "the recipe's alloc is on the rdma tier: %s", c)
				name := flagValue(t, args, "--name")
				home := segmentNode(t, ctx, src, env, sockets[0], name)
				require.NotEqual(t, nodes[0], home, "an rdma segment asked of %s lands on its peer", nodes[0])
				require.Contains(t, nodes, home)
				seen["alloc-name"] = name
			case "segments":
				require.Contains(t, args, "--all")
				require.Contains(t, out, seen["alloc-name"], "segments --all lists the rdma segment")
			case "drain":
				require.Contains(t, out, "is draining")
			}
			seen[sub] = c
		default:
			t.Fatalf("README.md's 'A pool of several hosts' block has a command this test does not know how to follow: %s", c)
		}
	}
	require.Len(t, nodes, 2, "the recipe starts two poolds")
	for _, want := range []string{"build", "certs", "nodes", "alloc", "segments", "drain"} {
		require.Contains(t, seen, want, "README.md's 'A pool of several hosts' block no longer has its %s command; the newcomer test follows it", want)
	}

	// Every memctl subcommand that reaches poold, with the relative
	// --socket of the recipe; status shows it absolute.
	sock := sockets[0]
	abs := filepath.Join(src, sock)
	for _, tc := range []struct{ args, want string }{
		{"status", "socket " + abs + ","},
		{"tiers", "rdma"},
		{"alloc --size 1MiB --tier cxl --name rel", "allocated segment"},
		{"segments", "rel"},
		{"free rel", "freed"},
		{"nodes", nodes[1]},
		{"drain " + nodes[1] + " --undo", "accepts placements again"},
		{"top --once --interval 100ms", nodes[0]},
		{"bench --duration 5ms --rounds 1 --ops read --sizes 64 --depths 1 --tiers cxl", "farmem-cxl"},
		{"doctor", "rdma transport"},
	} {
		out := run(t, ctx, src, env, "./memctl --socket "+sock+" "+tc.args)
		require.Contains(t, out, tc.want, "memctl --socket %s %s", sock, tc.args)
	}
}

// subst is the test's one change to the README's commands (see the package
// doc): free ports for 127.0.0.1:PORT, t/ for /tmp/.
type subst struct {
	t     *testing.T
	ports map[string]string
}

func newSubst(t *testing.T) *subst { return &subst{t: t, ports: map[string]string{}} }

var loopbackPort = regexp.MustCompile(`127\.0\.0\.1:(\d+)`)

func (s *subst) apply(c string) string {
	c = strings.ReplaceAll(c, "/tmp/", "t/")
	return loopbackPort.ReplaceAllStringFunc(c, func(m string) string {
		p := strings.TrimPrefix(m, "127.0.0.1:")
		if _, ok := s.ports[p]; !ok {
			s.ports[p] = s.freePort()
		}
		return "127.0.0.1:" + s.ports[p]
	})
}

// freePort is a loopback port free for TCP and UDP (gossip uses both), and
// not handed out before.
func (s *subst) freePort() string {
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(s.t, err)
		port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
		u, err := net.ListenPacket("udp", "127.0.0.1:"+port)
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		taken := false
		for _, p := range s.ports {
			taken = taken || p == port
		}
		if !taken {
			return port
		}
	}
	s.t.Fatal("no free loopback port for TCP and UDP in 100 tries")
	return ""
}

// flagValue is the value of --name in args (as "--name V" or "--name=V").
func flagValue(t *testing.T, args []string, name string) string {
	t.Helper()
	for i, a := range args {
		if a == name && i+1 < len(args) {
			return args[i+1]
		}
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
	}
	t.Fatalf("README command has no %s: %s", name, strings.Join(args, " "))
	return ""
}

// startDaemon runs a README poold line (its argv, without the shell) in
// dir until the test ends, and waits until its socket accepts.
func startDaemon(t *testing.T, dir string, env, args []string) {
	t.Helper()
	for _, a := range args {
		require.False(t, strings.ContainsAny(a, "|;&<>$'\"`"), "a README poold line this test runs without a shell has shell syntax: %s", strings.Join(args, " "))
	}
	var log bytes.Buffer
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, &log, &log
	require.NoError(t, cmd.Start())
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("%s:\n%s", strings.Join(args, " "), &log)
		}
	})
	sock := filepath.Join(dir, flagValue(t, args, "--socket"))
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		c, err := net.Dial("unix", sock)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 30*time.Second, 50*time.Millisecond, "%s did not listen on its socket", strings.Join(args, " "))
	select {
	case <-exited:
		t.Fatalf("%s exited: %s", strings.Join(args, " "), &log)
	default:
	}
}

// waitCluster waits until memctl nodes at sock shows every node alive and
// every node but the first lending rdma memory.
func waitCluster(t *testing.T, ctx context.Context, dir string, env []string, sock string, nodes []string) {
	t.Helper()
	var last string
	ok := func() bool {
		cmd := exec.CommandContext(ctx, "./memctl", "--socket", sock, "nodes", "-o", "json")
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.Output()
		last = string(out)
		if err != nil {
			return false
		}
		var list []struct {
			Name  string `json:"name"`
			State string `json:"state"`
			Tiers []struct {
				Tier string `json:"tier"`
				Free int64  `json:"free"`
			} `json:"tiers"`
		}
		if json.Unmarshal(out, &list) != nil {
			return false
		}
		up := map[string]bool{}
		for _, n := range list {
			for _, ti := range n.Tiers {
				if n.State == "alive" && (n.Name == nodes[0] || ti.Tier == "rdma" && ti.Free > 0) {
					up[n.Name] = true
				}
			}
		}
		for _, n := range nodes {
			if !up[n] {
				return false
			}
		}
		return true
	}
	require.Eventually(t, ok, 30*time.Second, 200*time.Millisecond, "the README's poolds did not form a cluster; memctl nodes -o json:\n%s", fmt.Sprint(last))
}

// segmentNode is the node of the segment called name, as memctl segments
// at sock reports it.
func segmentNode(t *testing.T, ctx context.Context, dir string, env []string, sock, name string) string {
	t.Helper()
	var segs []struct {
		Name string `json:"name"`
		Node string `json:"node"`
	}
	require.NoError(t, json.Unmarshal([]byte(run(t, ctx, dir, env, "./memctl --socket "+sock+" segments -o json")), &segs))
	for _, s := range segs {
		if s.Name == name {
			return s.Node
		}
	}
	t.Fatalf("memctl segments does not list %s", name)
	return ""
}
