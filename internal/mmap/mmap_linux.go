package mmap

import (
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
	if length <= 0 || length > math.MaxInt {
		return nil, fmt.Errorf("mmap %s: length %d out of range (1 to %d): %w", f.Name(), length, math.MaxInt, errs.ErrInvalid)
	}
	flags := unix.MAP_SHARED
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
