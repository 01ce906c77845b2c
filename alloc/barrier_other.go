//go:build !linux

package alloc

// barrier does nothing where membarrier(2) is missing: a thread's stores
// drain in nanoseconds, long before the daemon, asked by an RPC after it,
// copies the memory (load/store segments need Linux anyway).
func barrier() {}
