// Package devices lists a host's RDMA devices and network interfaces as the
// kernel shows them in sysfs, so that a tool can say which RDMA transport a
// host has (InfiniBand, RoCE or iWARP, as each device reports it), whether
// its ports are up, and what to run when they are not.
//
// [Discover] reads a tree rooted at a path ("/sys" on a live host; fixture
// trees under testdata/ in tests):
//
//   - class/infiniband/<dev>/node_type ("1: CA", "4: RNIC"), the
//     device/driver link (mlx5_core, irdma, cxgb4, ...) or, for software
//     devices, the parent attribute (rdma_rxe over a netdev) and
//     device/net/ (the netdevs of the device's PCI function);
//   - class/infiniband/<dev>/ports/<n>/{state,phys_state,link_layer,rate}
//     and ports/<n>/gid_attrs/ndevs/0 (the netdev of a RoCE port);
//   - class/net/<if>/{operstate,device} (the interfaces: physical ones have
//     a device link, and rdma_rxe can be added on them).
//
// The layout follows the kernel's Documentation/ABI/stable/sysfs-class-infiniband
// and sysfs-class-net. A missing or malformed file does not fail Discover:
// it becomes a problem in [Inventory.Problems] and the field stays zero.
//
// The API is kept small for the transport picker (rdma/internal/verbs,
// rdma/dialer) and memctl doctor: [Inventory], [Device], [Port], [Netdev],
// [ParseEnum].
//
// Concurrency: Discover reads afresh on each call and returns a value the
// caller owns; everything here is safe for concurrent use.
//
// OS and tags: none; plain file reads, so it builds everywhere and reports
// ErrNoSysfs where the root is missing.
package devices
