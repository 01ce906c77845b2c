package device

import (
	"fmt"
	"runtime/debug"
)

// guardFault runs fn, which touches mapped memory, and turns a memory fault
// (SIGBUS from a truncated file, a full tmpfs, a lost huge page or a
// poisoned CXL line) into an error instead of killing the daemon. Other
// panics propagate unchanged.
func guardFault(what string, fn func()) (err error) {
	old := debug.SetPanicOnFault(true)
	defer func() {
		debug.SetPanicOnFault(old)
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(interface{ Addr() uintptr }); ok {
			err = fmt.Errorf("device: %s: memory fault at %#x (backing truncated, out of space, or hardware error): %w",
				what, f.Addr(), ErrNoSpace)
			return
		}
		panic(r)
	}()
	fn()
	return nil
}
