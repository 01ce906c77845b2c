package pool

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// dataDirLock is the file in the data directory that a running daemon
// holds locked (flock, released by the kernel when the process dies) and
// that names its pid. New takes it before it touches anything else, so a
// second daemon on the same directory is told so at once instead of
// failing later on a device or port the first one holds.
const dataDirLock = "poold.lock"

// lockDataDir takes the data directory's lock, creating the directory.
// The returned file holds the lock until it is closed.
func lockDataDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w (choose another with --data-dir)", dir, err)
	}
	path := filepath.Join(dir, dataDirLock)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data directory %s: %w (choose another with --data-dir)", dir, err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("data directory %s: lock %s: %w", dir, path, err)
	}
	if held {
		who := "another poold"
		if b, err := os.ReadFile(path); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
				who = fmt.Sprintf("another poold (pid %d)", pid)
			}
		}
		f.Close()
		return nil, fmt.Errorf("data directory %s is in use by %s; stop it, or give this one its own --data-dir (and --socket)", dir, who)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return f, nil
}
