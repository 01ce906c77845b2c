package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/alloc"
)

// Client processes: the test binary re-executed with roleEnv set. They
// print lines the tests read ("ready ...", "error: ...").
const (
	sockEnv = "FARMEM_CHAOS_SOCK" // the daemon's socket
	idEnv   = "FARMEM_CHAOS_ID"   // alloc.WithClientID
	segEnv  = "FARMEM_CHAOS_SEG"  // a segment id, for "reattach"
)

var roles = map[string]func(ctx context.Context, c *alloc.Client) error{
	"create":   roleCreate,
	"reattach": roleReattach,
	"soak":     roleSoak,
}

func runRole(role string) int {
	fn, ok := roles[role]
	if !ok {
		fmt.Printf("error: unknown role %q\n", role)
		return 2
	}
	ctx := context.Background()
	var opts []alloc.DialOption
	if id := os.Getenv(idEnv); id != "" {
		opts = append(opts, alloc.WithClientID(id))
	}
	c, err := alloc.Dial(ctx, os.Getenv(sockEnv), opts...)
	if err == nil {
		err = fn(ctx, c)
		c.Close()
	}
	if err != nil {
		fmt.Printf("error: %s: %v\n", role, err)
		return 1
	}
	return 0
}

// appSize is the segment the "create" role allocates.
const appSize = 1 << 20

// roleCreate allocates an unnamed CXL segment, fills it, prints
// "ready <id>" and waits to be killed.
func roleCreate(ctx context.Context, c *alloc.Client) error {
	seg, err := c.Alloc(ctx, appSize, alloc.WithTier(alloc.TierCXL))
	if err != nil {
		return err
	}
	b, _ := seg.Bytes()
	for i := range b {
		b[i] = fill(seg.ID(), i)
	}
	fmt.Println("ready", seg.ID())
	select {}
}

// roleReattach opens the segment of segEnv, checks its bytes and prints
// "intact <id>", then frees it.
func roleReattach(ctx context.Context, c *alloc.Client) error {
	id, err := strconv.ParseUint(os.Getenv(segEnv), 10, 64)
	if err != nil {
		return err
	}
	seg, err := c.Open(ctx, id)
	if err != nil {
		return err
	}
	b, _ := seg.Bytes()
	for i := range b {
		if b[i] != fill(id, i) {
			return fmt.Errorf("segment %d holds %#x at %d, written %#x", id, b[i], i, fill(id, i))
		}
	}
	fmt.Println("intact", id)
	return seg.Free(ctx)
}

// proc is a running client process.
type proc struct {
	cmd   *exec.Cmd
	lines chan string
	out   *lockedBuffer
}

// startRole runs the test binary as a client of role.
func startRole(t *testing.T, role string, env ...string) *proc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{roleEnv + "=" + role}, env...)...)
	out := &lockedBuffer{}
	cmd.Stderr = out
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &proc{cmd: cmd, lines: make(chan string, 1024), out: out}
	go func() {
		defer close(p.lines)
		sc := bufio.NewScanner(io.TeeReader(stdout, out))
		for sc.Scan() {
			select {
			case p.lines <- sc.Text():
			default: // nobody reads these lines
			}
		}
	}()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		p.cmd.Wait()
		if s := out.String(); strings.Contains(s, "DATA RACE") {
			t.Errorf("client %s reported a race:\n%s", role, s)
		}
	})
	return p
}

// line waits for the process's next line with prefix; an "error: " line,
// an exit or a minute without one fails the test.
func (p *proc) line(t *testing.T, prefix string) string {
	t.Helper()
	timeout := time.After(time.Minute)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				t.Fatalf("client exited before printing %q: %s", prefix, p.out.String())
			}
			if strings.HasPrefix(l, prefix) {
				return strings.TrimPrefix(l, prefix)
			}
			if strings.HasPrefix(l, "error: ") {
				t.Fatalf("client: %s", l)
			}
		case <-timeout:
			t.Fatalf("client printed no %q line in a minute: %s", prefix, p.out.String())
		}
	}
}

// kill9 kills the process and waits for it.
func (p *proc) kill9() {
	p.cmd.Process.Kill()
	p.cmd.Wait()
}
