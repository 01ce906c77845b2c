package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/testfs"
)

// TestStartupSizeCheck: a configured size the filesystem (or RAM) behind
// it can never hold is refused at start, naming the size, the filesystem
// with its free space, and the flag to change; a size above what is
// available now but within the filesystem's size starts with a warning.
func TestStartupSizeCheck(t *testing.T) {
	small := testfs.SmallFS(t, 4*size.MiB)
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"emulate-cxl beyond its filesystem", []string{"--emulate-cxl", "8MiB", "--emulate-dir", filepath.Join(small, "cxl")},
			[]string{"--emulate-cxl 8MiB", small, "4.0 MiB", "available of", "--emulate-dir"}},
		{"emulate-cxl 100TiB", []string{"--emulate-cxl", "100TiB"}, []string{"--emulate-cxl 100TiB", "can ever hold", "--emulate-dir"}},
		{"export-size with emulate-cxl on one filesystem", []string{"--emulate-cxl", "3MiB", "--export-size", "2MiB", "--shm-dir", small},
			[]string{"--emulate-cxl 3MiB and --export-size 2MiB", "5.0 MiB", small, "--shm-dir"}},
		{"local-size beyond RAM", []string{"--local-size", "100TiB"}, []string{"--local-size 100TiB", "RAM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			args := append([]string{"--socket", filepath.Join(shortDir(t), "p.sock"), "--data-dir", t.TempDir(), "--shm-dir", t.TempDir(), "--sysfs-root", "../../cxl/testdata/plain"}, tc.args...)
			out, err := exec.CommandContext(ctx, poold, args...).CombinedOutput()
			require.Error(t, err, "%s", out)
			s := strings.TrimSpace(string(out))
			require.True(t, strings.HasPrefix(lastLine(s), "poold:"), s)
			for _, w := range tc.want {
				require.Contains(t, lastLine(s), w)
			}
		})
	}

	t.Run("above available, within the filesystem: a warning", func(t *testing.T) {
		testfs.FillFS(t, small, 2*size.MiB)
		d := startDaemon(t, t.TempDir(), filepath.Join(shortDir(t), "p.sock"), "--emulate-cxl", "3MiB", "--emulate-dir", filepath.Join(small, "cxl"))
		require.Eventually(t, func() bool { return strings.Contains(d.log.String(), "available now") }, 10*time.Second, 20*time.Millisecond)
		require.Contains(t, d.log.String(), "--emulate-cxl 3MiB")
	})
}
