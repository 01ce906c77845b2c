package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// poold --retire removes a stopped pool's segment files and segment table,
// refuses while the pool runs or a lock in its directories is held, and
// leaves a data directory a new poold starts on with no segments.
func TestRetire(t *testing.T) {
	data, shm := t.TempDir(), filepath.Join(shortDir(t), "farmem-0-retire")
	sock := filepath.Join(shortDir(t), "p.sock")
	d := startDaemon(t, data, sock, "--shm-dir", shm)
	ctl := func(args ...string) string {
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		out, err := memctlCommand(ctx, append([]string{"--socket", sock}, args...)...).CombinedOutput()
		require.NoError(t, err, "memctl %v: %s", args, out)
		return string(out)
	}
	ctl("alloc", "--size", "1MiB", "--tier", "cxl", "--name", "kept-bytes")
	retire := func() (string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, poold, "--retire", "--data-dir", data, "--socket", sock, "--shm-dir", shm,
			"--sysfs-root", "../../cxl/testdata/plain").CombinedOutput()
		return string(out), err
	}

	out, err := retire()
	require.Error(t, err, "retire while the pool runs: %s", out)
	require.Contains(t, out, "another poold is listening there")
	require.DirExists(t, filepath.Join(shm, "emulated-cxl"))

	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, d.cmd.Wait(), "%s", d.log)

	// A lock someone holds in a segment directory stops it too.
	f, err := os.OpenFile(filepath.Join(shm, "export", ".lock"), os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))
	out, err = retire()
	require.Error(t, err, out)
	require.Contains(t, out, fmt.Sprintf("in use by process %d", os.Getpid()))
	require.NoError(t, f.Close())

	out, err = retire()
	require.NoError(t, err, out)
	for _, p := range []string{filepath.Join(shm, "export"), filepath.Join(shm, "emulated-cxl"), shm, filepath.Join(data, "segments.db"), filepath.Join(data, "segments.db.reserve")} {
		require.Contains(t, out, "removed "+p+"\n")
	}
	require.NoDirExists(t, shm)
	require.DirExists(t, data)

	startDaemon(t, data, sock, "--shm-dir", shm)
	require.Equal(t, "[]\n", ctl("segments", "-o", "json"), "the retired pool's segments are gone, not lost")
}
