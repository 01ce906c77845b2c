package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/internal/paths"
	"github.com/farmem/farmem/internal/pooltest"
	"github.com/farmem/farmem/pool"
)

// TestDoctorShmDirs starts two daemons with their shared-memory directories
// under one root, stops one and deletes its data directory: doctor offers
// the command that removes the stopped pool's directory, which works, and
// never the running pool's.
func TestDoctorShmDirs(t *testing.T) {
	shmRoot := pooltest.ShmDir(t)
	sysfs := sysfsTree(t, 512, "cxl/testdata/plain")

	live := pooltest.Config(t)
	live.ShmDir = filepath.Join(shmRoot, "farmem-0-live")
	pooltest.Start(t, live)

	gone := pooltest.Config(t)
	gone.ShmDir = filepath.Join(shmRoot, "farmem-0-gone")
	gone.DataDir = filepath.Join(t.TempDir(), "retired")
	d, err := pool.Start(gone, nil)
	require.NoError(t, err)
	require.NoError(t, d.Close())
	owner, err := os.ReadFile(filepath.Join(gone.ShmDir, paths.ShmOwnerFile))
	require.NoError(t, err, "poold names its data directory in its shared-memory directory")
	require.Equal(t, gone.DataDir+"\n", string(owner))
	require.NoError(t, os.RemoveAll(gone.DataDir))

	r := doctorJSON(t, live.Socket, "--sysfs", sysfs, "--shm-root", shmRoot)
	states := map[string]paths.ShmDir{}
	for _, s := range r.Shm {
		states[s.Path] = s
	}
	require.Equal(t, paths.ShmInUse, states[live.ShmDir].State)
	require.Equal(t, os.Getpid(), states[live.ShmDir].PID)
	require.Equal(t, paths.ShmOrphaned, states[gone.ShmDir].State)
	fix := "rm -rf " + gone.ShmDir
	require.Equal(t, []string{fix}, fixes(r))

	out, _, code := memctl(t, live.Socket, "doctor", "--sysfs", sysfs, "--shm-root", shmRoot)
	require.Zero(t, code)
	require.Contains(t, out, live.ShmDir+": ")
	require.Contains(t, out, "in use (pid ")
	require.Contains(t, out, "which is gone: no poold will use it again")

	// The command as doctor prints it removes the directory; the running
	// pool's stays and is still in use.
	cmdOut, err := exec.Command("sh", "-c", fix).CombinedOutput()
	require.NoError(t, err, "%s", cmdOut)
	_, err = os.Stat(gone.ShmDir)
	require.True(t, os.IsNotExist(err))
	r = doctorJSON(t, live.Socket, "--sysfs", sysfs, "--shm-root", shmRoot)
	require.Empty(t, fixes(r))
	require.Len(t, r.Shm, 1)
	require.Equal(t, paths.ShmInUse, r.Shm[0].State)
	require.False(t, slices.ContainsFunc(r.Notes, func(n string) bool { return strings.Contains(n, "cannot check") }), r.Notes)
}
