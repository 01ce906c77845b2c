package alloc

import (
	"fmt"
	"os"
	"runtime/debug"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/mmap"
)

// Persist methods, as Durability.Method names them.
const (
	// PersistCacheFlush writes the range's CPU cache lines back (CLWB,
	// CLFLUSHOPT or CLFLUSH, then SFENCE): persistent memory mapped
	// straight into the process (devdax, or a file on a DAX filesystem
	// mapped with MAP_SYNC), where the caches are the only volatile layer.
	PersistCacheFlush = "cache-flush"
	// PersistMsync is msync(MS_SYNC) on the range's pages: a file on a disk
	// filesystem (an emulated device there), whose page cache the kernel
	// writes to the disk before the call returns.
	PersistMsync = "msync"
)

// Durability says whether Segment.Persist can make a segment's bytes
// survive a power loss, and how. A plain value.
type Durability struct {
	// PowerSafe reports memory whose contents survive a power loss once
	// flushed: persistent CXL memory (a pmem region), an NVDIMM, an
	// emulated device's files on a disk filesystem. poold says which.
	PowerSafe bool
	// Method is how Persist flushes: PersistCacheFlush or PersistMsync;
	// "" when Persist cannot make the bytes durable.
	Method string
	// Reason says why this method, or why none, for people.
	Reason string
}

// NotDurableError is Persist's answer on memory that does not survive a
// power loss (local DRAM, volatile CXL memory, emulated CXL memory on
// tmpfs, rdma and shared segments): there is nothing to flush to. errors.Is
// reports ErrNotSupported for it. A plain value.
type NotDurableError struct {
	// Segment is the segment's id.
	Segment uint64
	// Kind is what backs it: dram, numa, emulated, devdax, tcp...
	Kind string
	// Reason says why its memory is not durable.
	Reason string
}

// Error says which segment, why, and what to do.
func (e *NotDurableError) Error() string {
	return fmt.Sprintf("persist segment %d (%s): %s; allocate on persistent memory (a pmem CXL region in devdax mode, or --emulate-dir on a disk filesystem) to have it survive a power loss", e.Segment, e.Kind, e.Reason)
}

// Is reports ErrNotSupported.
func (e *NotDurableError) Is(target error) bool { return target == errs.ErrNotSupported }

// Durability says what Persist does for this segment.
func (s *Segment) Durability() Durability {
	if m := s.mappedBase(); m != nil {
		return m.durability
	}
	switch {
	case s.desc.Load().Tier == poolv1.Tier_TIER_RDMA:
		return Durability{Reason: "an rdma segment's home holds it in shared memory, which a power loss clears"}
	default:
		return Durability{Reason: "a shared attachment caches pages here; write them back with the segment's coherence protocol, its memory is not persistent"}
	}
}

// Persist makes the n bytes at off durable: when it returns nil they
// survive a power loss of the host, as far as the memory can (see
// Durability). What it does depends on the memory:
//
//   - devdax on persistent memory (a pmem CXL region): writes the range's
//     cache lines back (PersistCacheFlush); the mapping is MAP_SYNC.
//   - emulated device on a disk filesystem: msync(MS_SYNC) of the range's
//     pages (PersistMsync), or, on a DAX filesystem mapped with MAP_SYNC,
//     the cache-line write-back.
//   - local DRAM, volatile CXL (a ram region, a memory-only NUMA node),
//     emulated CXL on tmpfs or hugetlbfs, rdma and shared segments: nothing
//     to flush to; it returns a *NotDurableError (matching ErrNotSupported).
//
// A range outside the segment is ErrOutOfRange; after Free or Close,
// ErrClosed; on a segment reported lost, ErrSegmentLost. n == 0 checks
// only. Safe for concurrent use with the segment's other calls; stores
// that race Persist may or may not be made durable by it.
func (s *Segment) Persist(off, n int64) (err error) {
	if s.closedNow() {
		return s.errClosed()
	}
	if off < 0 || n < 0 || off > s.size || n > s.size-off {
		return fmt.Errorf("persist %d bytes at %d of segment %d (size %d): %w", n, off, s.info.Id, s.size, ErrOutOfRange)
	}
	if _, err := s.use(); err != nil { // the mapping stays while it is flushed
		return err
	}
	defer s.done()
	m := s.mappedBase()
	if m == nil || m.durability.Method == "" {
		return &NotDurableError{Segment: s.info.Id, Kind: s.Kind(), Reason: s.Durability().Reason}
	}
	if g, ok := s.base().(*guarded); ok {
		if err := g.check(); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	old := debug.SetPanicOnFault(true)
	defer faultGuard(old, &err)
	b := m.mem[off : off+n]
	if m.durability.Method == PersistMsync {
		err = mmap.Sync(b)
	} else {
		err = mmap.Flush(b)
	}
	if err != nil {
		return fmt.Errorf("persist %d bytes at %d of segment %d: %w", n, off, s.info.Id, err)
	}
	return nil
}

// mappedBase is the segment's mapping, nil for a segment reached otherwise.
func (s *Segment) mappedBase() *mapped {
	switch b := s.base().(type) {
	case *mapped:
		return b
	case *guarded:
		return &b.mapped
	}
	return nil
}

// mapSegment maps the memory the daemon passed in f as the segment's
// backend: with MAP_SYNC where the segment is power-safe and the file
// allows it, knowing what Persist will do on it. mem is the mapping, for
// the caller to unmap when it cannot use the backend.
func mapSegment(info *poolv1.Segment, f *os.File, off, length int64, populate bool) (be backend, mem []byte, err error) {
	d := Durability{PowerSafe: info.PowerSafe, Reason: volatileReason(info)}
	if info.PowerSafe {
		mem, err = mmap.SharedSync(f, off, length, populate)
		switch {
		case err == nil:
			d.Method, d.Reason = PersistCacheFlush, "persistent memory mapped with MAP_SYNC: "+mmap.FlushMethod()+" of the range's cache lines"
		case info.Kind == "devdax":
			// A devdax device takes MAP_SYNC; what refuses it is a
			// stand-in (a regular file), mapped directly all the same.
			d.Method, d.Reason = PersistCacheFlush, "devdax device mapped directly: "+mmap.FlushMethod()+" of the range's cache lines"
		default:
			d.Method, d.Reason = PersistMsync, fmt.Sprintf("msync(MS_SYNC) of the range's pages to the disk (no MAP_SYNC: %v)", err)
		}
		if d.Method == PersistCacheFlush && mmap.FlushMethod() == "" {
			d.Method, d.Reason = "", "writing cache lines back from user space is implemented for x86-64 only"
		}
	}
	if mem == nil {
		if mem, err = mmap.Shared(f, off, length, populate); err != nil {
			return nil, nil, err
		}
	}
	return newMapped(info, mem, f, d), mem, nil
}

// volatileReason says why a segment's memory does not survive a power loss.
func volatileReason(info *poolv1.Segment) string {
	switch info.Kind {
	case "dram":
		return "local DRAM loses its contents at power loss"
	case "numa":
		return "a memory-only NUMA node is volatile CXL memory (system-ram mode)"
	case "emulated":
		return "the emulated device's files are in shared memory (tmpfs or hugetlbfs), which a power loss clears"
	case "devdax":
		return "the devdax device is volatile CXL memory (a ram region)"
	}
	return "its memory is volatile"
}
