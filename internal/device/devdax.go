package device

import (
	"fmt"
	"math/bits"
	"os"
	"sync"

	"github.com/farmem/farmem/internal/mmap"
)

// Devdax is a DAX character device (/dev/daxX.Y), typically CXL memory in
// devdax mode. The device is opened once; every Backing is a duplicate of
// that descriptor with Offset at the segment's extent, so a process holding
// it can map the whole device (SharesFD is true): hand it only to trusted
// processes. Create zeroes the extent so a segment never shows a previous
// owner's bytes. Contents survive a daemon restart (and, on persistent
// memory, a reboot).
//
// A regular file of at least size bytes can stand in for the device; it
// goes through the same mmap code.
//
// A Devdax is safe for concurrent use; calls for the same segment id or
// overlapping extents must not overlap.
type Devdax struct {
	name  string
	path  string
	size  int64
	align int64
	node  int

	mu   sync.RWMutex // held for reading by operations, for writing by Close
	file *os.File     // the device, opened O_RDWR; nil once closed
}

var _ Device = (*Devdax)(nil)

// NewDevdax opens the devdax device name at path. size and align are the
// device's size and alignment in bytes as sysfs reports them
// (/sys/bus/dax/devices/<name>/size and align; stat of a character device
// says 0); align must be a power of two no smaller than the page size, and
// size a multiple of it. node is the device's target NUMA node, or -1.
func NewDevdax(name, path string, size, align int64, node int) (*Devdax, error) {
	switch {
	case name == "":
		return nil, fmt.Errorf("device: devdax name is empty; pass the sysfs name such as \"dax0.0\": %w", ErrInvalid)
	case path == "":
		return nil, fmt.Errorf("device %s: path is empty; pass the device path such as /dev/%s: %w", name, name, ErrInvalid)
	case align < pageSize || bits.OnesCount64(uint64(align)) != 1:
		return nil, fmt.Errorf("device %s: align %d must be a power of two >= the page size %d (read it from /sys/bus/dax/devices/%s/align): %w",
			name, align, pageSize, name, ErrInvalid)
	case size <= 0 || size%align != 0:
		return nil, fmt.Errorf("device %s: size %d must be a positive multiple of align %d (read it from /sys/bus/dax/devices/%s/size): %w",
			name, size, align, name, ErrInvalid)
	case node < -1 || node >= maxNode:
		return nil, fmt.Errorf("device %s: NUMA node %d must be -1 (unknown) or in [0, %d): %w", name, node, maxNode, ErrInvalid)
	}
	if err := supported("devdax device " + name); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("device %s: open %s read-write (is it a devdax device, and are you root?): %w: %w", name, path, ErrInvalid, err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("device %s: stat %s: %w", name, path, err)
	}
	switch m := st.Mode(); {
	case m&os.ModeCharDevice != 0:
	case m.IsRegular():
		if st.Size() < size {
			_ = f.Close()
			return nil, fmt.Errorf("device %s: stand-in file %s is %d bytes, smaller than the size %d; extend it (truncate -s %d): %w",
				name, path, st.Size(), size, size, ErrInvalid)
		}
	default:
		_ = f.Close()
		return nil, fmt.Errorf("device %s: %s is %v, neither a character device nor a regular file: %w", name, path, m.Type(), ErrInvalid)
	}
	return &Devdax{name: name, path: path, size: size, align: align, node: node, file: f}, nil
}

// Name returns the name given to NewDevdax.
func (d *Devdax) Name() string { return d.name }

// Kind returns KindDevdax.
func (d *Devdax) Kind() Kind { return KindDevdax }

// Emulated returns false.
func (d *Devdax) Emulated() bool { return false }

// Node returns the node given to NewDevdax.
func (d *Devdax) Node() int { return d.node }

// Capacity returns the device size, in bytes.
func (d *Devdax) Capacity() int64 { return d.size }

// Align returns the device alignment.
func (d *Devdax) Align() int64 { return d.align }

// SharesFD returns true: a Backing's File is the whole device.
func (d *Devdax) SharesFD() bool { return true }

// Persistent returns true: the device's memory outlives the daemon.
func (d *Devdax) Persistent() bool { return true }

// Path returns the device path.
func (d *Devdax) Path() string { return d.path }

// Create zeroes the extent [off, off+length) through a temporary mapping
// and returns a Backing on it. off and length must be multiples of Align
// (ErrUnaligned). A memory fault while zeroing (a poisoned line) is returned
// as an error, not a crash.
func (d *Devdax) Create(id uint64, off, length int64) (Backing, error) {
	if err := checkExtent(d.name, id, off, length, d.align, d.size); err != nil {
		return Backing{}, err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.file == nil {
		return Backing{}, d.closedErr(id)
	}
	if err := d.zero(id, off, length); err != nil {
		return Backing{}, err
	}
	return d.backing(id, off, length)
}

// zero clears the extent. The mapping is made per call: devdax faults in
// align-sized pages, so mapping is cheap next to clearing, and no mapping
// of the device stays in the daemon to be corrupted by a stray write.
func (d *Devdax) zero(id uint64, off, length int64) error {
	b, err := mmapFile(d.file, off, length, false)
	if err != nil {
		return fmt.Errorf("device %s: segment %#x: map extent offset %d length %d to zero it: %w", d.name, id, off, length, err)
	}
	err = guardFault(fmt.Sprintf("%s: zero segment %#x", d.name, id), func() { clear(b) })
	if uerr := mmap.Unmap(b); uerr != nil && err == nil {
		err = fmt.Errorf("device %s: segment %#x: %w", d.name, id, uerr)
	}
	return err
}

// Open returns a Backing on the extent; the device keeps its contents.
func (d *Devdax) Open(id uint64, off, length int64) (Backing, error) {
	if err := checkExtent(d.name, id, off, length, d.align, d.size); err != nil {
		return Backing{}, err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.file == nil {
		return Backing{}, d.closedErr(id)
	}
	return d.backing(id, off, length)
}

func (d *Devdax) backing(id uint64, off, length int64) (Backing, error) {
	f, err := dupFile(d.file)
	if err != nil {
		return Backing{}, fmt.Errorf("device %s: segment %#x: %w", d.name, id, err)
	}
	return Backing{File: f, Offset: off, Length: length}, nil
}

// Remove only validates the extent: the memory belongs to the daemon's
// extent allocator again, and the next Create on it zeroes it.
func (d *Devdax) Remove(id uint64, off, length int64) error {
	if err := checkExtent(d.name, id, off, length, d.align, d.size); err != nil {
		return err
	}
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.file == nil {
		return d.closedErr(id)
	}
	return nil
}

// Close closes the device descriptor; Backings already handed out stay
// valid. Idempotent.
func (d *Devdax) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.file == nil {
		return nil
	}
	err := d.file.Close()
	d.file = nil
	if err != nil {
		return fmt.Errorf("device %s: close %s: %w", d.name, d.path, err)
	}
	return nil
}

func (d *Devdax) closedErr(id uint64) error {
	return fmt.Errorf("device %s: segment %#x: device is closed: %w", d.name, id, ErrClosed)
}
