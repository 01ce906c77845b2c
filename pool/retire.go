package pool

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/farmem/farmem/internal/paths"
)

// Retire removes a stopped pool for good (poold --retire): the segment
// files it keeps in memory — the segment directories in its shared-memory
// directory (export/, emulated-cxl/, numa/), then that directory when
// nothing else is left in it — and its segment table (segments.db and
// segments-volatile.db, with their reserve files), whose
// segments would otherwise all come back lost. It refuses while a poold
// answers on cfg.Socket, holds the segment table, or holds a lock in a
// directory it would remove. The data directory and anything else in it
// stay, and so do directories given with EmulateDir or NUMADir (their
// owner's to clear): Retire lists them, and a shared-memory directory that
// is not empty, in kept. It returns what it removed.
func Retire(cfg Config) (removed, kept []string, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	if err := socketInUse(cfg.Socket); err != nil {
		return nil, nil, fmt.Errorf("retire: %w", err)
	}
	table := filepath.Join(cfg.DataDir, storeFileName)
	var db *bolt.DB
	if _, err := os.Stat(table); err == nil {
		// Holding the table's lock keeps a poold from starting meanwhile.
		if db, err = bolt.Open(table, 0o600, &bolt.Options{Timeout: time.Second}); err != nil {
			return nil, nil, fmt.Errorf("retire: segment table %s: %w; a poold still uses --data-dir %s: stop it first", table, err, cfg.DataDir)
		}
		defer func() {
			if db != nil {
				db.Close()
			}
		}()
	}
	dirs, kept := cfg.segmentDirs()
	for _, d := range dirs {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		pid, err := paths.HeldBy(d, paths.ProcLocks)
		if err != nil {
			return nil, kept, fmt.Errorf("retire: %w", err)
		}
		if pid != 0 {
			return nil, kept, fmt.Errorf("retire: %s is in use by process %d (a running poold); stop it first", d, pid)
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			return removed, kept, fmt.Errorf("retire: remove %s: %w", d, err)
		}
		removed = append(removed, d)
	}
	// The shared-memory directory itself, once only poold's owner file is
	// left in it: whatever else someone put there stays.
	if shm := cfg.shmDir(); shm != cfg.DataDir {
		owner := filepath.Join(shm, paths.ShmOwnerFile)
		if err := os.Remove(owner); err == nil {
			removed = append(removed, owner)
		}
		switch err := os.Remove(shm); {
		case err == nil:
			removed = append(removed, shm)
		case !errors.Is(err, fs.ErrNotExist):
			kept = append(kept, shm)
		}
	}
	if db != nil {
		err := db.Close()
		db = nil
		if err != nil {
			return removed, kept, fmt.Errorf("retire: close %s: %w", table, err)
		}
		for _, p := range storeFiles(cfg.DataDir) {
			switch err := os.Remove(p); {
			case err == nil:
				removed = append(removed, p)
			case !errors.Is(err, fs.ErrNotExist):
				return removed, kept, fmt.Errorf("retire: remove %s: %w", p, err)
			}
		}
	}
	return removed, kept, nil
}

// segmentDirs are the directories Retire removes: the segment directories
// poold made in its shared-memory directory (in the data directory where
// there is none), and those it keeps: EmulateDir and NUMADir when set.
func (c *Config) segmentDirs() (remove, keep []string) {
	remove = append(remove, filepath.Join(c.shmDir(), "export"))
	for _, d := range []struct{ set, dir string }{{c.EmulateDir, c.emulateDir()}, {c.NUMADir, c.numaDir()}} {
		if d.set != "" {
			keep = append(keep, d.dir)
		} else {
			remove = append(remove, d.dir)
		}
	}
	return remove, keep
}
