package cxl

import "strings"

// Region is one CXL region, /bus/cxl/devices/regionZ: a range of host
// physical address space interleaved over one or more memdevs. Plain value;
// safe for concurrent reads.
type Region struct {
	// Name is the kernel's name, "region0".
	Name string
	// Path is the device directory relative to the sysfs root, symlinks
	// resolved; it lies under the root decoder's directory.
	Path string
	// RootDecoder is the root decoder (platform window) the region was
	// carved from, "decoder0.0".
	RootDecoder string
	// Mode is ram or pmem. Kernels before 6.3 have no regionZ/mode; the
	// mode is then taken from the region's endpoint decoders.
	Mode MemMode
	// Size is the region's size in bytes.
	Size uint64
	// Resource is the region's base host physical address; 2^64-1 when no
	// address space is allocated yet.
	Resource uint64
	// InterleaveWays is the number of memdevs the region spans.
	InterleaveWays int
	// InterleaveGranularity is the bytes each memdev claims in turn.
	InterleaveGranularity int
	// UUID identifies a pmem region; empty for ram regions.
	UUID string
	// Committed reports that the region decodes in hardware (commit is 1).
	Committed bool
	// Targets are the endpoint decoders in interleave order.
	Targets []RegionTarget
	// Dax are the DAX devices backed by the region ("dax0.0"), found under
	// its dax_regionN.
	Dax []string
}

// RegionTarget is one interleave position of a region. Plain value.
type RegionTarget struct {
	// Position is the N of regionZ/targetN.
	Position int
	// Decoder is the endpoint decoder at that position, "decoder2.0".
	Decoder string
	// Memdev is the memdev behind that decoder, "mem0"; empty when the
	// decoder was not found.
	Memdev string
}

// regions reads the regions and returns, besides them, each region's
// resolved path, used to tell which dax devices lie below it.
func (w *walker) regions(decoders []Decoder) ([]Region, map[string]string) {
	memdevOf := make(map[string]string, len(decoders))
	for _, d := range decoders {
		memdevOf[d.Name] = d.Memdev
	}
	var out []Region
	paths := make(map[string]string)
	for _, e := range w.list(w.path(cxlDevices), "region") {
		if len(e.key) != 1 {
			continue
		}
		rel, ok := w.resolve(w.path(cxlDevices, e.name))
		if !ok {
			continue
		}
		// Attributes are read, and problems named, by the bus path the ABI
		// documents; Path keeps where the link leads.
		dev := cxlDevices + "/" + e.name
		paths[e.name] = rel
		r := Region{
			Name:                  e.name,
			Path:                  rel,
			Size:                  w.size(w.path(dev, "size"), true),
			Resource:              w.size(w.path(dev, "resource"), true),
			InterleaveWays:        w.smallInt(w.path(dev, "interleave_ways"), true, "interleave ways"),
			InterleaveGranularity: w.smallInt(w.path(dev, "interleave_granularity"), true, "interleave granularity"),
		}
		if parent := parentName(rel); strings.HasPrefix(parent, "decoder") {
			r.RootDecoder = parent
		}
		if m, ok := w.read(w.path(dev, "mode"), false); ok {
			r.Mode = MemMode(m)
		}
		if u, ok := w.read(w.path(dev, "uuid"), false); ok {
			r.UUID = u
		}
		if c, ok := w.read(w.path(dev, "commit"), false); ok {
			switch c {
			case "1":
				r.Committed = true
			case "0":
			default:
				w.addParse(w.path(dev, "commit"), malformed(c, "want 0 or 1"))
			}
		}
		for _, t := range w.list(w.path(dev), "target") {
			if len(t.key) != 1 {
				continue
			}
			dec, ok := w.read(w.path(dev, t.name), false)
			if !ok || dec == "" {
				continue // an unprogrammed position reads as empty
			}
			if _, ok := numberedName(dec, "decoder"); !ok {
				w.addParse(w.path(dev, t.name), malformed(dec, "want an endpoint decoder name such as decoder2.0"))
				continue
			}
			r.Targets = append(r.Targets, RegionTarget{Position: t.key[0], Decoder: dec, Memdev: memdevOf[dec]})
		}
		out = append(out, r)
	}
	return out, paths
}
