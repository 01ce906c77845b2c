package cxl

import "strings"

// daxDevices is where the dax bus lists its devices, relative to the root.
const daxDevices = "bus/dax/devices"

// DaxMode is how a DAX device is used, decided by the driver bound to it.
type DaxMode string

// The DAX modes, named as daxctl names them.
const (
	// DaxDevdax is a device bound to device_dax: a character device
	// /dev/daxX.Y to mmap at its alignment.
	DaxDevdax DaxMode = "devdax"
	// DaxSystemRAM is a device bound to kmem: its memory is onlined as
	// system RAM of NUMA node TargetNode.
	DaxSystemRAM DaxMode = "system-ram"
	// DaxUnbound is a device with no driver bound.
	DaxUnbound DaxMode = "unbound"
	// DaxUnknown is a device bound to a driver this package does not know;
	// see DaxDevice.Driver.
	DaxUnknown DaxMode = "unknown"
)

// DaxDevice is one DAX device, /bus/dax/devices/daxX.Y. Plain value; safe
// for concurrent reads.
type DaxDevice struct {
	// Name is the kernel's name, "dax0.0".
	Name string
	// Path is the device directory relative to the sysfs root, symlinks
	// resolved.
	Path string
	// DevPath is the character device to map, "/dev/dax0.0", on the host
	// the tree describes; set only in devdax mode, where it exists.
	DevPath string
	// Size is the device's size in bytes.
	Size uint64
	// Align is the mapping alignment in bytes; 0 on kernels before 5.10.
	Align uint64
	// Resource is the host physical address of the first range; 0 when the
	// file is absent.
	Resource uint64
	// NumaNode is the device's numa_node: its closest CPU node; -1 unknown.
	NumaNode int
	// TargetNode is the NUMA node the memory is (system-ram) or would be
	// (devdax) onlined as, from target_node, else numa_node; -1 unknown.
	TargetNode int
	// Mode is devdax, system-ram, unbound or unknown, from the driver link.
	Mode DaxMode
	// Driver is the bound driver's name ("device_dax", "kmem"); empty
	// when unbound.
	Driver string
	// Region is the CXL region that holds the device, "region0": for a ram
	// region the one it lies under (through its dax_regionN), for a pmem
	// region (whose namespaces are reached via libnvdimm) the one whose
	// host physical range holds its resource; empty for other DAX devices
	// (hmem, plain NVDIMM namespaces).
	Region string
	// Persistent reports memory the kernel presents as persistent, whose
	// contents outlive a power loss: a device in a pmem CXL region, or any
	// device below libnvdimm (a pmem namespace, its path under ndbusN).
	// False for a ram region's devices and other DAX devices (hmem).
	Persistent bool
}

// daxDevices reads the dax bus; regionPaths maps each CXL region to its
// resolved path, so a device below it is attributed to it.
func (w *walker) daxDevices(regionPaths map[string]string) []DaxDevice {
	var out []DaxDevice
	for _, e := range w.list(w.path(daxDevices), "dax") {
		if len(e.key) != 2 {
			continue
		}
		rel, ok := w.resolve(w.path(daxDevices, e.name))
		if !ok {
			continue
		}
		// Attributes are read, and problems named, by the bus path the ABI
		// documents; Path keeps where the link leads.
		dev := daxDevices + "/" + e.name
		d := DaxDevice{
			Name:     e.name,
			Path:     rel,
			Size:     w.size(w.path(dev, "size"), true),
			Align:    w.size(w.path(dev, "align"), false),
			Resource: w.size(w.path(dev, "resource"), false),
			NumaNode: w.signed(w.path(dev, "numa_node"), false, "a NUMA node number", -1),
		}
		d.TargetNode = w.signed(w.path(dev, "target_node"), false, "a NUMA node number", d.NumaNode)
		d.Driver, _ = w.linkBase(w.path(dev, "driver"))
		switch d.Driver {
		case "device_dax":
			d.Mode = DaxDevdax
			d.DevPath = "/dev/" + e.name
		case "kmem":
			d.Mode = DaxSystemRAM
		case "":
			d.Mode = DaxUnbound
		default:
			d.Mode = DaxUnknown
		}
		best := ""
		for name, rp := range regionPaths {
			if strings.HasPrefix(rel, rp+"/") && len(rp) > len(best) {
				d.Region, best = name, rp
			}
		}
		out = append(out, d)
	}
	return out
}
