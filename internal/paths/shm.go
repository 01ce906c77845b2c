package paths

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ShmRoot is where poold makes its shared-memory directories by default.
const ShmRoot = "/dev/shm"

// ShmPrefix starts the name of every default shared-memory directory:
// farmem-UID-HASH, the hash naming the daemon's data directory.
const ShmPrefix = "farmem-"

// ShmOwnerFile is the file in a shared-memory directory that names the
// data directory of the poold that uses it (one absolute path and a
// newline), so that a directory left behind can be traced to its pool.
const ShmOwnerFile = "owner"

// lockName is the lock file that a device instance holds (flock) in each
// segment directory under a shared-memory directory.
const lockName = ".lock"

// WriteShmOwner records in shmDir that the poold with dataDir uses it.
func WriteShmOwner(shmDir, dataDir string) error {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		return fmt.Errorf("shared-memory directory %s: data directory %s: %w", shmDir, dataDir, err)
	}
	tmp := filepath.Join(shmDir, ShmOwnerFile+".tmp")
	if err := os.WriteFile(tmp, []byte(abs+"\n"), 0o600); err != nil {
		return fmt.Errorf("shared-memory directory %s: record its owner: %w", shmDir, err)
	}
	if err := os.Rename(tmp, filepath.Join(shmDir, ShmOwnerFile)); err != nil {
		return fmt.Errorf("shared-memory directory %s: record its owner: %w", shmDir, err)
	}
	return nil
}

// ShmState says whether a shared-memory directory is in use and, if not,
// whether it can go.
type ShmState string

const (
	// ShmInUse: a process holds a lock file in the directory (a running
	// poold). Never remove it.
	ShmInUse ShmState = "in use"
	// ShmOrphaned: no process holds it and its data directory is gone: no
	// poold will ever use it again.
	ShmOrphaned ShmState = "orphaned"
	// ShmStopped: no process holds it, and its data directory exists: the
	// segments' bytes wait there for that poold's next start.
	ShmStopped ShmState = "stopped"
	// ShmUnknownOwner: no process holds it, and it does not name its data
	// directory (made by a poold that predates the owner file).
	ShmUnknownOwner ShmState = "unknown owner"
)

// ShmDir is one shared-memory directory of poold's. A value.
type ShmDir struct {
	Path    string   `json:"path"`
	DataDir string   `json:"data_dir,omitempty"` // "" when the directory does not say
	Bytes   int64    `json:"bytes"`              // memory its files take (allocated blocks)
	State   ShmState `json:"state"`
	PID     int      `json:"pid,omitempty"` // the process holding a lock in it (ShmInUse)
}

// ScanShm lists the farmem-* directories under root and says of each
// whether a process holds one of its lock files, according to locks (the
// kernel's lock table, /proc/locks on Linux). It reads nothing but
// metadata and changes nothing. A directory whose locks cannot be checked
// is reported in use, so that nothing a live poold uses is ever called
// orphaned.
func ScanShm(root, locks string) ([]ShmDir, error) {
	es, err := os.ReadDir(root)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, fmt.Errorf("read %s: %w", root, err)
	}
	held, err := readLocks(locks)
	if err != nil {
		return nil, fmt.Errorf("%w; cannot tell which directories a running poold uses", err)
	}
	var out []ShmDir
	for _, e := range es {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), ShmPrefix) {
			continue
		}
		out = append(out, inspectShm(filepath.Join(root, e.Name()), held))
	}
	return out, nil
}

// inspectShm sizes one directory, finds who holds its locks and reads its owner.
func inspectShm(dir string, held map[FileID]int) ShmDir {
	d := ShmDir{Path: dir, State: ShmStopped}
	pid, bytes, sure := walkLocks(dir, held)
	d.Bytes = bytes
	switch {
	case pid != 0:
		d.State, d.PID = ShmInUse, pid
		return d
	case !sure:
		d.State = ShmInUse // cannot tell: treat as used
		return d
	}
	owner, err := os.ReadFile(filepath.Join(dir, ShmOwnerFile))
	switch {
	case err != nil:
		d.State = ShmUnknownOwner
	default:
		d.DataDir = strings.TrimSpace(string(owner))
		if _, err := os.Stat(d.DataDir); errors.Is(err, fs.ErrNotExist) {
			d.State = ShmOrphaned
		}
	}
	return d
}

// walkLocks walks dir: the pid holding one of its lock files (0: none), the
// bytes its files take, and false when part of it could not be read.
func walkLocks(dir string, held map[FileID]int) (pid int, size int64, sure bool) {
	sure = true
	_ = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			sure = false
			return nil
		}
		if e.IsDir() {
			return nil
		}
		id, blocks, err := fileID(p)
		if err != nil {
			sure = false
			return nil
		}
		size += blocks
		if e.Name() == lockName {
			if holder, ok := held[id]; ok {
				pid = holder
			}
		}
		return nil
	})
	return pid, size, sure
}

// HeldBy returns the pid of a process that holds a lock file under dir
// (a running poold's device), 0 when none, according to locks (the
// kernel's lock table). An error means it cannot tell: treat dir as used.
func HeldBy(dir, locks string) (int, error) {
	held, err := readLocks(locks)
	if err != nil {
		return 0, fmt.Errorf("%w; cannot tell whether a running poold uses %s", err, dir)
	}
	pid, _, sure := walkLocks(dir, held)
	if pid == 0 && !sure {
		return 0, fmt.Errorf("cannot read all of %s; cannot tell whether a running poold uses it", dir)
	}
	return pid, nil
}

// readLocks reads and parses the kernel's lock table at path.
func readLocks(path string) (map[FileID]int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read the kernel's lock table %s: %w", path, err)
	}
	held, err := ParseLocks(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return held, nil
}

// FileID names a file as the kernel's lock table does: the device's major
// and minor numbers and the inode number.
type FileID struct {
	Major, Minor uint32
	Inode        uint64
}

// maxLockLines bounds how much of a lock table ParseLocks reads.
const maxLockLines = 1 << 20

// ParseLocks reads a Linux /proc/locks table and returns, for each locked
// file, the pid of a process that holds a lock on it. Waiters ("->" lines)
// hold nothing and are skipped. A malformed line is an error naming it.
func ParseLocks(b []byte) (map[FileID]int, error) {
	held := map[FileID]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		if n > maxLockLines {
			return nil, fmt.Errorf("lock table longer than %d lines", maxLockLines)
		}
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		if len(f) > 1 && f[1] == "->" {
			continue
		}
		if len(f) < 6 {
			return nil, fmt.Errorf("lock table line %d %q: %d fields, want at least 6", n, sc.Text(), len(f))
		}
		pid, err := strconv.Atoi(f[4])
		if err != nil {
			return nil, fmt.Errorf("lock table line %d: pid %q: %w", n, f[4], err)
		}
		id, err := parseFileID(f[5])
		if err != nil {
			return nil, fmt.Errorf("lock table line %d: %w", n, err)
		}
		held[id] = pid
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("lock table: %w", err)
	}
	return held, nil
}

// parseFileID parses MAJOR:MINOR:INODE, the device numbers in hex.
func parseFileID(s string) (FileID, error) {
	parts := strings.Split(s, ":")
	if len(parts) != 3 {
		return FileID{}, fmt.Errorf("file %q: want MAJOR:MINOR:INODE", s)
	}
	maj, err1 := strconv.ParseUint(parts[0], 16, 32)
	minor, err2 := strconv.ParseUint(parts[1], 16, 32)
	ino, err3 := strconv.ParseUint(parts[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return FileID{}, fmt.Errorf("file %q: %w", s, err)
	}
	return FileID{Major: uint32(maj), Minor: uint32(minor), Inode: ino}, nil
}
