package cxl

import (
	"math"
	"slices"
	"strconv"
	"strings"
)

// MaxListID is the largest CPU or node number ParseCPUList accepts. Linux
// caps CONFIG_NR_CPUS at 8192 and MAX_NUMNODES at 1024; the bound keeps a
// garbage range such as "0-4294967295" from allocating gigabytes.
const MaxListID = 1<<16 - 1

// maxDistance is the largest SLIT distance; ACPI stores distances in a byte.
const maxDistance = 255

// ParseCPUList parses the kernel's list format ("%*pbl"), as found in
// nodeN/cpulist and memory_tierN/nodelist: comma-separated decimal numbers
// and inclusive ranges, e.g. "0-3,8,10-11". Surrounding white space is
// ignored and an empty list (a memory-only node's cpulist) gives nil.
// The result is sorted and free of duplicates. Anything else — a backwards
// range, an empty element, a sign, a number above MaxListID — is an
// *AttrError matching ErrMalformed.
func ParseCPUList(s string) ([]int, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return nil, nil
	}
	type span struct{ lo, hi int }
	var spans []span
	for elem := range strings.SplitSeq(t, ",") {
		lo, hi, isRange := strings.Cut(elem, "-")
		a, err := listID(lo)
		if err != "" {
			return nil, malformed(s, "element "+strconv.Quote(elem)+": "+err)
		}
		b := a
		if isRange {
			if b, err = listID(hi); err != "" {
				return nil, malformed(s, "element "+strconv.Quote(elem)+": "+err)
			}
			if b < a {
				return nil, malformed(s, "range "+strconv.Quote(elem)+" runs backwards")
			}
		}
		spans = append(spans, span{a, b})
	}
	// Merge before expanding so overlapping ranges cost nothing extra.
	slices.SortFunc(spans, func(x, y span) int { return x.lo - y.lo })
	merged := spans[:1]
	for _, sp := range spans[1:] {
		last := &merged[len(merged)-1]
		if sp.lo <= last.hi+1 {
			last.hi = max(last.hi, sp.hi)
			continue
		}
		merged = append(merged, sp)
	}
	n := 0
	for _, sp := range merged {
		n += sp.hi - sp.lo + 1
	}
	out := make([]int, 0, n)
	for _, sp := range merged {
		for id := sp.lo; id <= sp.hi; id++ {
			out = append(out, id)
		}
	}
	return out, nil
}

// listID parses one number of a list; the string result is a reason, empty
// on success.
func listID(s string) (int, string) {
	if s == "" {
		return 0, "empty number"
	}
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, strconv.Quote(s) + " is not a decimal number"
	}
	if v > MaxListID {
		return 0, s + " is above " + strconv.Itoa(MaxListID)
	}
	return int(v), ""
}

// ParseSize parses a byte count or address as the kernel prints them in
// sysfs: hexadecimal with a 0x prefix ("0x10000000", from "%#llx": CXL sizes,
// starts and resources) or decimal ("268435456", from "%llu": DAX sizes and
// alignments). Surrounding white space is ignored. A sign, an empty value,
// other bases or a value above 2^64-1 is an *AttrError matching ErrMalformed.
func ParseSize(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	if t == "" {
		return 0, malformed(s, "empty; want a byte count in hex (0x...) or decimal")
	}
	digits, base := t, 10
	if len(t) > 2 && t[0] == '0' && (t[1] == 'x' || t[1] == 'X') {
		digits, base = t[2:], 16
	}
	v, err := strconv.ParseUint(digits, base, 64)
	if err != nil {
		return 0, malformed(s, "want a byte count in hex (0x...) or decimal below 2^64")
	}
	return v, nil
}

// parseDecimal parses an unsigned decimal attribute (latency, bandwidth,
// interleave ways); what names the attribute in the reason.
func parseDecimal(s, what string) (uint64, error) {
	t := strings.TrimSpace(s)
	v, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, malformed(s, "want "+what+" as an unsigned decimal number")
	}
	return v, nil
}

// parseInt parses a signed decimal attribute such as numa_node, which is -1
// when the platform gives no affinity.
func parseInt(s, what string) (int, error) {
	t := strings.TrimSpace(s)
	v, err := strconv.ParseInt(t, 10, 32)
	if err != nil {
		return 0, malformed(s, "want "+what+" as a decimal number")
	}
	return int(v), nil
}

// ParseDistance parses one row of the SLIT as nodeN/distance prints it:
// decimal distances separated by spaces, e.g. "10 20". An empty row, a
// non-number or a distance above 255 is an *AttrError matching ErrMalformed.
func ParseDistance(s string) ([]int, error) {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return nil, malformed(s, "empty; want one distance per node, e.g. \"10 20\"")
	}
	out := make([]int, 0, len(fields))
	for _, f := range fields {
		v, err := strconv.ParseUint(f, 10, 8)
		if err != nil || v > maxDistance {
			return nil, malformed(s, strconv.Quote(f)+" is not a distance between 0 and 255")
		}
		out = append(out, int(v))
	}
	return out, nil
}

// Meminfo is one parsed nodeN/meminfo file. It is a plain value owned by the
// caller; not safe for concurrent mutation.
type Meminfo struct {
	// Node is the node number every line names ("Node 1 MemTotal: ...").
	Node int
	// Fields maps each key ("MemTotal", "Active(anon)", "HugePages_Total")
	// to its value: in bytes for lines with a kB unit, as printed otherwise
	// (page counts).
	Fields map[string]uint64
}

// ParseMeminfo parses a nodeN/meminfo file, lines of the form
// "Node 0 MemTotal:        3892984 kB" or "Node 0 HugePages_Total:     0".
// Values with a kB unit are converted to bytes. Blank lines are skipped. A
// line of another shape, lines naming different nodes, a repeated key, a unit
// other than kB, a value that overflows 64 bits in bytes, or no lines at all
// is an *AttrError matching ErrMalformed.
func ParseMeminfo(s string) (Meminfo, error) {
	m := Meminfo{Node: -1, Fields: make(map[string]uint64)}
	for line := range strings.Lines(s) {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		bad := func(reason string) (Meminfo, error) {
			return Meminfo{}, malformed(line, reason)
		}
		if len(f) < 4 || len(f) > 5 || f[0] != "Node" {
			return bad("want \"Node <n> <Key>: <value> [kB]\"")
		}
		node, err := strconv.ParseUint(f[1], 10, 31)
		if err != nil {
			return bad("node " + strconv.Quote(f[1]) + " is not a node number")
		}
		if m.Node >= 0 && int(node) != m.Node {
			return bad("names node " + f[1] + " after node " + strconv.Itoa(m.Node))
		}
		m.Node = int(node)
		key, ok := strings.CutSuffix(f[2], ":")
		if !ok || key == "" || strings.Contains(key, ":") {
			return bad("key " + strconv.Quote(f[2]) + " is not \"<Key>:\"")
		}
		if _, dup := m.Fields[key]; dup {
			return bad("key " + key + " appears twice")
		}
		v, err := strconv.ParseUint(f[3], 10, 64)
		if err != nil {
			return bad("value " + strconv.Quote(f[3]) + " is not an unsigned decimal number")
		}
		if len(f) == 5 {
			if f[4] != "kB" {
				return bad("unit " + strconv.Quote(f[4]) + " is not kB")
			}
			if v > math.MaxUint64/1024 {
				return bad("value " + f[3] + " kB overflows 64 bits in bytes")
			}
			v *= 1024
		}
		m.Fields[key] = v
	}
	if m.Node < 0 {
		return Meminfo{}, malformed(s, "no \"Node <n> <Key>: <value>\" lines")
	}
	return m, nil
}
