package cxl

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// DefaultRoot is where sysfs is mounted on a live Linux host.
const DefaultRoot = "/sys"

// maxAttrBytes bounds one attribute read. Kernel attributes are at most a
// page; the margin tolerates large pages while keeping a garbage fixture
// file from being read whole.
const maxAttrBytes = 64 << 10

// FS reads CXL, DAX and NUMA state from a sysfs tree. Create it with NewFS;
// the zero FS reads nothing. FS is an immutable value and safe for
// concurrent use.
type FS struct {
	root string
}

// NewFS returns an FS rooted at root, the directory sysfs is mounted on (or a
// copy of such a tree). An empty root means DefaultRoot ("/sys"). It fails
// with an error matching ErrNoSysfs when root is missing, not a directory,
// or unreadable.
func NewFS(root string) (FS, error) {
	if root == "" {
		root = DefaultRoot
	}
	root = filepath.Clean(root)
	if err := checkRoot(root); err != nil {
		return FS{}, err
	}
	return FS{root: root}, nil
}

// Root returns the directory the FS reads from.
func (fsys FS) Root() string { return fsys.root }

func checkRoot(root string) error {
	if root == "" {
		return fmt.Errorf("%w: no root; create the FS with NewFS", ErrNoSysfs)
	}
	fi, err := os.Stat(root)
	if err != nil {
		return fmt.Errorf("%w: %s: %w; pass the directory sysfs is mounted on (usually /sys) or a copy of it", ErrNoSysfs, root, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory; pass the directory sysfs is mounted on (usually /sys) or a copy of it", ErrNoSysfs, root)
	}
	f, err := os.Open(root)
	if err != nil {
		return fmt.Errorf("%w: %s: %w; check that this user may read it", ErrNoSysfs, root, err)
	}
	defer f.Close()
	if _, err := f.ReadDir(1); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: %s: %w; check that this user may read it", ErrNoSysfs, root, err)
	}
	return nil
}

// walker reads one tree for one Discover call and collects its problems.
type walker struct {
	root     string // as given to NewFS
	realRoot string // root with symlinks resolved, to check links stay inside
	problems []error
}

func newWalker(root string) *walker {
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		real = root // checkRoot succeeded; fall back to the path as given
	}
	return &walker{root: root, realRoot: real}
}

// path joins sysfs-relative elements (slash-separated) onto the root.
func (w *walker) path(elem ...string) string {
	return filepath.Join(append([]string{w.root}, elem...)...)
}

func (w *walker) add(e *AttrError) { w.problems = append(w.problems, e) }

// addParse records a parse error for file p.
func (w *walker) addParse(p string, err error) {
	var ae *AttrError
	if errors.As(err, &ae) {
		c := *ae
		c.Path = p
		w.add(&c)
		return
	}
	w.add(&AttrError{Path: p, Err: ErrMalformed, Cause: err})
}

// read returns the trimmed content of attribute file p and whether it was
// read. A missing file is recorded as a problem only when required; a
// dangling link, an unreadable or oversized file always is.
func (w *walker) read(p string, required bool) (string, bool) {
	// Stat first: opening a FIFO in a garbage tree would block forever, and
	// every sysfs attribute is a regular file.
	fi, err := os.Stat(p)
	if err == nil && !fi.Mode().IsRegular() {
		w.add(&AttrError{Path: p, Reason: "not a regular file (" + fi.Mode().Type().String() + ")", Err: ErrUnreadable})
		return "", false
	}
	var f *os.File
	if err == nil {
		f, err = os.Open(p)
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if target, lerr := os.Readlink(p); lerr == nil {
				w.add(&AttrError{Path: p, Value: clip(target), Err: ErrDanglingLink})
				return "", false
			}
			if required {
				w.add(&AttrError{Path: p, Err: ErrMissing})
			}
			return "", false
		}
		w.add(&AttrError{Path: p, Err: ErrUnreadable, Cause: err})
		return "", false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxAttrBytes+1))
	if err != nil {
		w.add(&AttrError{Path: p, Err: ErrUnreadable, Cause: err})
		return "", false
	}
	if len(data) > maxAttrBytes {
		w.add(&AttrError{Path: p, Value: clip(string(data)), Reason: "larger than " + strconv.Itoa(maxAttrBytes) + " bytes, no attribute is", Err: ErrMalformed})
		return "", false
	}
	return strings.TrimSpace(string(data)), true
}

// size reads a hex-or-decimal byte count; 0 when absent or malformed.
func (w *walker) size(p string, required bool) uint64 {
	s, ok := w.read(p, required)
	if !ok {
		return 0
	}
	v, err := ParseSize(s)
	if err != nil {
		w.addParse(p, err)
		return 0
	}
	return v
}

// decimal reads an unsigned decimal attribute; 0 when absent or malformed.
func (w *walker) decimal(p string, required bool, what string) uint64 {
	s, ok := w.read(p, required)
	if !ok {
		return 0
	}
	v, err := parseDecimal(s, what)
	if err != nil {
		w.addParse(p, err)
		return 0
	}
	return v
}

// smallInt reads an int-sized unsigned decimal attribute (interleave ways,
// granularity); 0 when absent, malformed or out of int range.
func (w *walker) smallInt(p string, required bool, what string) int {
	s, ok := w.read(p, required)
	if !ok {
		return 0
	}
	v, err := parseDecimal(s, what)
	if err == nil && v > 1<<31-1 {
		err = malformed(s, what+" is out of range")
	}
	if err != nil {
		w.addParse(p, err)
		return 0
	}
	return int(v)
}

// signed reads a signed decimal attribute such as numa_node; def when absent
// or malformed.
func (w *walker) signed(p string, required bool, what string, def int) int {
	s, ok := w.read(p, required)
	if !ok {
		return def
	}
	v, err := parseInt(s, what)
	if err != nil {
		w.addParse(p, err)
		return def
	}
	return v
}

// resolve follows the symlinks in p and returns the result relative to the
// root, slash-separated ("devices/pci0000:0c/.../mem0"). A dangling link or
// one that leaves the root is recorded and gives ok == false.
func (w *walker) resolve(p string) (string, bool) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		target, _ := os.Readlink(p)
		if errors.Is(err, fs.ErrNotExist) {
			w.add(&AttrError{Path: p, Value: clip(target), Err: ErrDanglingLink})
		} else {
			w.add(&AttrError{Path: p, Value: clip(target), Err: ErrUnreadable, Cause: err})
		}
		return "", false
	}
	rel, err := filepath.Rel(w.realRoot, real)
	if err != nil || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		target, _ := os.Readlink(p)
		w.add(&AttrError{Path: p, Value: clip(target), Reason: "resolves to " + real, Err: ErrOutsideRoot})
		return "", false
	}
	return filepath.ToSlash(rel), true
}

// linkBase returns the last element of symlink p's target ("device_dax" for
// a dax driver link) without requiring the target to exist, so trees copied
// without the drivers directory still read. ok is false when p is absent.
func (w *walker) linkBase(p string) (string, bool) {
	target, err := os.Readlink(p)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Lstat(p); serr == nil {
				w.add(&AttrError{Path: p, Reason: "want a symlink", Err: ErrMalformed, Cause: err})
			}
		}
		return "", false
	}
	return path.Base(filepath.ToSlash(target)), true
}

// parentName returns the name of the directory holding sysfs-relative path
// rel: the PCI function of a memdev, the port of a decoder. Empty at the top.
func parentName(rel string) string {
	dir := path.Dir(rel)
	if dir == "." || dir == "/" {
		return ""
	}
	return path.Base(dir)
}

// entry is a directory entry whose name is prefix followed by dot-separated
// numbers ("decoder2.1"), with those numbers as its sort key.
type entry struct {
	name string
	key  []int
}

// list returns the entries of dir named prefix+N or prefix+N.M..., in
// numeric order. Other names are ignored so newer kernels' extra files read
// fine. A missing dir is not a problem (the subsystem is simply absent).
func (w *walker) list(dir, prefix string) []entry {
	des, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			w.add(&AttrError{Path: dir, Err: ErrUnreadable, Cause: err})
		}
		return nil
	}
	var out []entry
	for _, de := range des {
		if key, ok := numberedName(de.Name(), prefix); ok {
			out = append(out, entry{name: de.Name(), key: key})
		}
	}
	slices.SortFunc(out, func(a, b entry) int { return slices.Compare(a.key, b.key) })
	return out
}

// numberedName reports whether name is prefix followed by one or more
// dot-separated decimal numbers, and returns the numbers.
func numberedName(name, prefix string) ([]int, bool) {
	rest, ok := strings.CutPrefix(name, prefix)
	if !ok || rest == "" {
		return nil, false
	}
	var key []int
	for part := range strings.SplitSeq(rest, ".") {
		if part == "" || len(part) > 9 {
			return nil, false
		}
		n := 0
		for _, c := range []byte(part) {
			if c < '0' || c > '9' {
				return nil, false
			}
			n = n*10 + int(c-'0')
		}
		key = append(key, n)
	}
	return key, true
}
