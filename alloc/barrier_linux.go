package alloc

import (
	"sync"

	"golang.org/x/sys/unix"
)

// The membarrier(2) commands barrier uses.
const (
	membarrierPrivateExpedited         = 1 << 3
	membarrierRegisterPrivateExpedited = 1 << 4
)

// membarrierOK is whether this process registered for private expedited
// membarriers (Linux 4.14 and later, unless a seccomp filter refuses it).
var membarrierOK = sync.OnceValue(func() bool {
	_, _, e := unix.Syscall(unix.SYS_MEMBARRIER, membarrierRegisterPrivateExpedited, 0, 0)
	return e == 0
})

// barrier makes every thread of this process run a full memory barrier
// before it returns: a store a thread made before its next load of a
// segment's state is then visible to every other process, as the
// asymmetric fence of ReadAt and WriteAt against a move needs (see
// Segment.ReadAt). Without membarrier a thread's stores still drain in
// nanoseconds, long before the daemon, asked by an RPC after barrier,
// copies the memory.
func barrier() {
	if membarrierOK() {
		unix.Syscall(unix.SYS_MEMBARRIER, membarrierPrivateExpedited, 0, 0)
	}
}
