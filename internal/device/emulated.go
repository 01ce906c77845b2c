package device

import (
	"fmt"

	"github.com/farmem/farmem/internal/size"
)

// Emulated is an emulated CXL device: ordinary memory standing in for CXL
// on hosts without it, always labelled emulated. Each segment is one file,
// seg-<id as 16 hex digits>, in the device's directory, sized with ftruncate
// and then reserved with fallocate: on tmpfs and hugetlbfs the segment's
// pages exist (zero-filled) when Create returns, as a memory device's do, so
// a filesystem that fills later can never make a first touch fault, and a
// full one fails the allocation with ErrNoSpace instead. Contents survive a
// daemon restart: on tmpfs (/dev/shm) until reboot, on a disk filesystem
// beyond it (page cache backed, so slower to first touch).
//
// On hugetlbfs the segments are in huge pages: Align is the huge page size,
// and the pages must be reserved by the admin (vm.nr_hugepages); Create
// fails with ErrNoSpace when the pool is short.
//
// Capacity is an accounting limit enforced by the daemon's extent allocator;
// the filesystem's own space is checked per Create, best effort (see Create).
//
// An Emulated is safe for concurrent use; calls for the same segment id must
// not overlap.
type Emulated struct {
	name     string
	capacity int64
	align    int64
	dir      *segmentDir
}

var _ Device = (*Emulated)(nil)

// NewEmulated opens the emulated device name backed by files in dir,
// creating dir (mode 0700) if needed. capacity is in bytes. The directory is
// locked (flock on dir/.lock) until Close, so two daemons cannot share it.
// Segments already in dir are kept: Open finds them.
func NewEmulated(name, dir string, capacity int64) (*Emulated, error) {
	if name == "" {
		return nil, fmt.Errorf("device: emulated device name is empty; pass a name such as \"emulated0\": %w", ErrInvalid)
	}
	if err := checkCapacity(name, capacity); err != nil {
		return nil, err
	}
	if err := supported("emulated device " + name); err != nil {
		return nil, err
	}
	d, err := openSegmentDir(name, dir, nil)
	if err != nil {
		return nil, err
	}
	align := pageSize
	if d.fs.kind == fsHugetlbfs {
		align = d.fs.bsize
	}
	return &Emulated{name: name, capacity: capacity, align: align, dir: d}, nil
}

// Name returns the name given to NewEmulated.
func (e *Emulated) Name() string { return e.name }

// Kind returns KindEmulated.
func (e *Emulated) Kind() Kind { return KindEmulated }

// Emulated returns true: this memory is not CXL.
func (e *Emulated) Emulated() bool { return true }

// Node returns -1: the pages follow the kernel's default placement.
func (e *Emulated) Node() int { return -1 }

// Capacity returns the capacity given to NewEmulated, in bytes.
func (e *Emulated) Capacity() int64 { return e.capacity }

// Align returns the huge page size on hugetlbfs, else the page size.
func (e *Emulated) Align() int64 { return e.align }

// SharesFD returns false: each Backing is the segment's own file.
func (e *Emulated) SharesFD() bool { return false }

// Persistent returns true: segment files outlive the daemon.
func (e *Emulated) Persistent() bool { return true }

// SurvivesReboot reports whether the segments' files outlive a host reboot:
// true on a disk filesystem (the page cache is written back at a clean
// shutdown), false on tmpfs and hugetlbfs, which are memory.
func (e *Emulated) SurvivesReboot() bool { return e.dir.fs.kind == fsOther }

// Huge reports whether the directory is on hugetlbfs.
func (e *Emulated) Huge() bool { return e.dir.fs.kind == fsHugetlbfs }

// Dir returns the segment directory.
func (e *Emulated) Dir() string { return e.dir.dir }

// Create makes segment id's file, zero-filled, replacing any previous file
// for id, and reserves its space (fallocate). off only has to lie within the
// capacity: each segment has its own file, so the Backing's Offset is 0.
// Create fails with ErrNoSpace when the filesystem cannot hold length more
// bytes. A filesystem without fallocate keeps the file sparse; there a full
// filesystem surfaces as a fault on first touch instead, which the library's
// copies guard against (it guards every mapping not on tmpfs or hugetlbfs).
func (e *Emulated) Create(id uint64, off, length int64) (Backing, error) {
	if err := checkExtent(e.name, id, off, length, e.align, e.capacity); err != nil {
		return Backing{}, err
	}
	f, err := e.dir.create(id, length)
	if err != nil {
		return Backing{}, err
	}
	if err := reserve(f, length); err != nil {
		_ = f.Close()
		_ = e.dir.remove(id)
		if IsNoSpace(err) {
			fix := "free space there or lower the device capacity"
			if e.Huge() {
				fix = "reserve more huge pages (sysctl vm.nr_hugepages) or lower the device capacity"
			}
			return Backing{}, fmt.Errorf("device %s: segment %#x: reserve %s in %s (%s free there): %w: %w; %s", e.name, id, size.Size(length).Human(), e.dir.dir, e.dir.freeHuman(), ErrNoSpace, err, fix)
		}
		return Backing{}, fmt.Errorf("device %s: segment %#x: reserve %d bytes in %s: %w", e.name, id, length, e.dir.dir, err)
	}
	return Backing{File: f, Offset: 0, Length: length}, nil
}

// Open returns the file of an existing segment; ErrLost if it is missing or
// no longer length bytes long.
func (e *Emulated) Open(id uint64, off, length int64) (Backing, error) {
	if err := checkExtent(e.name, id, off, length, e.align, e.capacity); err != nil {
		return Backing{}, err
	}
	f, err := e.dir.open(id, length)
	if err != nil {
		return Backing{}, err
	}
	return Backing{File: f, Offset: 0, Length: length}, nil
}

// Remove unlinks the segment's file. Its memory is freed once the last
// descriptor and mapping of it are gone.
func (e *Emulated) Remove(id uint64, off, length int64) error {
	if err := checkExtent(e.name, id, off, length, e.align, e.capacity); err != nil {
		return err
	}
	return e.dir.remove(id)
}

// Segments lists the ids that have a file in the directory, in increasing
// order, so a restarted daemon can remove files its segment table does not
// know (left by a crash between Create and the table commit).
func (e *Emulated) Segments() ([]uint64, error) { return e.dir.ids() }

// Close releases the directory lock; segment files stay for the next
// instance. Idempotent.
func (e *Emulated) Close() error { return e.dir.close() }
