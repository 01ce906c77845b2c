package newcomer

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// checkout is the root of the git checkout this test runs in; the test
// skips when go or git is missing or this is not a checkout.
func checkout(t *testing.T) string {
	t.Helper()
	for _, tool := range []string{"go", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the newcomer test runs the README's go commands in a copy of the git checkout", tool)
		}
	}
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git checkout (git rev-parse: %v): nothing to copy the tracked files from", err)
	}
	return strings.TrimSpace(string(out))
}

// readmeBlocks returns the fenced code blocks of the README section whose
// heading is heading (any level), up to the next heading.
func readmeBlocks(t *testing.T, readme, heading string) []string {
	t.Helper()
	var (
		blocks  []string
		cur     []string
		in      bool
		current string
		found   bool
	)
	for line := range strings.Lines(readme) {
		line = strings.TrimRight(line, "\n")
		if strings.HasPrefix(line, "```") {
			if in && current == heading {
				blocks = append(blocks, strings.Join(cur, "\n"))
			}
			in, cur = !in, nil
			continue
		}
		if in {
			cur = append(cur, line)
			continue
		}
		if h, ok := strings.CutPrefix(line, "#"); ok {
			current = strings.TrimSpace(strings.TrimLeft(h, "#"))
			found = found || current == heading
		}
	}
	require.True(t, found, "README.md has no section %q any more: the newcomer test follows it; update the test with the README", heading)
	require.NotEmpty(t, blocks, "README.md section %q has no code block any more", heading)
	return blocks
}

// trailingComment is a shell comment after a command.
var trailingComment = regexp.MustCompile(`\s+#\s.*$`)

// commands are a code block's shell commands: continuation lines joined,
// comments and blank lines dropped.
func commands(block string) []string {
	var out []string
	joined := strings.ReplaceAll(block, "\\\n", " ")
	for line := range strings.Lines(joined) {
		line = strings.TrimSpace(trailingComment.ReplaceAllString(strings.TrimSpace(line), ""))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Join(strings.Fields(line), " "))
	}
	return out
}

// copyCheckout copies the checkout's tracked and untracked-but-not-ignored
// files (as they are in the working tree, symlinks as symlinks) to dst.
func copyCheckout(t *testing.T, root, dst string) {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	require.NoError(t, err, "git ls-files")
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		src, to := filepath.Join(root, name), filepath.Join(dst, name)
		fi, err := os.Lstat(src)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted in the working tree
		}
		require.NoError(t, err)
		require.NoError(t, os.MkdirAll(filepath.Dir(to), 0o755))
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, err := os.Readlink(src)
			require.NoError(t, err)
			require.NoError(t, os.Symlink(link, to))
			continue
		}
		if !fi.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(to, b, fi.Mode().Perm()))
	}
}

// run runs one shell command line in dir and returns its stdout; a failure
// fails the test with the command and everything it printed.
func run(t *testing.T, ctx context.Context, dir string, env []string, line string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr = dir, env, &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	t.Logf("%s (%s)", line, time.Since(start).Round(time.Millisecond))
	require.NoError(t, err, "README command failed: %s\nstdout:\n%s\nstderr:\n%s", line, &stdout, &stderr)
	return stdout.String()
}
