package mmap

import (
	"errors"
	"fmt"
	"math"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/internal/errs"
)

// Shared maps length bytes of f from off (a multiple of the page size),
// shared and read-write; populate pre-faults every page (MAP_POPULATE),
// paying the faults once up front instead of on first touch. f may be
// closed once Shared returns: the mapping keeps the memory. The error wraps
// the system's (ENOMEM when the address space, or hugetlbfs's pool, is
// short), and errs.ErrInvalid for a length out of range.
func Shared(f *os.File, off, length int64, populate bool) ([]byte, error) {
	return mapShared(f, off, length, populate, unix.MAP_SHARED)
}

// SharedSync is Shared with MAP_SYNC (MAP_SHARED_VALIDATE|MAP_SYNC): a
// mapping of persistent memory straight into the process (a devdax device,
// a file on a DAX filesystem) whose file metadata the kernel makes durable
// before a write fault returns, so that writing back the CPU caches (Flush)
// makes stores durable. Where the file cannot be mapped so (tmpfs, a disk
// filesystem's page cache, a kernel before 4.15) it fails with an error
// matching errs.ErrNotSupported that says why; map with Shared then.
func SharedSync(f *os.File, off, length int64, populate bool) ([]byte, error) {
	b, err := mapShared(f, off, length, populate, unix.MAP_SHARED_VALIDATE|unix.MAP_SYNC)
	if errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL) {
		return nil, &NotSupportedError{Op: "MAP_SYNC", Reason: fmt.Sprintf("%s is not persistent memory mapped directly (not devdax, not on a DAX filesystem): %v", f.Name(), err)}
	}
	return b, err
}

// mapShared maps with the given sharing flags (MAP_SHARED or
// MAP_SHARED_VALIDATE|MAP_SYNC).
func mapShared(f *os.File, off, length int64, populate bool, flags int) ([]byte, error) {
	if length <= 0 || length > math.MaxInt {
		return nil, fmt.Errorf("mmap %s: length %d out of range (1 to %d): %w", f.Name(), length, math.MaxInt, errs.ErrInvalid)
	}
	if populate {
		flags |= unix.MAP_POPULATE
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("mmap %s: %w", f.Name(), err)
	}
	var p unsafe.Pointer
	cerr := rc.Control(func(fd uintptr) {
		p, err = unix.MmapPtr(int(fd), off, nil, uintptr(length), unix.PROT_READ|unix.PROT_WRITE, flags)
	})
	if cerr != nil {
		err = cerr
	}
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes at offset %d of %s: %w", length, off, f.Name(), err)
	}
	return unsafe.Slice((*byte)(p), int(length)), nil
}

// Sync writes the pages of a shared file mapping that hold b (part of a
// mapping Shared returned) to the file's device and waits
// (msync(MS_SYNC)): on a disk filesystem that is what makes stores
// durable. On tmpfs and hugetlbfs it does nothing lasting (their pages are
// memory); a devdax device refuses it (EINVAL): use Flush.
func Sync(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	ps := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(&b[0]))
	first := start &^ (ps - 1)
	n := (start + uintptr(len(b)) - first + ps - 1) &^ (ps - 1)
	if _, _, e := unix.Syscall(unix.SYS_MSYNC, first, n, unix.MS_SYNC); e != 0 {
		return fmt.Errorf("msync(MS_SYNC) of %d bytes: %w", n, e)
	}
	return nil
}

// Unmap unmaps a whole mapping that Shared returned.
func Unmap(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := unix.MunmapPtr(unsafe.Pointer(&b[0]), uintptr(len(b))); err != nil {
		return fmt.Errorf("munmap %d bytes: %w", len(b), err)
	}
	return nil
}

// Retire gives up a mapping that Shared returned and that copies may still
// be touching. With ownPages (the pages belong to this mapping alone: its
// own file, which the daemon unlinks) the mapping stays readable for grace,
// so a racing copy finishes on pages no one else can get, then is unmapped.
// Otherwise the range is replaced at once by an inaccessible reservation at
// the same address, so no copy can touch pages that may go to another
// segment, and the reservation is unmapped after grace: a racing copy
// faults (an error under debug.SetPanicOnFault) instead of reading memory
// that a later mapping placed at the same address.
func Retire(b []byte, grace time.Duration, ownPages bool) {
	if len(b) == 0 {
		return
	}
	addr, n := unsafe.Pointer(&b[0]), uintptr(len(b))
	if !ownPages {
		_, err := unix.MmapPtr(-1, 0, addr, n, unix.PROT_NONE, unix.MAP_FIXED|unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
		if err != nil {
			unix.MunmapPtr(addr, n)
			return
		}
	}
	time.AfterFunc(grace, func() { unix.MunmapPtr(addr, n) })
}

// MemoryBacked reports whether f is on tmpfs or hugetlbfs: memory, which the
// daemon's fallocate has reserved, rather than a disk filesystem's pages,
// which a mapping can fault on.
func MemoryBacked(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	var st unix.Statfs_t
	if cerr := rc.Control(func(fd uintptr) { err = unix.Fstatfs(int(fd), &st) }); cerr != nil || err != nil {
		return false
	}
	t := uint32(st.Type)
	return t == uint32(unix.TMPFS_MAGIC) || t == uint32(unix.HUGETLBFS_MAGIC)
}

// WillNeed tells the kernel that b, part of a mapping that Shared
// returned, will be read soon (madvise MADV_WILLNEED on the pages that
// hold it), so it can start paging them in; a hint whose failure (b's
// mapping already gone) changes nothing and is not reported.
func WillNeed(b []byte) {
	if len(b) == 0 {
		return
	}
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(&b[0]))
	first := start &^ (page - 1)
	unix.Syscall(unix.SYS_MADVISE, first, start+uintptr(len(b))-first, unix.MADV_WILLNEED)
}
