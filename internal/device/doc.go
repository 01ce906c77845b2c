// Package device provides the memory devices that the daemon (poold)
// carves segments from, and the mapping of a segment into a process.
//
// One interface, Device, has four implementations:
//
//   - Devdax: a DAX character device (/dev/daxX.Y), CXL memory in devdax
//     mode. Backings share the device descriptor (SharesFD) at the
//     segment's offset; Create zeroes the extent.
//   - NUMA: CXL memory onlined as a memory-only NUMA node. One tmpfs file
//     per segment, bound to the node with mbind(MPOL_BIND) and allocated
//     before first touch.
//   - Emulated: a stand-in for CXL on hosts without it, always labelled
//     emulated. One file per segment in a directory (tmpfs, hugetlbfs or
//     disk).
//   - DRAM: local memory, the reference tier. One sealed memfd per segment,
//     held by the device; nothing survives a daemon restart.
//
// The daemon owns an extent allocator per device and passes each segment's
// extent (offset and length, multiples of Device.Align) to Create, Open and
// Remove. A device returns the segment as a Backing: a file descriptor and
// the segment's offset in it. The daemon passes the descriptor to clients
// over a unix socket (SCM_RIGHTS); the daemon maps it with Map, the client
// library with internal/mmap, which Map and the devices use too.
// The device never sits between a process and its mapped memory.
//
// Devices record nothing about segments beyond what their files hold: the
// daemon's segment table is the source of truth, and Segments (on Emulated
// and NUMA) lists the files so that a restarted daemon can remove the ones
// its table does not know.
//
// # Concurrency
//
// Every Device implementation is safe for concurrent use. Calls for the same
// segment id (or, on devdax, overlapping extents) must not overlap: the
// daemon serializes them. Close may race with other calls, which then fail
// with ErrClosed. A Mapping's Bytes may be used from any goroutine until its
// Close.
//
// # Faults
//
// Mapped memory can fault (SIGBUS): a file truncated behind the mapping, a
// tmpfs or hugetlbfs pool that runs out on first touch, a poisoned CXL line.
// Memory the package itself touches (zeroing a devdax extent, touching
// pages on old kernels) is guarded and turned into an error; the slice from
// Mapping.Bytes is the caller's to guard (runtime/debug.SetPanicOnFault).
//
// # Requirements
//
// Linux only; elsewhere every constructor and Map return an error matching
// ErrNotSupported. DRAM needs memfd_create (Linux 3.17). NUMA needs a kernel
// built with CONFIG_NUMA and uses MADV_POPULATE_WRITE (Linux 5.14) when
// available, touching each page otherwise. Devdax needs read-write access to
// the device node (usually root). No build tags, no cgo.
package device
