package cxl

// cxlDevices is where the cxl bus lists its devices, relative to the root.
const cxlDevices = "bus/cxl/devices"

// Memdev is one CXL memory device, /bus/cxl/devices/memN: a Type-3 memory
// expander as the kernel's cxl_mem driver sees it. Plain value; safe for
// concurrent reads.
type Memdev struct {
	// Name is the kernel's name, "mem0".
	Name string
	// Path is the device directory relative to the sysfs root with symlinks
	// resolved, e.g. "devices/pci0000:0c/0000:0c:00.0/0000:0d:00.0/mem0".
	Path string
	// Host is the parent device, usually the PCI function ("0000:0d:00.0");
	// what 'cxl list' calls host.
	Host string
	// Endpoint is the CXL endpoint port whose uport is this memdev
	// ("endpoint2"); empty when the memdev is not enabled.
	Endpoint string
	// RAMSize is the volatile capacity in bytes (ram/size); 0 when the
	// device has none or the file is absent.
	RAMSize uint64
	// PMEMSize is the persistent capacity in bytes (pmem/size); 0 when the
	// device has none or the file is absent.
	PMEMSize uint64
	// Serial is the PCIe device serial number; 0 when the file is absent.
	Serial uint64
	// NumaNode is the CPU node the device is affine to; -1 when unknown.
	NumaNode int
	// FirmwareVersion is the Identify "FW Revision" string; empty when
	// the file is absent.
	FirmwareVersion string
}

// endpoints maps each endpoint port name to the memdev its uport link names.
func (w *walker) endpoints() map[string]string {
	out := make(map[string]string)
	for _, e := range w.list(w.path(cxlDevices), "endpoint") {
		if mem, ok := w.linkBase(w.path(cxlDevices, e.name, "uport")); ok {
			out[e.name] = mem
		}
	}
	return out
}

func (w *walker) memdevs(endpoints map[string]string) []Memdev {
	byMemdev := make(map[string]string, len(endpoints))
	for ep, mem := range endpoints {
		byMemdev[mem] = ep
	}
	var out []Memdev
	for _, e := range w.list(w.path(cxlDevices), "mem") {
		rel, ok := w.resolve(w.path(cxlDevices, e.name))
		if !ok {
			continue
		}
		// Attributes are read, and problems named, by the bus path the ABI
		// documents; Path keeps where the link leads.
		dev := cxlDevices + "/" + e.name
		m := Memdev{
			Name:     e.name,
			Path:     rel,
			Host:     parentName(rel),
			Endpoint: byMemdev[e.name],
			// Optional: newer kernels hide the attribute for an absent
			// partition, and Type-2 devices have neither.
			RAMSize:  w.size(w.path(dev, "ram", "size"), false),
			PMEMSize: w.size(w.path(dev, "pmem", "size"), false),
			Serial:   w.size(w.path(dev, "serial"), false),
			NumaNode: w.signed(w.path(dev, "numa_node"), false, "a NUMA node number", -1),
		}
		if fw, ok := w.read(w.path(dev, "firmware_version"), false); ok {
			m.FirmwareVersion = fw
		}
		out = append(out, m)
	}
	return out
}
