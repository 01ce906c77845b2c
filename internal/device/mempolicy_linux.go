//go:build linux

package device

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mbind applies MPOL_BIND to node on the mapping b. For a shared-memory
// file the policy is stored with the file, so it governs every later page
// allocation of the file whatever process faults it.
func mbind(b []byte, node int) error {
	if len(b) == 0 {
		return nil
	}
	if node < 0 || node >= maxNode {
		return fmt.Errorf("mbind: NUMA node %d out of range [0, %d): %w", node, maxNode, ErrInvalid)
	}
	mask := make([]uint64, node/64+1)
	mask[node/64] = 1 << (node % 64)
	// The kernel reads maxnode-1 bits (a historical off-by-one libnuma also
	// compensates for), hence the +1.
	_, _, errno := unix.Syscall6(unix.SYS_MBIND,
		uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), unix.MPOL_BIND,
		uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64+1), 0)
	runtime.KeepAlive(mask)
	switch errno {
	case 0:
		return nil
	case unix.ENOSYS:
		return &notSupportedError{feature: "mbind", reason: "the kernel was built without NUMA support (CONFIG_NUMA)"}
	case unix.EINVAL:
		return fmt.Errorf("mbind to NUMA node %d failed with EINVAL: the node does not exist, has no memory, or is outside this process's cpuset (see 'numactl -H' and /sys/devices/system/node): %w",
			node, ErrInvalid)
	default:
		return fmt.Errorf("mbind to NUMA node %d: %w", node, errno)
	}
}

// probeNode checks that memory can be bound to node, on a one-page
// anonymous mapping.
func probeNode(node int) error {
	b, err := unix.Mmap(-1, 0, int(pageSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("probe NUMA node %d: mmap: %w", node, err)
	}
	err = mbind(b, node)
	if uerr := unix.Munmap(b); uerr != nil && err == nil {
		err = fmt.Errorf("probe NUMA node %d: munmap: %w", node, uerr)
	}
	return err
}

// populate allocates every page of the mapping b, write-faulting them so
// that they are allocated now, under the mapping's policy.
func populate(b []byte, node int) error {
	err := unix.Madvise(b, unix.MADV_POPULATE_WRITE)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EINVAL):
		// Kernels before 5.14 lack MADV_POPULATE_WRITE: touch each page.
		return guardFault(fmt.Sprintf("allocate %d bytes on NUMA node %d", len(b), node), func() {
			for i := 0; i < len(b); i += int(pageSize) {
				b[i] = 0
			}
		})
	case errors.Is(err, unix.ENOMEM), errors.Is(err, unix.EFAULT):
		return fmt.Errorf("allocate %d bytes on NUMA node %d: %w; the node or the tmpfs is full: free memory there or use a smaller segment: %w",
			len(b), node, err, ErrNoSpace)
	default:
		return fmt.Errorf("allocate %d bytes on NUMA node %d: %w", len(b), node, err)
	}
}

// pagesOnNode counts the pages spanned by b per node with move_pages(2) in
// query mode (nodes == NULL).
func pagesOnNode(b []byte) (map[int]int, error) {
	pg := uintptr(pageSize)
	first := uintptr(unsafe.Pointer(&b[0]))
	start := first &^ (pg - 1)
	n := int((first + uintptr(len(b)) - start + pg - 1) / pg)
	const batch = 1 << 12
	pages := make([]uintptr, min(n, batch))
	status := make([]int32, len(pages))
	counts := make(map[int]int)
	for done := 0; done < n; done += len(pages) {
		k := min(n-done, len(pages))
		for i := range k {
			pages[i] = start + uintptr(done+i)*pg
		}
		_, _, errno := unix.Syscall6(unix.SYS_MOVE_PAGES, 0, uintptr(k),
			uintptr(unsafe.Pointer(&pages[0])), 0, uintptr(unsafe.Pointer(&status[0])), 0)
		switch errno {
		case 0:
		case unix.ENOSYS:
			return nil, &notSupportedError{feature: "move_pages", reason: "the kernel was built without NUMA support (CONFIG_NUMA)"}
		default:
			return nil, fmt.Errorf("device: move_pages query of %d pages at %#x: %w", k, pages[0], errno)
		}
		for _, s := range status[:k] {
			if s < 0 {
				counts[NotResident]++
			} else {
				counts[int(s)]++
			}
		}
	}
	runtime.KeepAlive(b)
	return counts, nil
}
