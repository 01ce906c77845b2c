// This file holds placement by figures: what each tier is judged by (its
// read latency and bandwidth, injected, measured or from the firmware),
// the order in which a request tries tiers, a request's budget, and the
// Placement an Alloc reply carries to say why the segment is where it is.

package pool

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
)

// costOrder lists the tiers cheapest first. Memory that other hosts have
// to spare (rdma) would otherwise sit idle; CXL memory was added to this
// host to be filled, but only this host can use it; this host's DRAM is
// the most precious, wanted by its own programs, kernel and page cache and
// replaceable by nothing. A budget takes the cheapest tier that meets it.
var costOrder = []poolv1.Tier{poolv1.Tier_TIER_RDMA, poolv1.Tier_TIER_CXL, poolv1.Tier_TIER_LOCAL}

// fixedOrder is the order TierAny tries tiers in while none has a figure.
var fixedOrder = []poolv1.Tier{poolv1.Tier_TIER_CXL, poolv1.Tier_TIER_LOCAL, poolv1.Tier_TIER_RDMA}

// sameSpeed is how much slower than the fastest of a group a tier may read
// and still count as equally fast when TierAny orders tiers by latency:
// two tiers of the same DRAM (local and emulated cxl) measure a few
// percent apart either way from one start to the next, and the cheaper
// one should win every time, not by the probe's noise.
const sameSpeed = 1.25

// figure is what placement judges a tier by. A plain value.
type figure struct {
	// lat is the tier's read latency: injected where the tier has latency
	// emulation, else measured, else the firmware's (hmat); nil when none
	// is known.
	lat *poolv1.Latency
	// bps is the read bandwidth in bytes per second, the injected cap
	// where it is below what was measured; 0 when not known. bpsSource
	// says which.
	bps       int64
	bpsSource string
}

// figureOf is what tier t is judged by, from the figures Tiers shows.
// p.mu must be held.
func (p *core) figureOf(t poolv1.Tier) figure {
	ti := &poolv1.TierInfo{Tier: t}
	p.addMeasured(ti)
	var f figure
	switch {
	case ti.ReadLatency.GetP50Ns() > 0:
		f.lat = ti.ReadLatency
	case ti.HmatReadLatency.GetP50Ns() > 0:
		f.lat = ti.HmatReadLatency
	}
	if f.bps, f.bpsSource = ti.ReadBandwidthBps, "measured"; f.bps == 0 {
		f.bpsSource = ""
	}
	if c := ti.Injected.GetBandwidthBps(); c > 0 && (f.bps == 0 || c < f.bps) {
		f.bps, f.bpsSource = c, "injected"
	}
	return f
}

// String writes f as a person reads it: "92ns p50 (measured), 4.70 GB/s
// (measured)".
func (f figure) String() string {
	if f.bps == 0 {
		return f.latency()
	}
	return f.latency() + ", " + f.bandwidth()
}

func (f figure) latency() string {
	if f.lat == nil {
		return "read latency not known"
	}
	return fmt.Sprintf("%s p50 (%s)", time.Duration(f.lat.P50Ns), f.lat.Source)
}

func (f figure) bandwidth() string {
	if f.bps == 0 {
		return "read bandwidth not known"
	}
	return fmt.Sprintf("%s (%s)", bandwidth(f.bps), f.bpsSource)
}

// bandwidth writes bytes per second in decimal units, as the flags and
// options that bound it are written: "4.70 GB/s".
func bandwidth(bps int64) string {
	v, unit := float64(bps), "B/s"
	for _, u := range []string{"KB/s", "MB/s", "GB/s", "TB/s"} {
		if v < 1000 {
			break
		}
		v, unit = v/1000, u
	}
	if unit == "B/s" {
		return fmt.Sprintf("%d B/s", bps)
	}
	return fmt.Sprintf("%.2f %s", v, unit)
}

// readBudget is a request's bounds on a tier's read latency and bandwidth;
// a zero bound is none. A plain value.
type readBudget struct {
	maxLatencyNs, minBps int64
}

func (b readBudget) set() bool { return b.maxLatencyNs > 0 || b.minBps > 0 }

func (b readBudget) validate() error {
	if b.maxLatencyNs < 0 {
		return fmt.Errorf("%w: read latency budget %s is negative; ask for a positive latency such as 2µs, or none", errs.ErrInvalid, time.Duration(b.maxLatencyNs))
	}
	if b.minBps < 0 {
		return fmt.Errorf("%w: read bandwidth budget %d B/s is negative; ask for a positive bandwidth such as 1GB/s, or none", errs.ErrInvalid, b.minBps)
	}
	return nil
}

// String writes the bounds: "read latency ≤ 2µs, read bandwidth ≥ 1.0 GiB/s".
func (b readBudget) String() string {
	var s []string
	if b.maxLatencyNs > 0 {
		s = append(s, "read latency ≤ "+time.Duration(b.maxLatencyNs).String())
	}
	if b.minBps > 0 {
		s = append(s, "read bandwidth ≥ "+bandwidth(b.minBps))
	}
	return strings.Join(s, ", ")
}

// known reports whether f has every figure b bounds.
func (b readBudget) known(f figure) bool {
	return (b.maxLatencyNs == 0 || f.lat != nil) && (b.minBps == 0 || f.bps > 0)
}

// miss says why f does not meet b, "" when it does. A tier without a
// figure meets no bound on it: placement never guesses.
func (b readBudget) miss(f figure) string {
	switch {
	case b.maxLatencyNs > 0 && f.lat == nil:
		return "read latency not measured"
	case b.maxLatencyNs > 0 && f.lat.P50Ns > b.maxLatencyNs:
		return fmt.Sprintf("reads in %s, over %s", f.latency(), time.Duration(b.maxLatencyNs))
	case b.minBps > 0 && f.bps == 0:
		return "read bandwidth not measured"
	case b.minBps > 0 && f.bps < b.minBps:
		return fmt.Sprintf("reads at %s, under %s", f.bandwidth(), bandwidth(b.minBps))
	}
	return ""
}

// plan is the tiers a request tries, in order, and what placement knew of
// each when it chose. A plain value.
type plan struct {
	order []poolv1.Tier
	// figs is each tier's figure; the rdma tier's is the best of this
	// host's loopback and its measured peers (rdmaFigure).
	figs map[poolv1.Tier]figure
	// loopback is the rdma tier's figure on this host's own data plane;
	// peers that of each alive peer offering rdma memory that has a
	// current measurement (or the injected one under emulation).
	loopback figure
	peers    map[string]figure
	budget   readBudget
	// why says how the order was chosen, in a line a person reads.
	why string
}

// planFor orders the tiers req tries: the tier it names then its
// fallbacks; for TierAny every tier, fastest first by read latency (tiers
// within sameSpeed of each other cheapest first; those without a figure
// last, in fixedOrder). A budget keeps only the tiers that meet it, and
// for TierAny takes them cheapest first (costOrder). No tier meeting the
// budget is ErrOverBudget, naming the best tier and its figures.
func (p *core) planFor(req allocRequest) (plan, error) {
	pl := plan{budget: readBudget{maxLatencyNs: req.MaxReadLatencyNs, minBps: req.MinReadBandwidthBps}, figs: map[poolv1.Tier]figure{}}
	if err := pl.budget.validate(); err != nil {
		return pl, err
	}
	anyTier := req.Tier == poolv1.Tier_TIER_UNSPECIFIED
	first := []poolv1.Tier{req.Tier}
	if anyTier {
		first = fixedOrder
	}
	var asked []poolv1.Tier
	for _, t := range append(slices.Clone(first), req.Fallback...) {
		if !slices.Contains(asked, t) {
			asked = append(asked, t)
		}
	}
	p.mu.Lock()
	for _, t := range asked {
		pl.figs[t] = p.figureOf(t)
	}
	if slices.Contains(asked, poolv1.Tier_TIER_RDMA) {
		pl.loopback = pl.figs[poolv1.Tier_TIER_RDMA]
		pl.peers = p.peerFigures()
		pl.figs[poolv1.Tier_TIER_RDMA] = pl.rdmaFigure()
	}
	p.mu.Unlock()
	if !pl.budget.set() {
		pl.order = asked
		pl.why = "asked for " + tierList(asked)
		if anyTier {
			pl.order, pl.why = pl.byLatency(asked)
		}
		return pl, nil
	}
	var over []string
	for _, t := range asked {
		if miss := pl.budget.miss(pl.figs[t]); miss != "" {
			over = append(over, tierName(t)+" "+miss)
			continue
		}
		pl.order = append(pl.order, t)
	}
	if len(pl.order) == 0 {
		return pl, pl.overBudget(req.Size, asked)
	}
	pl.why = fmt.Sprintf("%s asked, of %s", pl.budget, tierList(asked))
	if anyTier {
		slices.SortStableFunc(pl.order, byCost)
		pl.why = fmt.Sprintf("the cheapest tier (%s) with %s", tierList(costOrder), pl.budget)
	}
	if len(over) > 0 {
		pl.why += "; left out: " + strings.Join(over, "; ")
	}
	return pl, nil
}

// peerFigures is the figure of each alive peer offering rdma memory that
// has a current measurement: what this daemon measured of its data plane,
// or the rdma tier's injected figure under emulation (clients take that
// from any home). p.mu must be held.
func (p *core) peerFigures() map[string]figure {
	if p.cl == nil {
		return nil
	}
	_, injected := p.injected(poolv1.Tier_TIER_RDMA)
	out := map[string]figure{}
	for _, m := range p.cl.Members() {
		if _, ok := m.Meta.Tier(tierName(poolv1.Tier_TIER_RDMA)); !ok || m.Name == p.cfg.Node || !m.Usable() {
			continue
		}
		if injected {
			out[m.Name] = p.figureOf(poolv1.Tier_TIER_RDMA)
		} else if f := peerFigure(p.pm.get(m.Name)); f.lat != nil {
			out[m.Name] = f
		}
	}
	return out
}

// peerFigure is the figure of a peer's measurement; none when it has no
// current figures.
func peerFigure(l *poolv1.PeerLatency) figure {
	if l == nil || l.Unmeasured != "" || l.ReadLatency.GetP50Ns() <= 0 {
		return figure{}
	}
	f := figure{lat: l.ReadLatency}
	if l.ReadBandwidthBps > 0 {
		f.bps, f.bpsSource = l.ReadBandwidthBps, l.ReadLatency.Source
	}
	return f
}

// rdmaFigure is what the rdma tier is judged by: the fastest of this
// host's loopback and its measured peers that meets the budget, or the
// fastest of them when none does; the loopback's when none has a latency.
func (pl plan) rdmaFigure() figure {
	best := pl.loopback
	better := func(f figure) bool {
		if f.lat == nil {
			return false
		}
		if fits, bestFits := pl.budget.miss(f) == "", pl.budget.miss(best) == ""; fits != bestFits {
			return fits
		}
		return best.lat == nil || f.lat.P50Ns < best.lat.P50Ns
	}
	for _, node := range slices.Sorted(maps.Keys(pl.peers)) {
		if f := pl.peers[node]; better(f) {
			best = f
		}
	}
	return best
}

// near is the measured read latency to each peer, for cluster.PickNear.
func (pl plan) near(node string) (time.Duration, bool) {
	f, ok := pl.peers[node]
	if !ok || f.lat == nil {
		return 0, false
	}
	return time.Duration(f.lat.P50Ns), true
}

// byLatency orders ts fastest first by read latency, tiers within
// sameSpeed of the fastest of their group cheapest first, and those
// without a figure last in the order given, and says so.
func (pl plan) byLatency(ts []poolv1.Tier) ([]poolv1.Tier, string) {
	var known, unknown []poolv1.Tier
	for _, t := range ts {
		if pl.figs[t].lat != nil {
			known = append(known, t)
		} else {
			unknown = append(unknown, t)
		}
	}
	if len(known) == 0 {
		return ts, "no tier measured yet: " + tierList(ts) + " in that order"
	}
	p50 := func(t poolv1.Tier) int64 { return pl.figs[t].lat.P50Ns }
	slices.SortStableFunc(known, func(a, b poolv1.Tier) int { return cmp.Compare(p50(a), p50(b)) })
	var out []poolv1.Tier
	for len(known) > 0 {
		n := 1
		for n < len(known) && float64(p50(known[n])) <= sameSpeed*float64(p50(known[0])) {
			n++
		}
		group := slices.Clone(known[:n])
		slices.SortStableFunc(group, byCost)
		out, known = append(out, group...), known[n:]
	}
	var why strings.Builder
	why.WriteString(byLatencyWhy)
	for i, t := range out {
		if i > 0 {
			why.WriteString(", ")
		}
		why.WriteString(tierName(t) + " " + time.Duration(p50(t)).String())
	}
	if len(unknown) > 0 {
		why.WriteString("; not measured: " + tierList(unknown))
	}
	return append(out, unknown...), why.String()
}

// byLatencyWhy begins the reason of a TierAny placement without a budget;
// the tiers' read latencies p50 follow.
var byLatencyWhy = fmt.Sprintf("fastest read latency p50 first, within %d%% the cheaper first: ", int(math.Round((sameSpeed-1)*100)))

// overBudget is the error for a request whose budget no tier of asked
// meets: it names the best of those with the figures the budget bounds
// (by latency when it bounds latency, else by bandwidth), and lists every
// tier's figures.
func (pl plan) overBudget(sz int64, asked []poolv1.Tier) error {
	best, found := poolv1.Tier_TIER_UNSPECIFIED, false
	better := func(a, b figure) bool {
		if pl.budget.maxLatencyNs > 0 {
			return a.lat.P50Ns < b.lat.P50Ns
		}
		return a.bps > b.bps
	}
	var all []string
	for _, t := range asked {
		f := pl.figs[t]
		all = append(all, tierName(t)+" "+f.String())
		if pl.budget.known(f) && (!found || better(f, pl.figs[best])) {
			best, found = t, true
		}
	}
	if !found {
		return fmt.Errorf("alloc %d bytes with %s: %w; no tier of %s has that figure measured (%s; poold measures its tiers at start unless --measure-tiers=false, 'memctl tiers --measure' measures now)",
			sz, pl.budget, errs.ErrOverBudget, tierList(asked), strings.Join(all, "; "))
	}
	return fmt.Errorf("alloc %d bytes with %s: %w; the best tier, %s, %s (all tiers: %s)",
		sz, pl.budget, errs.ErrOverBudget, tierName(best), pl.budget.miss(pl.figs[best]), strings.Join(all, "; "))
}

// placement says why a segment landed where it did, with f the figures
// of where it landed: those, the budget and the plan's reason, with the
// tiers tried before it that had no room.
func (pl plan) placement(f figure, tried []string) *poolv1.Placement {
	why := pl.why
	if len(tried) > 0 {
		why += "; no room before it: " + strings.Join(tried, "; ")
	}
	return &poolv1.Placement{
		ReadLatency: f.lat, ReadBandwidthBps: f.bps, ReadBandwidthSource: f.bpsSource,
		MaxReadLatencyNs: pl.budget.maxLatencyNs, MinReadBandwidthBps: pl.budget.minBps, Reason: why,
	}
}

func byCost(a, b poolv1.Tier) int {
	return cmp.Compare(slices.Index(costOrder, a), slices.Index(costOrder, b))
}

func tierList(ts []poolv1.Tier) string {
	names := make([]string, len(ts))
	for i, t := range ts {
		names[i] = tierName(t)
	}
	return strings.Join(names, ", ")
}
