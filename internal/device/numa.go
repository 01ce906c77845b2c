package device

import (
	"fmt"
	"os"

	"github.com/farmem/farmem/internal/mmap"
)

// maxNode bounds the NUMA node numbers the device accepts (the kernel's
// MAX_NUMNODES is at most 1024).
const maxNode = 1 << 10

// NotResident is the PagesOnNode key counting pages that are not in memory
// or not mapped in this process.
const NotResident = -1

// NUMA is CXL memory onlined as a memory-only NUMA node (kmem / system-ram
// mode). Each segment is one file in a tmpfs directory (for example
// /dev/shm/farmem/node1) whose pages are bound to the node with
// mbind(MPOL_BIND) and allocated at Create, before any client touches them.
// The policy is stored with the shared-memory file, so pages stay on the
// node whoever maps the file. Contents survive a daemon restart, not a
// reboot.
//
// A NUMA is safe for concurrent use; calls for the same segment id must not
// overlap.
type NUMA struct {
	name     string
	node     int
	capacity int64
	dir      *segmentDir
}

var _ Device = (*NUMA)(nil)

// NewNUMA opens the device for NUMA node node backed by files in dir, which
// must be on tmpfs; dir is created (mode 0700) if needed and locked until
// Close. It checks, with a probe mbind, that the node exists and that this
// process may allocate on it. capacity is in bytes.
func NewNUMA(node int, dir string, capacity int64) (*NUMA, error) {
	name := fmt.Sprintf("node%d", node)
	if node < 0 || node >= maxNode {
		return nil, fmt.Errorf("device %s: NUMA node %d out of range [0, %d); see 'numactl -H': %w", name, node, maxNode, ErrInvalid)
	}
	if err := checkCapacity(name, capacity); err != nil {
		return nil, err
	}
	if err := supported("NUMA device " + name); err != nil {
		return nil, err
	}
	if err := probeNode(node); err != nil {
		return nil, fmt.Errorf("device %s: %w", name, err)
	}
	d, err := openSegmentDir(name, dir, func(info fsInfo) error {
		if info.kind != fsTmpfs {
			return fmt.Errorf("device %s: %s is not on tmpfs, so its pages cannot be bound to node %d; use a directory under /dev/shm or mount tmpfs there: %w",
				name, dir, node, ErrInvalid)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &NUMA{name: name, node: node, capacity: capacity, dir: d}, nil
}

// Name returns "node<N>".
func (n *NUMA) Name() string { return n.name }

// Kind returns KindNUMA.
func (n *NUMA) Kind() Kind { return KindNUMA }

// Emulated returns false.
func (n *NUMA) Emulated() bool { return false }

// Node returns the NUMA node the segments are bound to.
func (n *NUMA) Node() int { return n.node }

// Capacity returns the capacity given to NewNUMA, in bytes.
func (n *NUMA) Capacity() int64 { return n.capacity }

// Align returns the page size.
func (n *NUMA) Align() int64 { return pageSize }

// SharesFD returns false: each Backing is the segment's own file.
func (n *NUMA) SharesFD() bool { return false }

// Persistent returns true: tmpfs files outlive the daemon (not a reboot).
func (n *NUMA) Persistent() bool { return true }

// Dir returns the segment directory.
func (n *NUMA) Dir() string { return n.dir.dir }

// Create makes segment id's file, zero-filled, replacing any previous file
// for id, binds it to the node and allocates all its pages there. It fails
// with ErrNoSpace when tmpfs or the node cannot hold length bytes. The
// Backing's Offset is 0.
func (n *NUMA) Create(id uint64, off, length int64) (Backing, error) {
	if err := checkExtent(n.name, id, off, length, pageSize, n.capacity); err != nil {
		return Backing{}, err
	}
	f, err := n.dir.create(id, length)
	if err != nil {
		return Backing{}, err
	}
	if err := bindFile(f, length, n.node); err != nil {
		_ = f.Close()
		_ = n.dir.remove(id)
		return Backing{}, fmt.Errorf("device %s: segment %#x: %w", n.name, id, err)
	}
	return Backing{File: f, Offset: 0, Length: length}, nil
}

// Open returns the file of an existing segment; ErrLost if it is missing or
// no longer length bytes long (for example after a reboot).
func (n *NUMA) Open(id uint64, off, length int64) (Backing, error) {
	if err := checkExtent(n.name, id, off, length, pageSize, n.capacity); err != nil {
		return Backing{}, err
	}
	f, err := n.dir.open(id, length)
	if err != nil {
		return Backing{}, err
	}
	return Backing{File: f, Offset: 0, Length: length}, nil
}

// Remove unlinks the segment's file; the node's memory is freed once the
// last descriptor and mapping of it are gone.
func (n *NUMA) Remove(id uint64, off, length int64) error {
	if err := checkExtent(n.name, id, off, length, pageSize, n.capacity); err != nil {
		return err
	}
	return n.dir.remove(id)
}

// Segments lists the ids that have a file in the directory, in increasing
// order (see Emulated.Segments).
func (n *NUMA) Segments() ([]uint64, error) { return n.dir.ids() }

// Close releases the directory lock; segment files stay. Idempotent.
func (n *NUMA) Close() error { return n.dir.close() }

// PagesOnNode reports how many of the pages spanned by b are on each NUMA
// node, using move_pages(2) in query mode. Pages not resident or not mapped
// in this process count under NotResident, so map with
// MapOptions{Populate: true} before asking. b is typically a Mapping's
// Bytes; it is only read by the kernel's page-table walk, never touched.
func PagesOnNode(b []byte) (map[int]int, error) {
	if len(b) == 0 {
		return map[int]int{}, nil
	}
	return pagesOnNode(b)
}

// bindFile binds f's first length bytes to node and allocates them there.
func bindFile(f *os.File, length int64, node int) error {
	b, err := mmapFile(f, 0, length, false)
	if err != nil {
		return err
	}
	err = mbind(b, node)
	if err == nil {
		err = populate(b, node)
	}
	if uerr := mmap.Unmap(b); uerr != nil && err == nil {
		err = uerr
	}
	return err
}
