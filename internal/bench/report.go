package bench

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

// Row is one measured case as 'memctl bench -o json' prints it: one per
// (system, op, size, depth). A plain value.
type Row struct {
	System string `json:"system"`
	Op     Op     `json:"op"`
	Size   int    `json:"size"`
	Depth  int    `json:"depth"`
	Ops    int64  `json:"ops"`
	// OpsPerSec is throughput; BandwidthBps is OpsPerSec × Size.
	OpsPerSec    float64 `json:"ops_per_sec"`
	BandwidthBps float64 `json:"bandwidth_bps"`
	P50Ns        int64   `json:"p50_ns"`
	P99Ns        int64   `json:"p99_ns"`
	// ClientCPUNsPerOp is this process's CPU time per op, for servers in
	// this process (memory, tcp-raw, grpc) including theirs.
	ClientCPUNsPerOp *float64 `json:"client_cpu_ns_per_op,omitempty"`
	// ServerCPUNsPerOp is the serving process's CPU time per op, where the
	// server is another process on this host.
	ServerCPUNsPerOp *float64 `json:"server_cpu_ns_per_op,omitempty"`
	// Vs names the farmem system this row is compared with; OpsRatio is
	// this row's throughput ÷ Vs's, P50Ratio this row's p50 ÷ Vs's (so for
	// a competitor, OpsRatio < 1 and P50Ratio > 1 mean farmem is faster).
	Vs       string   `json:"vs,omitempty"`
	OpsRatio *float64 `json:"ops_ratio,omitempty"`
	P50Ratio *float64 `json:"p50_ratio,omitempty"`

	// Latency is the full distribution, for plots; not in JSON.
	Latency *Histogram `json:"-"`
}

// NewRow summarizes a result.
func NewRow(r *Result) Row {
	row := Row{
		System: r.System, Op: r.Case.Op, Size: r.Case.Size, Depth: r.Case.Depth, Ops: r.Ops,
		OpsPerSec: r.OpsPerSec(), P50Ns: int64(r.Latency.Quantile(0.5)), P99Ns: int64(r.Latency.Quantile(0.99)),
		Latency: &r.Latency,
	}
	row.BandwidthBps = row.OpsPerSec * float64(row.Size)
	perOp := func(d time.Duration) *float64 {
		if d < 0 || r.Ops == 0 {
			return nil
		}
		v := math.Round(float64(d)/float64(r.Ops)*10) / 10
		return &v
	}
	row.ClientCPUNsPerOp = perOp(r.ClientCPU)
	row.ServerCPUNsPerOp = perOp(r.ServerCPU)
	return row
}

// Baseline is the farmem system a system's rows are compared with:
// network servers with the rdma tier, the in-process []byte with local
// DRAM (else CXL), and farmem's load/store tiers with the rdma tier.
// "" for farmem-rdma itself and unknown systems.
func Baseline(system string, have func(string) bool) string {
	switch system {
	case "memcached", "redis", "grpc", "tcp-raw", "farmem-cxl", "farmem-dram":
		return "farmem-rdma"
	case "memory":
		if have("farmem-dram") {
			return "farmem-dram"
		}
		return "farmem-cxl"
	}
	return ""
}

// Compare sets Vs, OpsRatio and P50Ratio on every row whose baseline
// system measured the same op, size and depth.
func Compare(rows []Row) {
	type key struct {
		system string
		op     Op
		size   int
		depth  int
	}
	idx := map[key]int{}
	systems := map[string]bool{}
	for i, r := range rows {
		idx[key{r.System, r.Op, r.Size, r.Depth}] = i
		systems[r.System] = true
	}
	have := func(s string) bool { return systems[s] }
	for i := range rows {
		r := &rows[i]
		base := Baseline(r.System, have)
		j, ok := idx[key{base, r.Op, r.Size, r.Depth}]
		if base == "" || !ok {
			continue
		}
		b := rows[j]
		r.Vs = base
		r.OpsRatio, r.P50Ratio = nil, nil
		if b.OpsPerSec > 0 {
			v := r.OpsPerSec / b.OpsPerSec
			r.OpsRatio = &v
		}
		if b.P50Ns > 0 {
			v := float64(r.P50Ns) / float64(b.P50Ns)
			r.P50Ratio = &v
		}
	}
}

// Target is one of the benchmark targets the README states, checked on one run.
type Target struct {
	// Name says what is compared, Want the bound, Value the measured ratio.
	Name  string
	Want  string
	Value float64
	OK    bool
}

// Targets checks the targets whose rows are present (after Compare):
// 4 KiB reads on farmem-rdma vs memcached (throughput, latency, and the
// CPU time per read of client and server together, where both are known)
// and grpc, and farmem-cxl vs farmem-rdma. Each ratio but the CPU one
// reads "farmem is Value× better"; the CPU one is farmem's share of
// memcached's.
func Targets(rows []Row) []Target {
	find := func(system string, depth int) *Row {
		for i := range rows {
			r := &rows[i]
			if r.System == system && r.Op == Read && r.Size == 4096 && r.Depth == depth {
				return r
			}
		}
		return nil
	}
	var out []Target
	add := func(name, want string, v, bound float64) {
		out = append(out, Target{Name: name, Want: want, Value: v, OK: v >= bound})
	}
	rdma16, rdma1 := find("farmem-rdma", 16), find("farmem-rdma", 1)
	if m := find("memcached", 16); rdma16 != nil && m != nil && m.OpsPerSec > 0 {
		add("farmem-rdma ÷ memcached GET, 4 KiB reads/s at 16 in flight", "≥ 3", rdma16.OpsPerSec/m.OpsPerSec, 3)
		if f, mc := rdma16.cpuPerOp(), m.cpuPerOp(); f > 0 && mc > 0 {
			v := f / mc
			out = append(out, Target{Name: "farmem-rdma ÷ memcached GET, client+server CPU/read at 16", Want: "≤ 0.7", Value: v, OK: v <= 0.7})
		}
	}
	if m := find("memcached", 1); rdma1 != nil && m != nil && rdma1.P50Ns > 0 {
		add("memcached GET p50 ÷ farmem-rdma p50, 4 KiB at 1 in flight", "≥ 1", float64(m.P50Ns)/float64(rdma1.P50Ns), 1)
	}
	for _, d := range []int{1, 16} {
		if g, r := find("grpc", d), find("farmem-rdma", d); g != nil && r != nil && g.OpsPerSec > 0 {
			add(fmt.Sprintf("farmem-rdma ÷ grpc, 4 KiB reads/s at %d in flight", d), "≥ 4", r.OpsPerSec/g.OpsPerSec, 4)
		}
	}
	for _, d := range []int{1, 16} {
		if c, r := find("farmem-cxl", d), find("farmem-rdma", d); c != nil && r != nil && r.OpsPerSec > 0 {
			add(fmt.Sprintf("farmem-cxl ÷ farmem-rdma, 4 KiB ReadAt/s at %d in flight", d), "≥ 10", c.OpsPerSec/r.OpsPerSec, 10)
		}
	}
	return out
}

// cpuPerOp is the client's and the server's CPU time per op together, 0
// when either is unknown.
func (r *Row) cpuPerOp() float64 {
	if r.ClientCPUNsPerOp == nil || r.ServerCPUNsPerOp == nil {
		return 0
	}
	return *r.ClientCPUNsPerOp + *r.ServerCPUNsPerOp
}

// WriteTable prints rows as a table, then the targets.
func WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "SYSTEM\tOP\tSIZE\tDEPTH\tOPS/S\tBANDWIDTH\tP50\tP99\tCPU/OP CLIENT\tCPU/OP SERVER\tVS\tOPS ×\tP50 ×\t")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
			r.System, r.Op, sizeName(r.Size), r.Depth, count(r.OpsPerSec), rate(r.BandwidthBps),
			dur(r.P50Ns), dur(r.P99Ns), cpu(r.ClientCPUNsPerOp), cpu(r.ServerCPUNsPerOp),
			dash(r.Vs), ratio(r.OpsRatio), ratio(r.P50Ratio))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ts := Targets(rows)
	if len(ts) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nTargets, ratios from this run:")
	for _, t := range ts {
		verdict := "met"
		if !t.OK {
			verdict = "NOT MET"
		}
		fmt.Fprintf(w, "  %-62s %7.2f×  (want %s)  %s\n", t.Name, t.Value, t.Want, verdict)
	}
	return nil
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

func count(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.1fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func rate(bps float64) string {
	switch {
	case bps >= 1e9:
		return fmt.Sprintf("%.2f GB/s", bps/1e9)
	case bps >= 1e6:
		return fmt.Sprintf("%.1f MB/s", bps/1e6)
	}
	return fmt.Sprintf("%.0f kB/s", bps/1e3)
}

func dur(ns int64) string {
	d := time.Duration(ns)
	switch {
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	case d >= time.Microsecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	}
	return fmt.Sprintf("%dns", ns)
}

func cpu(v *float64) string {
	if v == nil {
		return "-"
	}
	return dur(int64(*v))
}

func ratio(v *float64) string {
	switch {
	case v == nil:
		return "-"
	case *v >= 100:
		return fmt.Sprintf("%.0f", *v)
	case *v >= 0.1:
		return fmt.Sprintf("%.2f", *v)
	}
	return fmt.Sprintf("%.2g", *v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return strings.TrimPrefix(s, "farmem-")
}
