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

// retireMapping replaces the mapping with an inaccessible reservation at
// the same address (releasing the segment's pages at once) and unmaps the
// reservation after retireGrace.
func retireMapping(mem []byte) {
	if len(mem) == 0 {
		return
	}
	addr, n := unsafe.Pointer(&mem[0]), uintptr(len(mem))
	_, err := unix.MmapPtr(-1, 0, addr, n, unix.PROT_NONE, unix.MAP_FIXED|unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		unix.MunmapPtr(addr, n)
		return
	}
	time.AfterFunc(retireGrace, func() { unix.MunmapPtr(addr, n) })
}
