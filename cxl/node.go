package cxl

import (
	"strconv"
	"time"
)

// nodeDir and tierDir are where nodes and memory tiers live, relative to
// the root.
const (
	nodeDir = "devices/system/node"
	tierDir = "devices/virtual/memory_tiering"
)

// Node is one NUMA node, /devices/system/node/nodeN. Plain value; safe for
// concurrent reads.
type Node struct {
	// ID is the node number N.
	ID int
	// CPUs are the node's CPUs from cpulist; nil for a memory-only node.
	CPUs []int
	// MemTotal is the node's memory in bytes (meminfo MemTotal).
	MemTotal uint64
	// MemFree is the node's free memory in bytes (meminfo MemFree).
	MemFree uint64
	// Distance is the node's SLIT row: Distance[i] is the distance to the
	// i-th online node, in ascending node order (10 is local).
	Distance []int
	// HMAT holds the access class 0 performance attributes; nil when the
	// platform reports none.
	HMAT *HMAT
	// MemoryTier is the N of the memory_tierN listing this node (a larger
	// N is a slower tier); -1 when the kernel has no memory tiering.
	MemoryTier int
}

// Far reports whether the node is far memory: it has memory and no CPUs, as
// a CXL device onlined through kmem appears.
func (n Node) Far() bool { return n.MemTotal > 0 && len(n.CPUs) == 0 }

// HMAT is a node's performance as seen from its best ("access class 0")
// initiators, from nodeN/access0/initiators/ (ACPI HMAT, or CXL CDAT on
// newer kernels). Zero means the platform did not report that attribute.
// Plain value; safe for concurrent reads.
type HMAT struct {
	// Initiators are the nodes the numbers apply to, from the nodeM
	// links in access0/initiators.
	Initiators []int
	// ReadLatency and WriteLatency are the rated access latencies.
	ReadLatency, WriteLatency time.Duration
	// ReadBandwidth and WriteBandwidth are in MB/s (MiB/s per numaperf.rst).
	ReadBandwidth, WriteBandwidth uint64
}

func (w *walker) nodes() []Node {
	tiers := w.memoryTiers()
	var out []Node
	for _, e := range w.list(w.path(nodeDir), "node") {
		if len(e.key) != 1 {
			continue
		}
		rel := nodeDir + "/" + e.name
		n := Node{ID: e.key[0], MemoryTier: -1}
		if tier, ok := tiers[n.ID]; ok {
			n.MemoryTier = tier
		}
		if s, ok := w.read(w.path(rel, "cpulist"), true); ok {
			cpus, err := ParseCPUList(s)
			if err != nil {
				w.addParse(w.path(rel, "cpulist"), err)
			}
			n.CPUs = cpus
		}
		n.MemTotal, n.MemFree = w.meminfo(w.path(rel, "meminfo"), n.ID)
		if s, ok := w.read(w.path(rel, "distance"), true); ok {
			d, err := ParseDistance(s)
			if err != nil {
				w.addParse(w.path(rel, "distance"), err)
			}
			n.Distance = d
		}
		n.HMAT = w.hmat(rel + "/access0/initiators")
		out = append(out, n)
	}
	return out
}

// meminfo returns MemTotal and MemFree in bytes from the node's meminfo.
func (w *walker) meminfo(p string, id int) (total, free uint64) {
	s, ok := w.read(p, true)
	if !ok {
		return 0, 0
	}
	m, err := ParseMeminfo(s)
	if err != nil {
		w.addParse(p, err)
		return 0, 0
	}
	if m.Node != id {
		w.addParse(p, malformed("Node "+strconv.Itoa(m.Node), "describes node "+strconv.Itoa(m.Node)+" but lies under node"+strconv.Itoa(id)))
		return 0, 0
	}
	total, okT := m.Fields["MemTotal"]
	free, okF := m.Fields["MemFree"]
	if !okT || !okF {
		w.addParse(p, malformed(s, "no MemTotal or no MemFree line"))
		return 0, 0
	}
	return total, free
}

// hmat reads access0/initiators; nil when the directory is absent.
func (w *walker) hmat(rel string) *HMAT {
	dir := w.path(rel)
	inits := w.list(dir, "node")
	h := &HMAT{
		ReadLatency:    time.Duration(w.decimal(w.path(rel, "read_latency"), false, "a latency in ns")),
		WriteLatency:   time.Duration(w.decimal(w.path(rel, "write_latency"), false, "a latency in ns")),
		ReadBandwidth:  w.decimal(w.path(rel, "read_bandwidth"), false, "a bandwidth in MB/s"),
		WriteBandwidth: w.decimal(w.path(rel, "write_bandwidth"), false, "a bandwidth in MB/s"),
	}
	for _, e := range inits {
		if len(e.key) == 1 {
			h.Initiators = append(h.Initiators, e.key[0])
		}
	}
	if h.Initiators == nil && h.ReadLatency == 0 && h.WriteLatency == 0 &&
		h.ReadBandwidth == 0 && h.WriteBandwidth == 0 {
		return nil
	}
	return h
}

// memoryTiers maps node number to memory tier from memory_tierN/nodelist.
func (w *walker) memoryTiers() map[int]int {
	out := make(map[int]int)
	for _, e := range w.list(w.path(tierDir), "memory_tier") {
		if len(e.key) != 1 {
			continue
		}
		p := w.path(tierDir, e.name, "nodelist")
		s, ok := w.read(p, true)
		if !ok {
			continue
		}
		nodes, err := ParseCPUList(s)
		if err != nil {
			w.addParse(p, err)
			continue
		}
		for _, n := range nodes {
			out[n] = e.key[0]
		}
	}
	return out
}
