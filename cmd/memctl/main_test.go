package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"google.golang.org/grpc"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/pooltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// memctl runs the CLI in-process and returns stdout, stderr and the exit code.
func memctl(t *testing.T, socket string, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(append([]string{"--socket", socket}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

func TestCommands(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	s := cfg.Socket

	out, _, code := memctl(t, s, "status")
	require.Zero(t, code)
	require.Contains(t, out, "test-node")
	require.Contains(t, out, "EMULATED")

	out, _, code = memctl(t, s, "alloc", "--size", "4MiB", "--tier", "cxl", "--name", "cache", "-o", "json")
	require.Zero(t, code)
	var seg map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &seg))
	for _, k := range []string{"id", "name", "tier", "size", "emulated", "node"} {
		require.Contains(t, seg, k)
	}
	require.Equal(t, "cxl", seg["tier"])
	require.Equal(t, float64(4<<20), seg["size"])
	require.Equal(t, true, seg["emulated"])
	require.Equal(t, "test-node", seg["node"])

	out, _, code = memctl(t, s, "alloc", "--size", "1MiB", "--tier", "Local") // tier names in any letter case
	require.Zero(t, code)
	require.Contains(t, out, "allocated segment")
	require.Contains(t, out, "on local (")

	out, _, code = memctl(t, s, "segments", "-o", "json")
	require.Zero(t, code)
	var segs []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &segs))
	require.Len(t, segs, 2)

	out, _, code = memctl(t, s, "tiers", "-o", "json")
	require.Zero(t, code)
	var tiers []map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &tiers))
	require.Len(t, tiers, 3)
	for _, ti := range tiers {
		for _, k := range []string{"tier", "kind", "emulated", "capacity", "free"} {
			require.Contains(t, ti, k)
		}
	}
	require.Equal(t, "emulated", tiers[0]["kind"])
	require.Equal(t, float64(64<<20-4<<20), tiers[0]["free"])

	out, _, code = memctl(t, s, "segments")
	require.Zero(t, code)
	require.Contains(t, out, "cache")

	_, _, code = memctl(t, s, "free", "cache")
	require.Zero(t, code)
	out, _, code = memctl(t, s, "free", "2", "-o", "json")
	require.Zero(t, code)
	require.Contains(t, out, "freed")
	out, _, code = memctl(t, s, "segments", "-o", "json")
	require.Zero(t, code)
	require.Equal(t, "[]", strings.TrimSpace(out))
}

func TestErrors(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown id", []string{"free", "999"}, "not found"},
		{"bad size", []string{"alloc", "--size", "lots"}, "not a byte size"},
		{"zero size", []string{"alloc", "--size", "0"}, "size 0"},
		{"too large", []string{"alloc", "--size", "1TiB"}, "or pick another --tier"},
		{"bad tier", []string{"alloc", "--size", "1MiB", "--tier", "fast"}, `--tier: unknown tier "fast"; use local, cxl, rdma or any`},
		{"missing size", []string{"alloc"}, "size"},
		{"bad output", []string{"tiers", "-o", "xml"}, "-o"},
		{"duplicate name", []string{"alloc", "--size", "1MiB", "--name", "dup"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, code := memctl(t, cfg.Socket, tc.args...)
			if tc.want == "" {
				require.Zero(t, code)
				_, stderr, code = memctl(t, cfg.Socket, tc.args...)
				tc.want = "name in use"
			}
			require.NotZero(t, code)
			require.Contains(t, stderr, tc.want)
			require.NotContains(t, stderr, "alloc.WithFallback", "advice in memctl's flags, not the library's")
			require.Equal(t, 1, strings.Count(stderr, "\n"), "one line: %q", stderr)
		})
	}
}

func TestNoDaemon(t *testing.T) {
	_, stderr, code := memctl(t, pooltest.SocketPath(t), "status")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "no poold is listening")
	require.Contains(t, stderr, "start it with 'poold'")
	require.Equal(t, 1, strings.Count(stderr, "\n"))
	require.NotContains(t, stderr, "goroutine")
}

// unavailableAnswer is a daemon that answers Status with an ErrUnavailable
// of its own: a far home of its away.
type unavailableAnswer struct{ poolv1.UnimplementedPoolServer }

func (unavailableAnswer) Status(context.Context, *poolv1.StatusRequest) (*poolv1.StatusResponse, error) {
	return nil, errs.ToStatus(fmt.Errorf("node b: %w", errs.ErrHomeUnreachable))
}

// TestDaemonAnswersUnavailable: an ErrUnavailable the daemon answered is
// shown as it said it, not as a poold that is not there.
func TestDaemonAnswersUnavailable(t *testing.T) {
	sock := pooltest.SocketPath(t)
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := grpc.NewServer()
	poolv1.RegisterPoolServer(srv, unavailableAnswer{})
	go srv.Serve(l)
	defer srv.Stop()
	_, stderr, code := memctl(t, sock, "status")
	require.Equal(t, 1, code)
	require.Contains(t, stderr, "node b: far memory home unreachable")
	require.NotContains(t, stderr, "no poold is listening")
}

// alloc's help shows --size as required, with no default beside it.
func TestAllocHelpNoDefaultSize(t *testing.T) {
	out, stderr, code := memctl(t, filepath.Join(t.TempDir(), "none.sock"), "alloc", "--help")
	require.Zero(t, code, stderr)
	require.Contains(t, out, "segment size, e.g. 64MiB (required)\n")
	require.NotContains(t, out, "(default 0B)")
}

// TestDocNamesEveryCommand: the package comment (doc.go), which godoc shows
// as memctl's overview, names every command the CLI has.
func TestDocNamesEveryCommand(t *testing.T) {
	src, err := os.ReadFile("doc.go")
	require.NoError(t, err)
	for _, c := range newRoot(io.Discard).Commands() {
		if c.Name() == "help" {
			continue
		}
		require.Containsf(t, string(src), c.Name(), "doc.go does not mention 'memctl %s'", c.Name())
	}
}
