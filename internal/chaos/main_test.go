package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/session"
)

// poold is the daemon binary built once for these tests.
var poold string

// roleEnv, when set, makes the test binary a client process of that role
// (see roles) instead of running tests.
const roleEnv = "FARMEM_CHAOS_ROLE"

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runRole(role))
	}
	if runtime.GOOS != "linux" {
		fmt.Println("skipping: the chaos suites need Linux (/dev/shm, SCM_RIGHTS)")
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("", "chaos-bin")
	if err != nil {
		panic(err)
	}
	poold = filepath.Join(dir, "poold")
	if out, err := exec.Command("go", "build", "-race", "-o", poold, "../../cmd/poold").CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build poold: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
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

// node is a poold's directories and arguments; each start is a new run of
// the binary on them.
type node struct {
	dir, sock, shm string
	args           []string

	mu  sync.Mutex
	cmd *exec.Cmd
	out *lockedBuffer // every run's output
}

// newNode prepares a poold with 64 MiB of emulated CXL in a fresh short
// directory (unix socket paths are short), removed when the test ends.
func newNode(t *testing.T, extra ...string) *node {
	dir, err := os.MkdirTemp("", "chaos")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(dir) })
	n := &node{dir: dir, sock: filepath.Join(dir, "p.sock"), shm: filepath.Join(dir, "shm"), out: &lockedBuffer{}}
	n.args = append([]string{"--data-dir", filepath.Join(dir, "data"), "--socket", n.sock, "--shm-dir", n.shm,
		"--sysfs-root", filepath.Join(dir, "no-sysfs"), "--emulate-cxl", "64MiB", "--local-size", "16MiB",
		"--export-size", "16MiB", "--measure-tiers=false"}, extra...)
	t.Cleanup(func() {
		n.stop()
		if out := n.out.String(); t.Failed() || strings.Contains(out, "DATA RACE") {
			t.Errorf("poold output:\n%s", out)
		}
	})
	return n
}

// start runs poold and waits until its socket accepts.
func (n *node) start(t *testing.T) {
	t.Helper()
	cmd := exec.Command(poold, n.args...)
	cmd.Stdout, cmd.Stderr = n.out, n.out
	require.NoError(t, cmd.Start())
	n.mu.Lock()
	n.cmd = cmd
	n.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("unix", n.sock)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("poold did not listen on %s: %v", n.sock, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill9 kills the running poold as a crash would and waits for it.
func (n *node) kill9(t *testing.T) {
	t.Helper()
	n.mu.Lock()
	cmd := n.cmd
	n.cmd = nil
	n.mu.Unlock()
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	cmd.Wait()
}

// stop ends the running poold, if any, with SIGTERM.
func (n *node) stop() {
	n.mu.Lock()
	cmd := n.cmd
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
	}
}

// admin is a session-less control-plane client of the node (what memctl uses).
func (n *node) admin(t *testing.T) poolv1.PoolClient {
	conn, err := session.Channel("unix", n.sock)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return poolv1.NewPoolClient(conn)
}

// state is what the daemon reports: its segments and its CXL tier.
type state struct {
	segs           []*poolv1.Segment
	capacity, free int64
}

func (n *node) state(ctx context.Context, api poolv1.PoolClient) (state, error) {
	var st state
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	list, err := api.List(ctx, &poolv1.ListRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return st, err
	}
	st.segs = list.Segments
	tiers, err := api.Tiers(ctx, &poolv1.TiersRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return st, err
	}
	for _, ti := range tiers.Tiers {
		if ti.Tier == poolv1.Tier_TIER_CXL {
			st.capacity, st.free = ti.Capacity, ti.Free
		}
	}
	return st, nil
}

// segFile is the emulated CXL device's file of segment id.
func (n *node) segFile(id uint64) string {
	return filepath.Join(n.shm, "emulated-cxl", fmt.Sprintf("seg-%016x", id))
}

// segFiles lists the ids that have a file on the emulated CXL device.
func (n *node) segFiles(t *testing.T) map[uint64]bool {
	ents, err := os.ReadDir(filepath.Join(n.shm, "emulated-cxl"))
	require.NoError(t, err)
	ids := map[uint64]bool{}
	for _, e := range ents {
		var id uint64
		if _, err := fmt.Sscanf(e.Name(), "seg-%x", &id); err == nil {
			ids[id] = true
		}
	}
	return ids
}

// lockedBuffer is a bytes.Buffer safe for concurrent writers and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
