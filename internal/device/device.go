package device

import (
	"fmt"
	"os"
)

// Kind names the sort of memory a Device carves segments from. It is a
// plain value, safe to share.
type Kind string

// The device kinds. A Kind is reported to users as part of a tier, so an
// emulated device is never mistaken for real CXL memory.
const (
	// KindDevdax is a DAX character device (/dev/daxX.Y), typically CXL
	// memory in devdax mode.
	KindDevdax Kind = "devdax"
	// KindNUMA is CXL memory onlined as a memory-only NUMA node (kmem /
	// system-ram mode), used through tmpfs files bound to that node.
	KindNUMA Kind = "numa"
	// KindEmulated is ordinary memory (a shared-memory or hugetlbfs file)
	// standing in for CXL on hosts that have none.
	KindEmulated Kind = "emulated"
	// KindDRAM is local DRAM, the reference tier.
	KindDRAM Kind = "dram"
)

// Backing is one segment's memory as a file descriptor, ready to be passed
// to another process (SCM_RIGHTS) or mapped with Map.
//
// File is owned by the caller, who must Close it; closing it does not affect
// the segment or mappings made from it. A Backing is a plain value: share it
// between goroutines only together with ownership of File.
type Backing struct {
	// File holds the segment's memory. For a devdax device it is the whole
	// device (see Device.SharesFD).
	File *os.File
	// Offset is where the segment starts in File, in bytes. It is a
	// multiple of the device's Align, hence of the page size, so it can be
	// passed to mmap directly.
	Offset int64
	// Length is the segment's size in bytes.
	Length int64
}

// Device is a memory device the daemon carves segments from. The daemon
// owns the extent allocator and passes each segment's extent (off, length),
// both multiples of Align(), to Create, Open and Remove.
//
// Implementations are safe for concurrent use, except that calls for the
// same segment id must not overlap: the daemon serializes them.
type Device interface {
	// Name is the device's stable name: "dax0.0", "node1", "emulated0", "dram".
	Name() string
	// Kind says what sort of memory this is.
	Kind() Kind
	// Emulated is true only for KindEmulated: the memory is not CXL.
	Emulated() bool
	// Node is the NUMA node the memory is on, or -1 if unknown.
	Node() int
	// Capacity is the device's size in bytes, the limit the daemon's extent
	// allocator enforces.
	Capacity() int64
	// Align is the extent alignment in bytes that the daemon must use: at
	// least the page size; the device alignment for devdax; the huge page
	// size for hugetlbfs.
	Align() int64
	// SharesFD is true when a Backing exposes the whole device (devdax):
	// handing its File to a process gives access beyond the segment.
	SharesFD() bool
	// Persistent is true when segment contents survive a daemon restart
	// (not necessarily a reboot).
	Persistent() bool
	// Create makes a new, zero-filled segment for id on the extent
	// [off, off+length) and returns its backing. Creating an id that
	// exists replaces it; the previous contents are never visible.
	Create(id uint64, off, length int64) (Backing, error)
	// Open returns the backing of an existing segment, e.g. after a daemon
	// restart. It returns an error matching ErrLost if the contents did not
	// survive.
	Open(id uint64, off, length int64) (Backing, error)
	// Remove releases the segment's backing. Removing a segment that does
	// not exist is not an error, so a daemon can repeat it after a crash.
	Remove(id uint64, off, length int64) error
	// Close releases the device. It is idempotent; segments of a persistent
	// device stay in place for the next instance.
	Close() error
}

// checkExtent validates a segment extent against a device's alignment and
// capacity. All arguments are checked before any syscall so that bad input
// never reaches the kernel.
func checkExtent(dev string, id uint64, off, length, align, capacity int64) error {
	switch {
	case length <= 0:
		return fmt.Errorf("device %s: segment %#x: length %d must be positive: %w", dev, id, length, ErrInvalid)
	case off < 0:
		return fmt.Errorf("device %s: segment %#x: offset %d must not be negative: %w", dev, id, off, ErrInvalid)
	case off%align != 0 || length%align != 0:
		return fmt.Errorf("device %s: segment %#x: extent offset %d length %d: both must be multiples of %d (Align()); round the extent: %w",
			dev, id, off, length, align, ErrUnaligned)
	case length > capacity-off:
		return fmt.Errorf("device %s: segment %#x: extent offset %d length %d ends beyond the capacity %d: %w",
			dev, id, off, length, capacity, ErrInvalid)
	}
	return nil
}

// checkCapacity validates a constructor's capacity argument.
func checkCapacity(dev string, capacity int64) error {
	if capacity <= 0 {
		return fmt.Errorf("device %s: capacity %d bytes must be positive: %w", dev, capacity, ErrInvalid)
	}
	return nil
}

// pageSize is the base page size, the smallest Align of any device.
var pageSize = int64(os.Getpagesize())
