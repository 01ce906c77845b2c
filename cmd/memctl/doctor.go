package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/cxl"
	"github.com/farmem/farmem/internal/paths"
	"github.com/farmem/farmem/internal/tier"
	"github.com/farmem/farmem/rdma/devices"
	"github.com/farmem/farmem/rdma/dialer"
)

// doctorTimeout bounds how long doctor waits for poold: it reports on the
// host either way, and says when the pool did not answer.
const doctorTimeout = 3 * time.Second

func newDoctorCmd(g *globals) *cobra.Command {
	var o doctorOptions
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Explain this host's far memory and RDMA setup, and how to fix what is wrong",
		Long: `Explain the host in one screen: CXL memdevs, regions, DAX devices and their
modes, memory-only NUMA nodes and their memory tiers, the firmware's HMAT
figures beside what poold measured, huge pages, RDMA devices (InfiniBand,
RoCE or iWARP as each reports it) with their port state, poold's
shared-memory directories (those no running poold uses, with the command
that removes them), and what poold uses, what it does not use and why. Each problem comes with the command that fixes
it. poold is asked over --socket (or --addr); when it does not answer, doctor
says so and reports on the host alone.`,
		Args: cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			switch o.daxMode {
			case "", string(cxl.DaxDevdax), string(cxl.DaxSystemRAM):
			default:
				return fmt.Errorf("--dax-mode %q: use devdax or system-ram", o.daxMode)
			}
			r := diagnose(g, o)
			if g.output == "json" {
				return g.printJSON(r)
			}
			printDoctor(g.out, r)
			return nil
		},
	}
	cmd.Flags().StringVar(&o.sysfs, "sysfs", "/sys", "where to read the kernel's view (sysfs root)")
	cmd.Flags().StringVar(&o.shmRoot, "shm-root", paths.ShmRoot, "where to look for poold's shared-memory directories (farmem-*): doctor lists those no running poold uses, with the command that removes them")
	cmd.Flags().StringVar(&o.daxMode, "dax-mode", "", "the mode you mean DAX devices to be in, devdax (poold maps /dev/daxX.Y) or system-ram (a memory-only NUMA node); doctor flags devices in the other mode")
	return cmd
}

// doctorOptions are doctor's own flags.
type doctorOptions struct {
	sysfs   string
	daxMode string
	shmRoot string
}

// doctorReport is what doctor found; -o json prints it as is.
type doctorReport struct {
	Sysfs     string         `json:"sysfs"`
	Memdevs   []string       `json:"cxl_memdevs"`
	Regions   []string       `json:"cxl_regions"`
	Dax       []doctorDax    `json:"dax_devices"`
	Nodes     []doctorNode   `json:"numa_nodes"`
	HugePages []doctorHuge   `json:"huge_pages"`
	RDMA      []doctorPort   `json:"rdma_ports"`
	Netdevs   []doctorNetdev `json:"netdevs"`
	Pool      doctorPool     `json:"poold"`
	Shm       []paths.ShmDir `json:"shm_dirs"`
	Problems  []doctorIssue  `json:"problems"`
	// Notes are facts worth knowing that need no fix.
	Notes []string `json:"notes"`
}

type doctorDax struct {
	Name   string `json:"name"`
	Mode   string `json:"mode"`
	Size   uint64 `json:"size"`
	Node   int    `json:"target_node"`
	Region string `json:"region,omitempty"`
	Used   string `json:"used_by_poold,omitempty"` // tier name, when poold serves it
}

type doctorNode struct {
	ID         int    `json:"id"`
	CPUs       bool   `json:"cpus"`
	MemTotal   uint64 `json:"mem_total"`
	MemFree    uint64 `json:"mem_free"`
	MemoryTier int    `json:"memory_tier"`
	HMATReadNs int64  `json:"hmat_read_latency_ns,omitempty"`
	Measured   int64  `json:"measured_read_latency_ns,omitempty"` // poold's p50 of the tier on this node
	Used       string `json:"used_by_poold,omitempty"`
}

type doctorHuge struct {
	Size  string `json:"size"` // e.g. 2048kB
	Total int64  `json:"total"`
	Free  int64  `json:"free"`
}

type doctorPort struct {
	Device    string `json:"device"`
	Driver    string `json:"driver"`
	Port      int    `json:"port"`
	Transport string `json:"transport"` // InfiniBand, RoCE, iWARP
	State     string `json:"state"`
	PhysState string `json:"phys_state"`
	Netdev    string `json:"netdev,omitempty"`
	Rate      string `json:"rate,omitempty"`
}

type doctorNetdev struct {
	Name      string `json:"name"`
	Driver    string `json:"driver"`
	OperState string `json:"operstate"`
}

type doctorPool struct {
	Reachable bool   `json:"reachable"`
	Error     string `json:"error,omitempty"`
	// Transport is what the rdma tier uses (tcp, verbs) and why.
	Transport       string             `json:"transport,omitempty"`
	TransportReason string             `json:"transport_reason,omitempty"`
	Tiers           []*poolv1.TierInfo `json:"-"`
	TierLines       []string           `json:"tiers,omitempty"`
}

// doctorIssue is one problem and the command that fixes it.
type doctorIssue struct {
	What string `json:"problem"`
	Fix  string `json:"fix"`
}

// diagnose gathers the host's view and poold's, then looks for problems.
func diagnose(g *globals, o doctorOptions) *doctorReport {
	r := &doctorReport{Sysfs: o.sysfs, Problems: []doctorIssue{}, Notes: []string{}}
	var inv *cxl.Inventory
	if fsys, err := cxl.NewFS(o.sysfs); err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("cannot read CXL, DAX and NUMA memory from %s: %v", o.sysfs, err))
	} else if inv, err = fsys.Discover(); err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("CXL discovery in %s failed: %v", o.sysfs, err))
		inv = nil
	}
	rinv, err := devices.Discover(o.sysfs)
	if err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("cannot read RDMA devices from %s: %v", o.sysfs, err))
		rinv = &devices.Inventory{}
	}
	r.askPool(g)
	if inv != nil {
		r.memory(inv, o)
	}
	r.hugePages(o.sysfs)
	r.rdma(rinv)
	r.poolChecks(rinv)
	r.shm(o.shmRoot)
	return r
}

// askPool asks poold for its tiers, with a short deadline.
func (r *doctorReport) askPool(g *globals) {
	pg := *g
	pg.timeout = min(g.timeout, doctorTimeout)
	var tiers []*poolv1.TierInfo
	var conflicts []*poolv1.NameConflict
	err := pg.call(func(ctx context.Context, c poolv1.PoolClient) error {
		resp, err := c.Tiers(ctx, &poolv1.TiersRequest{})
		if err != nil {
			return err
		}
		tiers = resp.Tiers
		nodes, err := c.Nodes(ctx, &poolv1.NodesRequest{})
		if err == nil {
			conflicts = nodes.NameConflicts
		}
		return err
	})
	if err != nil {
		r.Pool.Error = err.Error()
		r.Notes = append(r.Notes, "poold did not answer: nothing here is measured, and what poold uses is unknown")
		return
	}
	r.Pool.Reachable, r.Pool.Tiers = true, tiers
	for _, c := range conflicts {
		r.problem(conflictProblem(c))
	}
	for _, t := range tiers {
		line := fmt.Sprintf("%s: %s (%s) on %s, %s free of %s, read %s", tier.Name(t.Tier), t.Kind, strings.ToLower(reality(t.Emulated)),
			strings.Join(t.Devices, ","), human(t.Free), human(t.Capacity), readLatency(t))
		r.Pool.TierLines = append(r.Pool.TierLines, line)
		if t.Tier == poolv1.Tier_TIER_RDMA && r.Pool.Transport == "" {
			r.Pool.Transport = t.Transport
		}
	}
}

// usedBy returns the tier of poold's that serves device name, "" if none.
func (r *doctorReport) usedBy(name string) string {
	for _, t := range r.Pool.Tiers {
		if slices.Contains(t.Devices, name) {
			return tier.Name(t.Tier)
		}
	}
	return ""
}

// tierNote returns poold's note on the tier that lists device name.
func (r *doctorReport) tierNote(name string) string {
	for _, t := range r.Pool.Tiers {
		if slices.Contains(t.Devices, name) {
			return t.Note
		}
	}
	return ""
}

func (r *doctorReport) problem(what, fix string) {
	r.Problems = append(r.Problems, doctorIssue{What: what, Fix: fix})
}

// memory reports CXL devices, DAX modes, far nodes and their memory tiers.
func (r *doctorReport) memory(inv *cxl.Inventory, o doctorOptions) {
	for _, m := range inv.Memdevs {
		r.Memdevs = append(r.Memdevs, fmt.Sprintf("%s: %s ram, %s pmem, host %s", m.Name, human(int64(m.RAMSize)), human(int64(m.PMEMSize)), m.Host))
	}
	for _, g := range inv.Regions {
		r.Regions = append(r.Regions, fmt.Sprintf("%s: %s %s, %d-way, committed %v, dax %s", g.Name, g.Mode, human(int64(g.Size)), g.InterleaveWays, g.Committed, strings.Join(g.Dax, ",")))
	}
	for _, d := range inv.Dax {
		dd := doctorDax{Name: d.Name, Mode: string(d.Mode), Size: d.Size, Node: d.TargetNode, Region: d.Region}
		switch d.Mode {
		case cxl.DaxDevdax:
			dd.Used = r.usedBy(d.Name)
			if r.Pool.Reachable && dd.Used != "" && strings.Contains(r.tierNote(d.Name), "--allow-devdax-fd") {
				dd.Used = ""
				r.problem(fmt.Sprintf("poold found %s in devdax mode but does not hand it to clients (one descriptor reaches every segment on it)", d.Name),
					fmt.Sprintf("restart poold with --allow-devdax-fd, or use it as a NUMA node: daxctl reconfigure-device --mode=system-ram %s", d.Name))
			}
			if o.daxMode == string(cxl.DaxSystemRAM) {
				r.problem(fmt.Sprintf("%s is in devdax mode; you meant it as a NUMA node (system-ram)", d.Name),
					fmt.Sprintf("daxctl reconfigure-device --mode=system-ram %s", d.Name))
			}
		case cxl.DaxSystemRAM:
			dd.Used = r.usedBy(fmt.Sprintf("node%d", d.TargetNode))
			if o.daxMode == string(cxl.DaxDevdax) {
				r.problem(fmt.Sprintf("%s is in system-ram mode (NUMA node %d); you meant it as devdax", d.Name, d.TargetNode),
					fmt.Sprintf("daxctl reconfigure-device --mode=devdax %s", d.Name))
			}
		case cxl.DaxUnbound:
			mode := o.daxMode
			if mode == "" {
				mode = string(cxl.DaxDevdax)
			}
			r.problem(fmt.Sprintf("%s has no driver bound, so neither poold nor the kernel uses its %s", d.Name, human(int64(d.Size))),
				fmt.Sprintf("daxctl reconfigure-device --mode=%s %s", mode, d.Name))
		}
		r.Dax = append(r.Dax, dd)
	}
	dramTiers := map[int]bool{}
	for _, n := range inv.Nodes {
		if len(n.CPUs) > 0 && n.MemoryTier >= 0 {
			dramTiers[n.MemoryTier] = true
		}
	}
	for _, n := range inv.Nodes {
		dn := doctorNode{ID: n.ID, CPUs: len(n.CPUs) > 0, MemTotal: n.MemTotal, MemFree: n.MemFree, MemoryTier: n.MemoryTier}
		if n.HMAT != nil {
			dn.HMATReadNs = n.HMAT.ReadLatency.Nanoseconds()
		}
		if n.Far() {
			dn.Used = r.usedBy(fmt.Sprintf("node%d", n.ID))
			dn.Measured = r.measuredOn(n.ID)
			if dramTiers[n.MemoryTier] {
				fix := fmt.Sprintf("cat /sys/devices/virtual/memory_tiering/memory_tier%d/nodelist  # shows node %d beside DRAM; give the kernel the node's performance (enable HMAT in firmware, or a kernel >= 6.9 reads CXL CDAT), then re-online it: daxctl reconfigure-device --mode=devdax %[3]s && daxctl reconfigure-device --mode=system-ram %[3]s",
					n.MemoryTier, n.ID, daxOfNode(inv, n.ID))
				r.problem(fmt.Sprintf("far-memory node %d is in memory_tier%d with DRAM: the kernel cannot tell it from DRAM, so demotion and tiering treat it as local memory", n.ID, n.MemoryTier), fix)
			}
			if n.HMAT == nil {
				r.Notes = append(r.Notes, fmt.Sprintf("node %d has no HMAT attributes (access0/initiators): the firmware does not rate its latency", n.ID))
			}
			if r.Pool.Reachable && dn.Used == "" {
				r.problem(fmt.Sprintf("poold does not use far-memory node %d", n.ID), "systemctl restart poold && journalctl -u poold -n 50 | grep -i 'numa node'  # poold finds memory-only NUMA nodes at start; the log says why one is not usable")
			}
		}
		r.Nodes = append(r.Nodes, dn)
	}
}

// daxOfNode names the DAX device onlined as node id, "daxX.Y" if unknown.
func daxOfNode(inv *cxl.Inventory, id int) string {
	for _, d := range inv.Dax {
		if d.Mode == cxl.DaxSystemRAM && d.TargetNode == id {
			return d.Name
		}
	}
	return "daxX.Y"
}

// measuredOn is poold's measured p50 read latency of the tier on NUMA node
// id, 0 when not known.
func (r *doctorReport) measuredOn(id int) int64 {
	for _, t := range r.Pool.Tiers {
		if int(t.NumaNode) != id || !slices.Contains(t.Devices, fmt.Sprintf("node%d", id)) {
			continue
		}
		l := t.ReadLatency
		if l.GetSource() == "injected" {
			l = t.MeasuredReadLatency
		}
		if l.GetSource() == "measured" {
			return l.P50Ns
		}
	}
	return 0
}

// hugePages reads /kernel/mm/hugepages under the sysfs root.
func (r *doctorReport) hugePages(root string) {
	dir := filepath.Join(root, "kernel/mm/hugepages")
	es, err := os.ReadDir(dir)
	if err != nil {
		r.Notes = append(r.Notes, fmt.Sprintf("no huge page information at %s", dir))
		return
	}
	var total int64
	for _, e := range es {
		size, ok := strings.CutPrefix(e.Name(), "hugepages-")
		if !ok {
			continue
		}
		h := doctorHuge{Size: size, Total: readInt(filepath.Join(dir, e.Name(), "nr_hugepages")), Free: readInt(filepath.Join(dir, e.Name(), "free_hugepages"))}
		total += h.Total
		r.HugePages = append(r.HugePages, h)
	}
	if total == 0 {
		r.problem("no huge pages are reserved: an emulated CXL device on hugetlbfs (--emulate-dir) cannot be created, and mappings pay 4 KiB TLB misses",
			"sysctl -w vm.nr_hugepages=512  # 1 GiB of 2 MiB pages; make it permanent in /etc/sysctl.d/")
	}
}

func readInt(path string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n
}

// rdma reports RDMA ports and network interfaces, and their problems.
func (r *doctorReport) rdma(inv *devices.Inventory) {
	up := map[string]string{}
	var nics []devices.Netdev
	for _, n := range inv.Netdevs {
		up[n.Name] = n.OperState
		if n.Physical {
			r.Netdevs = append(r.Netdevs, doctorNetdev{Name: n.Name, Driver: n.Driver, OperState: n.OperState})
			nics = append(nics, n)
		}
	}
	for _, d := range inv.Devices {
		for _, p := range d.Ports {
			r.RDMA = append(r.RDMA, doctorPort{Device: d.Name, Driver: d.Driver, Port: p.Number, Transport: p.Transport,
				State: p.State, PhysState: p.PhysState, Netdev: p.Netdev, Rate: p.Rate})
			if p.Active() && p.NeedsRDMACM() {
				r.problem(fmt.Sprintf("RDMA port %s/%d is iWARP, which poold's verbs backend cannot use: iWARP connects queue pairs through RDMA-CM (librdmacm), and the backend connects them itself, as InfiniBand and RoCE allow; the rdma tier runs over the TCP fallback here", d.Name, p.Number),
					"nothing to do for the TCP fallback; for one-sided RDMA give the host a RoCE or InfiniBand device"+softRoCE(p.Netdev))
				continue
			}
			if p.Active() {
				continue
			}
			what := fmt.Sprintf("RDMA port %s/%d (%s) is %s (%s)", d.Name, p.Number, p.Transport, p.State, p.PhysState)
			switch {
			case p.Netdev != "" && up[p.Netdev] != "up":
				r.problem(what+fmt.Sprintf(": its interface %s is %s", p.Netdev, orUnknown(up[p.Netdev])), "ip link set "+p.Netdev+" up")
			case p.Transport == devices.InfiniBand && p.State == "INIT":
				r.problem(what+": the link is up but no subnet manager has configured the port", "systemctl start opensm  # or enable the subnet manager on the switch")
			default:
				r.problem(what+": the link is down", fmt.Sprintf("rdma link show %s/%d  # check the cable and the switch port", d.Name, p.Number))
			}
		}
	}
	if len(inv.Devices) == 0 {
		for _, n := range nics {
			if n.OperState == "up" {
				r.problem(fmt.Sprintf("no RDMA device, but interface %s is up: Soft-RoCE (rdma_rxe) can serve one-sided operations over it", n.Name),
					fmt.Sprintf("modprobe rdma_rxe && rdma link add rxe0 type rxe netdev %s", n.Name))
				break
			}
		}
	}
}

// hasIWARP reports whether the host has an active iWARP port.
func (r *doctorReport) hasIWARP() bool {
	return slices.ContainsFunc(r.RDMA, func(p doctorPort) bool { return p.Transport == devices.IWARP && p.State == "ACTIVE" })
}

// softRoCE suggests Soft-RoCE on netdev ("" when unknown).
func softRoCE(netdev string) string {
	if netdev == "" {
		return ""
	}
	return fmt.Sprintf(", or Soft-RoCE on its interface: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev %s", netdev)
}

func orUnknown(s string) string {
	if s == "" {
		return "unknown"
	}
	return s
}

// poolChecks compares what poold uses with what the host offers.
func (r *doctorReport) poolChecks(inv *devices.Inventory) {
	_, active := inv.VerbsPorts()
	name, reason := dialer.Preferred()
	if !r.Pool.Reachable {
		return
	}
	switch {
	case r.Pool.Transport == "":
		r.Pool.TransportReason = "poold serves no rdma tier (--export-size 0, and no peers)"
	case r.Pool.Transport == "verbs":
		r.Pool.TransportReason = "RDMA verbs: " + reason
	case len(active) == 0 && r.hasIWARP():
		r.Pool.TransportReason = "TCP fallback: the active RDMA ports are iWARP, which the verbs backend cannot use (they need RDMA-CM)"
	case len(active) == 0:
		r.Pool.TransportReason = "TCP fallback: no active RDMA port on this host"
	case name == "verbs":
		r.Pool.TransportReason = "TCP fallback, although this host has an active RDMA port and memctl's build can use it: poold was built without the verbs tag, or started before the port came up"
		r.problem("poold's rdma tier uses the TCP fallback although an RDMA port is active", "rebuild poold with verbs: CGO_ENABLED=1 go build -tags verbs ./cmd/poold  (needs libibverbs-dev), then restart it")
	default:
		r.Pool.TransportReason = "TCP fallback: " + reason
		r.problem("poold's rdma tier uses the TCP fallback although an RDMA port is active: "+reason, "rebuild poold with verbs: CGO_ENABLED=1 go build -tags verbs ./cmd/poold  (needs libibverbs-dev), then restart it")
	}
	for _, t := range r.Pool.Tiers {
		if t.Injected == nil || t.MeasuredReadLatency.GetSource() != "measured" {
			continue
		}
		if inj, real := time.Duration(t.Injected.LatencyNs), time.Duration(t.MeasuredReadLatency.P50Ns); real > inj {
			r.Notes = append(r.Notes, fmt.Sprintf("%s: injected latency %s is below what the tier really takes (%s measured): emulation only adds latency, so calls stay at the real cost", tier.Name(t.Tier), inj, real))
		}
	}
}
