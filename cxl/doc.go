// Package cxl discovers the far memory a Linux host offers — CXL Type-3
// memory devices, the regions and HDM decoders that map them, the DAX devices
// that expose them, and the NUMA nodes they may have become — by reading the
// kernel's sysfs view, never by guessing.
//
// Everything is read from a tree rooted at a path given to [NewFS] ("/sys" on
// a live host), in the style of prometheus/procfs sysfs.NewFS, so tests and
// tools can run against copies of real kernels' trees under testdata/.
// [FS.Discover] returns an [Inventory] of:
//
//   - memdevs:  /bus/cxl/devices/memN
//   - regions:  /bus/cxl/devices/regionN (and the dax_regionN/daxN.M below them)
//   - decoders: /bus/cxl/devices/decoderX.Y
//   - DAX:      /bus/dax/devices/daxX.Y (devdax vs system-ram from the driver link)
//   - nodes:    /devices/system/node/nodeN (cpulist, meminfo, distance,
//     access0/initiators HMAT attributes) and
//     /devices/virtual/memory_tiering/memory_tierN/nodelist
//
// The attribute layout follows the kernel ABI documents
// Documentation/ABI/testing/sysfs-bus-cxl, sysfs-bus-dax,
// sysfs-kernel-mm-memory-tiers, Documentation/ABI/stable/sysfs-devices-node
// and Documentation/admin-guide/mm/numaperf.rst.
//
// Tolerance: a tree with extra files, unknown devices or attributes from a
// newer kernel reads fine. A file that is missing, unreadable, or holds a
// value the kernel would never write does not fail Discover; it becomes an
// [*AttrError] naming the path in [Inventory.Problems] and the affected field
// keeps its zero value (or the device is skipped when it cannot be located).
// Only an unusable root ([ErrNoSysfs]) makes Discover fail.
//
// This package only reads; mapping a device into memory lives elsewhere.
//
// Concurrency: [FS] is an immutable value, safe for concurrent use; each
// Discover call reads the tree afresh and returns a new Inventory that the
// caller owns. The Parse functions are pure and safe for concurrent use.
//
// OS and tags: none. The package uses only file reads, so it builds on every
// platform; on a system without /sys, NewFS("") returns ErrNoSysfs.
package cxl
