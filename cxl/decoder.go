package cxl

import "strings"

// MemMode is the partition a CXL decoder or region maps, as the kernel
// prints it in decoderX.Y/mode and regionZ/mode. Values other than the
// constants (from newer kernels) are kept as read.
type MemMode string

// The modes sysfs-bus-cxl documents.
const (
	// ModeRAM is volatile capacity.
	ModeRAM MemMode = "ram"
	// ModePMEM is persistent capacity.
	ModePMEM MemMode = "pmem"
	// ModeMixed is an error case: a decoder straddling both partitions.
	ModeMixed MemMode = "mixed"
	// ModeNone is a decoder with no DPA allocated.
	ModeNone MemMode = "none"
)

// DecoderKind says where in the CXL hierarchy a decoder sits, from its
// devtype.
type DecoderKind string

// The decoder kinds.
const (
	// DecoderRoot is a platform CXL fixed memory window (devtype
	// cxl_decoder_root); its range is fixed by firmware.
	DecoderRoot DecoderKind = "root"
	// DecoderSwitch is a host bridge or switch HDM decoder
	// (cxl_decoder_switch).
	DecoderSwitch DecoderKind = "switch"
	// DecoderEndpoint is a memdev's HDM decoder (cxl_decoder_endpoint),
	// translating host physical addresses to device physical addresses.
	DecoderEndpoint DecoderKind = "endpoint"
)

// Decoder is one CXL HDM decoder, /bus/cxl/devices/decoderX.Y, where X is
// the owning port's number and Y the decoder's index in it. Plain value;
// safe for concurrent reads.
type Decoder struct {
	// Name is the kernel's name, "decoder2.0".
	Name string
	// Path is the device directory relative to the sysfs root, symlinks
	// resolved.
	Path string
	// Kind is root, switch or endpoint.
	Kind DecoderKind
	// Port is the port that owns the decoder: "root0", "port1", "endpoint2".
	Port string
	// Start is the base host physical address of the decode window (start).
	Start uint64
	// Size is the number of bytes the window decodes (size).
	Size uint64
	// Mode is the DPA partition an endpoint decoder maps; empty for root
	// and switch decoders.
	Mode MemMode
	// TargetType is "expander" (Type-3) or "accelerator" (Type-2); empty
	// when the file is absent.
	TargetType string
	// InterleaveWays is the number of targets the range is interleaved over.
	InterleaveWays int
	// InterleaveGranularity is the bytes claimed at one target before the
	// decode rotates to the next.
	InterleaveGranularity int
	// DPAResource is an endpoint decoder's device physical base address.
	DPAResource uint64
	// DPASize is the device physical bytes an endpoint decoder allocates.
	DPASize uint64
	// Memdev is the memory device behind an endpoint decoder's port.
	Memdev string
	// Region is the region the decoder decodes for: for an endpoint decoder
	// the region naming it as a target, for a switch decoder the region
	// with exactly its range. Empty when idle, and for root decoders, which
	// may hold many regions (see Region.RootDecoder).
	Region string
}

func (w *walker) decoders(endpoints map[string]string) []Decoder {
	var out []Decoder
	for _, e := range w.list(w.path(cxlDevices), "decoder") {
		if len(e.key) != 2 {
			continue
		}
		rel, ok := w.resolve(w.path(cxlDevices, e.name))
		if !ok {
			continue
		}
		// Attributes are read, and problems named, by the bus path the ABI
		// documents; Path keeps where the link leads.
		dev := cxlDevices + "/" + e.name
		d := Decoder{
			Name:                  e.name,
			Path:                  rel,
			Port:                  parentName(rel),
			Start:                 w.size(w.path(dev, "start"), true),
			Size:                  w.size(w.path(dev, "size"), true),
			InterleaveWays:        w.smallInt(w.path(dev, "interleave_ways"), false, "interleave ways"),
			InterleaveGranularity: w.smallInt(w.path(dev, "interleave_granularity"), false, "interleave granularity"),
		}
		d.Kind = decoderKind(w, dev, d.Port)
		if tt, ok := w.read(w.path(dev, "target_type"), false); ok {
			d.TargetType = tt
		}
		if d.Kind == DecoderEndpoint {
			if m, ok := w.read(w.path(dev, "mode"), false); ok {
				d.Mode = MemMode(m)
			}
			d.DPAResource = w.size(w.path(dev, "dpa_resource"), false)
			d.DPASize = w.size(w.path(dev, "dpa_size"), false)
			d.Memdev = endpoints[d.Port]
		}
		out = append(out, d)
	}
	return out
}

// decoderKind reads devtype, falling back to the owning port's name on trees
// without it.
func decoderKind(w *walker, dev, port string) DecoderKind {
	if dt, ok := w.read(w.path(dev, "devtype"), false); ok {
		if k, ok := strings.CutPrefix(dt, "cxl_decoder_"); ok && k != "" {
			return DecoderKind(k)
		}
	}
	switch {
	case strings.HasPrefix(port, "root"):
		return DecoderRoot
	case strings.HasPrefix(port, "endpoint"):
		return DecoderEndpoint
	default:
		return DecoderSwitch
	}
}
