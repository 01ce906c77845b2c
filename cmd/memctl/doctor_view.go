package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// printDoctor writes the report for a person: the host, then poold, then
// the problems with their fixes.
func printDoctor(out io.Writer, r *doctorReport) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "Host (sysfs %s)\n", r.Sysfs)
	list := func(label string, items []string) {
		if len(items) == 0 {
			fmt.Fprintf(w, "  %s\tnone\n", label)
			return
		}
		for i, it := range items {
			if i > 0 {
				label = ""
			}
			fmt.Fprintf(w, "  %s\t%s\n", label, it)
		}
	}
	list("CXL memdevs", r.Memdevs)
	list("CXL regions", r.Regions)
	var dax []string
	for _, d := range r.Dax {
		s := fmt.Sprintf("%s: %s, %s, node %d", d.Name, d.Mode, human(int64(d.Size)), d.Node)
		if d.Region != "" {
			s += ", " + d.Region
		}
		dax = append(dax, s+usedText(d.Used, r.Pool.Reachable))
	}
	list("DAX devices", dax)
	var nodes []string
	for _, n := range r.Nodes {
		kind := "CPUs and memory"
		if !n.CPUs {
			kind = "memory only (far memory)"
		}
		s := fmt.Sprintf("node%d: %s, %s free of %s, memory_tier%d", n.ID, kind, human(int64(n.MemFree)), human(int64(n.MemTotal)), n.MemoryTier)
		if n.HMATReadNs > 0 {
			s += fmt.Sprintf(", hmat read %s", time.Duration(n.HMATReadNs))
			if n.Measured > 0 {
				s += fmt.Sprintf(" vs measured %s (%+.0f%%)", time.Duration(n.Measured), 100*(float64(n.Measured)-float64(n.HMATReadNs))/float64(n.HMATReadNs))
			}
		} else if n.Measured > 0 {
			s += fmt.Sprintf(", measured read %s (no hmat)", time.Duration(n.Measured))
		}
		if !n.CPUs {
			s += usedText(n.Used, r.Pool.Reachable)
		}
		nodes = append(nodes, s)
	}
	list("NUMA nodes", nodes)
	list("Huge pages", lines(r.HugePages))
	list("RDMA ports", lines(r.RDMA))
	list("Interfaces", lines(r.Netdevs))
	var shm []string
	for _, d := range r.Shm {
		shm = append(shm, shmLine(d))
	}
	list("Shared memory", shm)

	fmt.Fprintln(w, "poold")
	if !r.Pool.Reachable {
		fmt.Fprintf(w, "  not reachable\t%s\n", r.Pool.Error)
	} else {
		list("tiers", r.Pool.TierLines)
		if r.Pool.Transport != "" || r.Pool.TransportReason != "" {
			fmt.Fprintf(w, "  rdma transport\t%s: %s\n", orUnknown(r.Pool.Transport), r.Pool.TransportReason)
		}
	}
	w.Flush()
	for _, n := range r.Notes {
		fmt.Fprintf(out, "note: %s\n", n)
	}
	if len(r.Problems) == 0 {
		fmt.Fprintln(out, "No problems found.")
		return
	}
	fmt.Fprintf(out, "Problems (%d):\n", len(r.Problems))
	for _, p := range r.Problems {
		fmt.Fprintf(out, "  - %s\n      fix: %s\n", p.What, strings.ReplaceAll(p.Fix, "\n", "\n           "))
	}
}

// usedText says whether poold serves a device, when that is known.
func usedText(tier string, known bool) string {
	switch {
	case !known:
		return ""
	case tier == "":
		return " — not used by poold"
	}
	return " — poold's " + tier + " tier"
}

// lines prints each of xs on its own line.
func lines[T fmt.Stringer](xs []T) []string {
	out := make([]string, len(xs))
	for i, x := range xs {
		out[i] = x.String()
	}
	return out
}

func (h doctorHuge) String() string {
	return fmt.Sprintf("%s: %d reserved, %d free", h.Size, h.Total, h.Free)
}

func (p doctorPort) String() string {
	s := fmt.Sprintf("%s port %d: %s %s (%s), driver %s", p.Device, p.Port, p.Transport, p.State, p.PhysState, p.Driver)
	if p.Netdev != "" {
		s += " on " + p.Netdev
	}
	if p.Rate != "" {
		s += ", " + p.Rate
	}
	return s
}

func (n doctorNetdev) String() string {
	return fmt.Sprintf("%s (%s): %s", n.Name, n.Driver, n.OperState)
}
