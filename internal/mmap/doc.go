// Package mmap maps segment memory into this process: the one place that
// calls mmap and munmap on a segment's file, for the daemon (package
// device, which maps segments to zero, bind and export them) and for the
// client library (package alloc, which maps the descriptor the daemon
// passed it).
//
//   - [Shared] maps part of a file shared and read-write (MAP_SHARED),
//     optionally pre-faulted (MAP_POPULATE), so stores are seen by every
//     other process mapping the same segment.
//   - [Unmap] unmaps such a mapping at once.
//   - [Retire] unmaps it after a grace period during which a copy that
//     raced the retirement faults (or reads pages no one else can get)
//     instead of touching memory a later mapping placed at the same address.
//   - [MemoryBacked] tells a file on tmpfs or hugetlbfs (memory the daemon
//     reserved) from one on a disk filesystem, whose mapped pages can fault.
//   - [SharedSync] maps persistent memory with MAP_SYNC where the file
//     allows it (devdax, a DAX filesystem) and says why not elsewhere.
//   - [Sync] (msync(MS_SYNC)) writes a range's pages to a disk file;
//     [Flush] writes a range's CPU cache lines back (CLWB, CLFLUSHOPT or
//     CLFLUSH, then SFENCE; x86-64 only), which is what makes stores to
//     directly mapped persistent memory durable.
//
// Mappings are made with golang.org/x/sys/unix pointer calls (MmapPtr,
// MunmapPtr) rather than unix.Mmap, so that a range can be replaced in
// place (MAP_FIXED) and unmapped later by address.
//
// Every function is safe for concurrent use; a mapping belongs to its
// caller, who must not touch it after Unmap. Linux only: elsewhere every
// function returns an error matching errs.ErrNotSupported (or does nothing);
// Flush needs x86-64 (its instructions are in flush_amd64.s).
package mmap
