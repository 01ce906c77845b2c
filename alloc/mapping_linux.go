package alloc

import (
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mapShared maps length bytes of f at off (page aligned), shared and read-write.
func mapShared(f *os.File, off, length int64, populate bool) ([]byte, error) {
	flags := unix.MAP_SHARED
	if populate {
		flags |= unix.MAP_POPULATE
	}
	p, err := unix.MmapPtr(int(f.Fd()), off, nil, uintptr(length), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(p), int(length)), nil
}

// unmapNow unmaps a mapping no one else has seen.
func unmapNow(mem []byte) { unix.MunmapPtr(unsafe.Pointer(&mem[0]), uintptr(len(mem))) }

// memoryBacked reports whether f is on tmpfs or hugetlbfs: memory, which a
// daemon's fallocate has reserved, rather than a disk filesystem's pages.
func memoryBacked(f *os.File) bool {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return false
	}
	t := uint32(st.Type)
	return t == uint32(unix.TMPFS_MAGIC) || t == uint32(unix.HUGETLBFS_MAGIC)
}

// retireMapping retires a segment's mapping. Pages the segment owns alone
// (ownPages) stay mapped for retireGrace, then are unmapped. Otherwise the
// mapping is replaced at once by an inaccessible reservation at the same
// address (so no copy can touch pages that may be handed to another
// segment), which is unmapped after retireGrace.
func retireMapping(mem []byte, ownPages bool) {
	if len(mem) == 0 {
		return
	}
	addr, n := unsafe.Pointer(&mem[0]), uintptr(len(mem))
	if ownPages {
		time.AfterFunc(retireGrace, func() { unix.MunmapPtr(addr, n) })
		return
	}
	_, err := unix.MmapPtr(-1, 0, addr, n, unix.PROT_NONE, unix.MAP_FIXED|unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		unix.MunmapPtr(addr, n)
		return
	}
	time.AfterFunc(retireGrace, func() { unix.MunmapPtr(addr, n) })
}
