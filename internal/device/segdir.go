package device

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/farmem/farmem/internal/size"
)

// fsKind is the sort of filesystem a segment directory lives on.
type fsKind int

const (
	fsOther     fsKind = iota // any other filesystem, e.g. ext4 (page cache backed)
	fsTmpfs                   // tmpfs / shmem: memory, survives a daemon restart, not a reboot
	fsHugetlbfs               // hugetlbfs: memory in huge pages reserved by the admin
)

// fsInfo is what statfs says about a segment directory's filesystem.
type fsInfo struct {
	kind  fsKind
	bsize int64 // block size; the huge page size on hugetlbfs
	avail int64 // bytes available; -1 when the filesystem reports no limit
}

// segFilePrefix starts every segment file's name; the rest is the id as 16
// hex digits, so names sort by id and never collide with the lock file.
const segFilePrefix = "seg-"

// lockFileName is the file in a segment directory whose flock marks the
// directory as owned by one device instance.
const lockFileName = ".lock"

// segmentDir is a directory holding one file per segment: the storage
// shared by the emulated and NUMA devices. It is safe for concurrent use;
// operations on one id must not overlap (the daemon serializes them).
type segmentDir struct {
	dev string // device name, for messages
	dir string
	fs  fsInfo

	mu   sync.RWMutex // held for reading by operations, for writing by close
	lock *os.File     // flocked lock file; nil once closed
}

// openSegmentDir creates dir (0700) if needed, inspects its filesystem,
// has check (if not nil) accept it, and takes its lock.
func openSegmentDir(dev, dir string, check func(fsInfo) error) (*segmentDir, error) {
	if dir == "" {
		return nil, fmt.Errorf("device %s: segment directory is empty; pass a directory path: %w", dev, ErrInvalid)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("device %s: create segment directory %s: %w: %w", dev, dir, ErrInvalid, err)
	}
	info, err := statFS(dir)
	if err != nil {
		return nil, fmt.Errorf("device %s: statfs %s: %w", dev, dir, err)
	}
	if check != nil {
		if err := check(info); err != nil {
			return nil, err
		}
	}
	lock, err := lockFile(filepath.Join(dir, lockFileName))
	if err != nil {
		return nil, fmt.Errorf("device %s: %w", dev, err)
	}
	return &segmentDir{dev: dev, dir: dir, fs: info, lock: lock}, nil
}

func (d *segmentDir) path(id uint64) string {
	return filepath.Join(d.dir, fmt.Sprintf("%s%016x", segFilePrefix, id))
}

// create makes a fresh zero-length-then-truncated file for id. A previous
// file for id is unlinked rather than truncated, so a process that still
// maps it keeps its detached pages instead of faulting, and the new file
// never shows old bytes.
func (d *segmentDir) create(id uint64, length int64) (*os.File, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.lock == nil {
		return nil, d.closedErr(id)
	}
	// Files are sparse: space is taken when pages are touched, not here. A
	// statfs check catches the plain case of a filesystem smaller than the
	// segment; it cannot see other segments' untouched pages, so a full
	// filesystem can still surface later as a fault on first touch.
	if info, err := statFS(d.dir); err == nil && info.avail >= 0 && info.avail < length {
		return nil, fmt.Errorf("device %s: segment %#x needs %s but the filesystem of %s has %s free; free space there, enlarge it (mount -o remount,size=...), or lower the device capacity: %w",
			d.dev, id, size.Size(length).Human(), d.dir, size.Size(info.avail).Human(), ErrNoSpace)
	}
	p := d.path(id)
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("device %s: segment %#x: remove previous file: %w", d.dev, id, err)
	}
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("device %s: segment %#x: create %s: %w", d.dev, id, p, err)
	}
	if err := f.Truncate(length); err != nil {
		_ = f.Close()
		_ = os.Remove(p)
		if IsNoSpace(err) {
			return nil, fmt.Errorf("device %s: segment %#x: size %s to %s: %w: %w", d.dev, id, p, size.Size(length).Human(), ErrNoSpace, err)
		}
		return nil, fmt.Errorf("device %s: segment %#x: size %s to %d bytes: %w", d.dev, id, p, length, err)
	}
	return f, nil
}

// freeHuman is the space available in the directory's filesystem, for
// messages: "unknown" when statfs fails, "no limit" when it reports none.
func (d *segmentDir) freeHuman() string {
	info, err := statFS(d.dir)
	switch {
	case err != nil:
		return "unknown"
	case info.avail < 0:
		return "no limit"
	}
	return size.Size(info.avail).Human()
}

// open returns the existing file for id, checking that it still has the
// segment's length (a shorter file would fault on access).
func (d *segmentDir) open(id uint64, length int64) (*os.File, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.lock == nil {
		return nil, d.closedErr(id)
	}
	p := d.path(id)
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("device %s: segment %#x: %s does not exist (removed, or the host rebooted); free the segment: %w", d.dev, id, p, ErrLost)
	}
	if err != nil {
		return nil, fmt.Errorf("device %s: segment %#x: open %s: %w", d.dev, id, p, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("device %s: segment %#x: stat %s: %w", d.dev, id, p, err)
	}
	if st.Size() != length {
		_ = f.Close()
		return nil, fmt.Errorf("device %s: segment %#x: %s is %d bytes, expected %d (truncated or created by an interrupted Create); free the segment: %w",
			d.dev, id, p, st.Size(), length, ErrLost)
	}
	return f, nil
}

// remove unlinks the file for id; a missing file is not an error.
func (d *segmentDir) remove(id uint64) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.lock == nil {
		return d.closedErr(id)
	}
	if err := os.Remove(d.path(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("device %s: segment %#x: %w", d.dev, id, err)
	}
	return nil
}

// ids lists the segments that have a file, in increasing order.
func (d *segmentDir) ids() ([]uint64, error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.lock == nil {
		return nil, fmt.Errorf("device %s: list segments: %w", d.dev, ErrClosed)
	}
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("device %s: list segments in %s: %w", d.dev, d.dir, err)
	}
	var ids []uint64
	for _, e := range entries {
		hex, ok := strings.CutPrefix(e.Name(), segFilePrefix)
		if !ok || len(hex) != 16 || !e.Type().IsRegular() {
			continue
		}
		id, err := strconv.ParseUint(hex, 16, 64)
		if err != nil {
			continue
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// close releases the directory lock. Segment files stay. Idempotent.
func (d *segmentDir) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.lock == nil {
		return nil
	}
	err := d.lock.Close()
	d.lock = nil
	if err != nil {
		return fmt.Errorf("device %s: release lock on %s: %w", d.dev, d.dir, err)
	}
	return nil
}

func (d *segmentDir) closedErr(id uint64) error {
	return fmt.Errorf("device %s: segment %#x: device is closed; construct it again: %w", d.dev, id, ErrClosed)
}
