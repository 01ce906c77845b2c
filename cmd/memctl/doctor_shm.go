package main

import (
	"fmt"
	"strings"

	"github.com/farmem/farmem/internal/paths"
)

// shm lists poold's shared-memory directories under root and turns those
// no running poold uses into problems with the command that removes them.
// A directory a process holds a lock in is never offered for removal.
func (r *doctorReport) shm(root string) {
	dirs, err := paths.ScanShm(root, paths.ProcLocks)
	if err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("cannot check poold's shared-memory directories in %s: %v", root, err))
		return
	}
	r.Shm = dirs
	for _, d := range dirs {
		size := human(d.Bytes)
		switch d.State {
		case paths.ShmOrphaned:
			r.problem(fmt.Sprintf("shared-memory directory %s holds %s for data directory %s, which is gone: no poold will use it again", d.Path, size, d.DataDir),
				"rm -rf "+shellQuote(d.Path))
		case paths.ShmUnknownOwner:
			r.problem(fmt.Sprintf("shared-memory directory %s holds %s, no running poold uses it, and it does not name its data directory (an older poold made it)", d.Path, size),
				"rm -rf "+shellQuote(d.Path)+"  # unless you will start that old pool again: its segments' bytes are there")
		case paths.ShmStopped:
			r.Notes = append(r.Notes, fmt.Sprintf("%s holds %s for the stopped poold with data directory %s: its segments come back when it starts; to retire that pool: poold --retire --data-dir %s --shm-dir %s",
				d.Path, size, d.DataDir, shellQuote(d.DataDir), shellQuote(d.Path)))
		}
	}
}

// shmLine is a directory as doctor lists it.
func shmLine(d paths.ShmDir) string {
	s := fmt.Sprintf("%s: %s, %s", d.Path, human(d.Bytes), d.State)
	if d.PID != 0 {
		s += fmt.Sprintf(" (pid %d)", d.PID)
	}
	if d.DataDir != "" {
		s += ", data " + d.DataDir
	}
	return s
}

// shellQuote quotes s for a POSIX shell when it holds anything but plain
// path characters.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-+=:,@") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
