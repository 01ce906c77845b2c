package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/pooltest"
)

func TestCompletionScripts(t *testing.T) {
	for _, tc := range []struct {
		shell string
		check []string // the shell's syntax check, when the shell is installed
	}{
		{"bash", []string{"bash", "-n"}},
		{"zsh", []string{"zsh", "-n"}},
		{"fish", []string{"fish", "--no-execute"}},
		{"powershell", nil},
	} {
		t.Run(tc.shell, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run([]string{"completion", tc.shell}, &out, &errOut)
			require.Zero(t, code, errOut.String())
			require.Empty(t, errOut.String())
			script := out.String()
			require.Greater(t, len(script), 1000, "a whole script")
			require.Contains(t, script, "memctl")
			require.Contains(t, script, "__complete", "asks memctl for dynamic completions")
			if tc.check == nil {
				return
			}
			if _, err := exec.LookPath(tc.check[0]); err != nil {
				t.Logf("%s is not installed: script not syntax-checked", tc.check[0])
				return
			}
			path := filepath.Join(t.TempDir(), "memctl."+tc.shell)
			require.NoError(t, os.WriteFile(path, out.Bytes(), 0o600))
			msg, err := exec.Command(tc.check[0], append(tc.check[1:], path)...).CombinedOutput()
			require.NoError(t, err, "%s: %s", tc.check[0], msg)
		})
	}
	var out, errOut bytes.Buffer
	require.Equal(t, 1, run([]string{"completion", "tcsh"}, &out, &errOut))
	require.Contains(t, errOut.String(), "tcsh")
}

// complete runs cobra's hidden completion command, as the scripts do, and
// returns the suggestions (without their descriptions).
func complete(t *testing.T, args ...string) []string {
	t.Helper()
	var out, errOut bytes.Buffer
	require.Zero(t, run(append([]string{"__complete"}, args...), &out, &errOut), errOut.String())
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if strings.HasPrefix(l, ":") { // the directive
			continue
		}
		v, _, _ := strings.Cut(l, "\t")
		got = append(got, v)
	}
	return got
}

func TestDynamicCompletions(t *testing.T) {
	cfg := pooltest.Config(t)
	pooltest.Start(t, cfg)
	s := cfg.Socket
	_, _, code := memctl(t, s, "alloc", "--size", "1MiB", "--tier", "cxl", "--name", "cache")
	require.Zero(t, code)
	_, _, code = memctl(t, s, "alloc", "--size", "1MiB", "--tier", "local")
	require.Zero(t, code)

	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"tiers", []string{"alloc", "--tier", ""}, []string{"any", "local", "cxl", "rdma"}},
		{"output", []string{"tiers", "-o", ""}, []string{"table", "json"}},
		{"segments to free", []string{"--socket", s, "free", ""}, []string{"cache", "2"}},
		{"one segment only", []string{"--socket", s, "free", "cache", ""}, nil},
		{"nodes to drain", []string{"--socket", s, "drain", ""}, []string{"test-node"}},
		{"segments to move", []string{"--socket", s, "move", ""}, []string{"cache", "2"}},
		{"nodes to move to", []string{"--socket", s, "move", "cache", "--to", ""}, []string{"test-node"}},
		{"the tier to move to", []string{"--socket", s, "move", "cache", "--tier", ""}, []string{"rdma", "cxl", "local"}},
		{"no daemon: no suggestions", []string{"--socket", pooltest.SocketPath(t), "free", ""}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, complete(t, tc.args...))
		})
	}
}
