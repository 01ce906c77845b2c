package cxl

import (
	"errors"
	"strings"
)

// Inventory is what one Discover call found. It is a plain value owned by
// the caller: safe for concurrent reads, not for concurrent mutation. Slices
// are sorted by the numbers in the kernel's names (mem2 before mem10).
type Inventory struct {
	// Memdevs are the CXL memory devices, /bus/cxl/devices/memN.
	Memdevs []Memdev
	// Regions are the CXL regions, /bus/cxl/devices/regionN.
	Regions []Region
	// Decoders are the CXL HDM decoders, /bus/cxl/devices/decoderX.Y: root
	// (platform windows), switch (host bridges, switches) and endpoint.
	Decoders []Decoder
	// Dax are the DAX devices, /bus/dax/devices/daxX.Y, CXL-backed or not.
	Dax []DaxDevice
	// Nodes are the NUMA nodes, /devices/system/node/nodeN.
	Nodes []Node
	// Problems lists, in the order met, every file that was missing,
	// unreadable, malformed or a dangling link; each is an *AttrError naming
	// the path. Empty on a healthy tree.
	Problems []error
}

// Discover reads the whole tree. Problems with individual files are collected
// in Inventory.Problems rather than failing the call; only an unusable root
// is an error (matching ErrNoSysfs).
func (fsys FS) Discover() (*Inventory, error) {
	if err := checkRoot(fsys.root); err != nil {
		return nil, err
	}
	w := newWalker(fsys.root)
	inv := &Inventory{}
	endpoints := w.endpoints()
	inv.Memdevs = w.memdevs(endpoints)
	inv.Decoders = w.decoders(endpoints)
	var regionPaths map[string]string
	inv.Regions, regionPaths = w.regions(inv.Decoders)
	inv.Dax = w.daxDevices(regionPaths)
	inv.Nodes = w.nodes()
	link(inv)
	inv.Problems = w.problems
	return inv, nil
}

// link fills in the cross references that need more than one kind of object:
// a region's dax devices, a decoder's region, a region's mode on kernels
// older than 6.3 (taken from its endpoint decoders), whether a dax device
// is persistent memory.
func link(inv *Inventory) {
	// A pmem region's dax devices sit below libnvdimm, not below the
	// region; their host physical address says which region holds them.
	for i := range inv.Dax {
		dax := &inv.Dax[i]
		for _, r := range inv.Regions {
			if dax.Region == "" && dax.Resource != 0 && r.Size != 0 &&
				dax.Resource >= r.Resource && dax.Resource-r.Resource < r.Size {
				dax.Region = r.Name
			}
		}
	}
	decoderIdx := make(map[string]int, len(inv.Decoders))
	for i, d := range inv.Decoders {
		decoderIdx[d.Name] = i
	}
	for i := range inv.Regions {
		r := &inv.Regions[i]
		for _, dax := range inv.Dax {
			if dax.Region == r.Name {
				r.Dax = append(r.Dax, dax.Name)
			}
		}
		for _, t := range r.Targets {
			j, ok := decoderIdx[t.Decoder]
			if !ok {
				continue
			}
			inv.Decoders[j].Region = r.Name
			if r.Mode == "" {
				r.Mode = inv.Decoders[j].Mode
			}
		}
		// Committed switch decoders are programmed to exactly the region's
		// host physical range; HPA ranges are unique, so equality identifies
		// the region. Root decoders may hold many regions: see RootDecoder.
		for j := range inv.Decoders {
			d := &inv.Decoders[j]
			if d.Region == "" && d.Kind != DecoderRoot && d.Size != 0 && r.Size != 0 &&
				d.Start == r.Resource && d.Size == r.Size {
				d.Region = r.Name
			}
		}
	}
	modes := make(map[string]MemMode, len(inv.Regions))
	for _, r := range inv.Regions {
		modes[r.Name] = r.Mode
	}
	for i := range inv.Dax {
		dax := &inv.Dax[i]
		dax.Persistent = modes[dax.Region] == ModePMEM || underNVDIMM(dax.Path)
	}
}

// underNVDIMM reports whether a device path lies below a libnvdimm bus
// (ndbusN), where only persistent memory namespaces live.
func underNVDIMM(path string) bool {
	for elem := range strings.SplitSeq(path, "/") {
		if strings.HasPrefix(elem, "ndbus") {
			return true
		}
	}
	return false
}

// Err joins the problems into one error, nil when there are none.
func (inv *Inventory) Err() error { return errors.Join(inv.Problems...) }

// FarNodes returns the nodes that are far memory: memory and no CPUs, as a
// CXL device onlined through kmem appears.
func (inv *Inventory) FarNodes() []Node {
	var out []Node
	for _, n := range inv.Nodes {
		if n.Far() {
			out = append(out, n)
		}
	}
	return out
}

// DevdaxDevices returns the DAX devices bound to device_dax, the ones with a
// /dev/daxX.Y character device to map.
func (inv *Inventory) DevdaxDevices() []DaxDevice {
	var out []DaxDevice
	for _, d := range inv.Dax {
		if d.Mode == DaxDevdax {
			out = append(out, d)
		}
	}
	return out
}
