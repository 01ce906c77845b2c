package pool

import (
	"context"
	"errors"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/cluster"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/tier"
	"github.com/farmem/farmem/rdma"
	"github.com/farmem/farmem/rdma/tcp"
)

// metricsNamespace prefixes every farmem metric family.
const metricsNamespace = "farmem"

// dataPlaneOps are the op label values of the data-plane families, indexed
// by rdma.OpKind; index 0 counts opcodes the server does not know, and so
// does 5 (the tcp transport's message opcode, no operation on memory).
var dataPlaneOps = [...]string{0: "other", rdma.OpRead: "read", rdma.OpWrite: "write", rdma.OpCompareAndSwap: "cas", rdma.OpFetchAdd: "fadd", 5: "other", rdma.OpXor: "xor"}

// metrics is one daemon's Prometheus instrumentation, on a registry of its
// own (several daemons may run in one process). Counters are fed by hooks
// on the daemon's paths; gauges of state (capacity, segments, sessions,
// members) are read from the core at scrape time by poolCollector. Safe for
// concurrent use; a nil *metrics ignores every event (a core built without
// a Daemon, as unit tests do).
type metrics struct {
	reg *prometheus.Registry

	allocs        *prometheus.CounterVec
	frees         *prometheus.CounterVec
	reclaims      *prometheus.CounterVec
	allocFailures *prometheus.CounterVec
	renewals      prometheus.Counter
	expiries      prometheus.Counter
	refusals      *prometheus.CounterVec

	// Per-op children of the data-plane families, resolved once so that
	// the per-operation hook does no label lookup and no allocation.
	dpOps    [len(dataPlaneOps)]prometheus.Counter
	dpBytes  [len(dataPlaneOps)]prometheus.Counter
	dpDur    [len(dataPlaneOps)]prometheus.Observer
	dpErrors *prometheus.CounterVec
	// Children of farmem_dataplane_refused_connections_total, by reason.
	dpRefused []prometheus.Counter

	moves    *copyMetrics // live moves (move.go)
	rebuilds *copyMetrics // rebuilds of redundant segments (rebuild.go)
	// parityRepaired counts the bytes of parity shards a rebuild rewrote
	// in line with the data shards (rebuildfill.go, repair).
	parityRepaired prometheus.Counter
}

// newMetrics makes the registry with every family poold exports except
// those read from the core, which watch adds.
func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	f := promFactory{m.reg}
	m.allocs = f.counterVec("allocations_total", "Segments allocated, by tier (peers' placements on this node included).", "tier")
	m.frees = f.counterVec("frees_total", "Segments released, by tier: freed by their owner or reclaimed.", "tier")
	m.reclaims = f.counterVec("reclaims_total", "Segments released without their owner freeing them, by reason.", "reason")
	m.allocFailures = f.counterVec("alloc_failures_total", "Allocations refused, by reason.", "reason")
	m.renewals = f.counter("lease_renewals_total", "Session keep-alives received: each renews its client's lease.")
	m.expiries = f.counter("lease_expiries_total", "Client leases that ran out (their unpinned segments are then reclaimed).")
	m.refusals = f.counterVec("access_denied_total", "Control-plane requests refused access to a segment (or a session its client id), by operation.", "op")
	m.moves = newMoveMetrics(f)
	m.rebuilds = newRebuildMetrics(f)
	m.parityRepaired = f.counter("rebuild_parity_repaired_bytes_total", "Bytes of parity shards a rebuild rewrote in line with the data shards: a data home died between sending one write's parity deltas to one parity shard and to another.")
	ops := f.counterVec("dataplane_operations_total", "One-sided operations served by the data plane, by op and tier (failed ones included).", "op", "tier")
	bytes := f.counterVec("dataplane_bytes_total", "Payload bytes moved by the data plane, by op and tier.", "op", "tier")
	dur := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: metricsNamespace, Name: "dataplane_operation_duration_seconds",
		Help: "Time the data plane spends on one operation, from its request decoded to its response queued (excluding the socket write), by op and tier.",
		// 250ns to 65ms: a served 4 KiB read takes about a microsecond, a
		// large WRITE waits for its payload.
		Buckets: prometheus.ExponentialBuckets(250e-9, 4, 10),
	}, []string{"op", "tier"})
	m.reg.MustRegister(dur)
	m.dpErrors = f.counterVec("dataplane_errors_total", "Data-plane operations answered with an error, by op, tier and status.", "op", "tier", "status")
	for i, op := range dataPlaneOps {
		m.dpOps[i] = ops.WithLabelValues(op, "rdma")
		m.dpBytes[i] = bytes.WithLabelValues(op, "rdma")
		m.dpDur[i] = dur.WithLabelValues(op, "rdma")
	}
	refused := f.counterVec("dataplane_refused_connections_total", "Data-plane connections refused at accept or in their handshake, by reason: max_conns, handshake_limit, source_limit, tenant_limit (over --data-max-conns, --data-max-handshakes, --data-max-handshakes-per-source, --data-max-conns-per-tenant), timeout (no hello in time), bad_hello, auth_failed, hangup (the client left mid-handshake).", "reason")
	for _, r := range tcp.Refusals() {
		m.dpRefused = append(m.dpRefused, refused.WithLabelValues(r.String()))
	}
	for _, op := range dataPlaneOps[1:] {
		if op == "other" {
			continue
		}
		for _, st := range []tcp.OpStatus{tcp.StatusAccessDenied, tcp.StatusOutOfRange, tcp.StatusLeaseExpired, tcp.StatusSegmentLost} {
			m.dpErrors.WithLabelValues(op, "rdma", st.String())
		}
	}
	// Every per-tier counter starts at zero, so its family exists before
	// its first event.
	for _, t := range tier.Memory() {
		m.allocs.WithLabelValues(tierName(t))
		m.frees.WithLabelValues(tierName(t))
	}
	m.reclaims.WithLabelValues(reasonLabel("lease expired"))
	for _, r := range []string{"over_budget", "no_capacity", "invalid", "name_in_use", "unavailable", "canceled", "other"} {
		m.allocFailures.WithLabelValues(r)
	}
	for _, op := range []string{"free", "attach", "stat", "descriptor", "session"} {
		m.refusals.WithLabelValues(op)
	}
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: metricsNamespace, Name: "build_info",
		Help: "Always 1; labels say which poold build runs.",
	}, []string{"version", "goversion"})
	info.WithLabelValues(Version, runtime.Version()).Set(1)
	m.reg.MustRegister(info, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// promFactory registers farmem families on one registry.
type promFactory struct{ reg *prometheus.Registry }

func (f promFactory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: metricsNamespace, Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

// copyMetrics count the runs of a copy between homes (live moves,
// rebuilds): by result (ok, failed), their bytes, and a histogram of one
// duration of each successful run.
type copyMetrics struct {
	runs  *prometheus.CounterVec
	bytes prometheus.Counter
	took  prometheus.Histogram
}

// newCopyMetrics registers the families of one kind of copy: runs (by
// result), bytes and took, each named and helped as given.
func newCopyMetrics(f promFactory, runs, runsHelp, bytes, bytesHelp, took, tookHelp string, buckets []float64) *copyMetrics {
	cm := &copyMetrics{
		runs:  f.counterVec(runs, runsHelp, "result"),
		bytes: f.counter(bytes, bytesHelp),
		took:  prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: metricsNamespace, Name: took, Help: tookHelp, Buckets: buckets}),
	}
	f.reg.MustRegister(cm.took)
	cm.runs.WithLabelValues("ok")
	cm.runs.WithLabelValues("failed")
	return cm
}

func (f promFactory) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: metricsNamespace, Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

// watch adds the families read from p at scrape time.
func (m *metrics) watch(p *core) {
	m.reg.MustRegister(&poolCollector{p: p})
}

// allocDone counts the outcome of one Alloc call.
func (m *metrics) allocDone(r *record, err error) {
	if m == nil {
		return
	}
	if err != nil {
		m.allocFailures.WithLabelValues(allocFailureReason(err)).Inc()
		return
	}
	m.allocs.WithLabelValues(tierName(r.Tier)).Inc()
}

// allocFailureReason is the reason label of a failed Alloc.
func allocFailureReason(err error) string {
	switch {
	case errors.Is(err, errs.ErrOverBudget): // before ErrNoCapacity, which it matches
		return "over_budget"
	case errors.Is(err, errs.ErrNoCapacity):
		return "no_capacity"
	case errors.Is(err, errs.ErrInvalid):
		return "invalid"
	case errors.Is(err, errs.ErrExists):
		return "name_in_use"
	case errors.Is(err, errs.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "other"
}

// released counts a segment leaving the table; reason is release's
// ("freed" by its owner, else why it was reclaimed).
func (m *metrics) released(r *record, reason string) {
	if m == nil {
		return
	}
	m.frees.WithLabelValues(tierName(r.Tier)).Inc()
	if reason != "freed" {
		m.reclaims.WithLabelValues(reasonLabel(reason)).Inc()
	}
}

// reasonLabel turns a reason as logged ("lease expired") into a label value
// ("lease_expired").
func reasonLabel(reason string) string { return strings.ReplaceAll(reason, " ", "_") }

// leaseRenewed counts one keep-alive received on a session.
func (m *metrics) leaseRenewed() {
	if m != nil {
		m.renewals.Inc()
	}
}

// leaseExpired counts one client whose lease ran out.
func (m *metrics) leaseExpired() {
	if m != nil {
		m.expiries.Inc()
	}
}

// refused counts one request refused access to a segment.
func (m *metrics) refused(op string) {
	if m != nil {
		m.refusals.WithLabelValues(op).Inc()
	}
}

// observeDataPlane is the data plane's tcp.ServerConfig.Observe hook: a few
// atomic adds per operation, no allocation on success.
func (m *metrics) observeDataPlane(o tcp.Observation) {
	i := int(o.Op)
	if i >= len(dataPlaneOps) {
		i = 0
	}
	m.dpOps[i].Inc()
	if o.Bytes > 0 {
		m.dpBytes[i].Add(float64(o.Bytes))
	}
	m.dpDur[i].Observe(o.Duration.Seconds())
	if o.Status != tcp.StatusOK {
		m.dpErrors.WithLabelValues(dataPlaneOps[i], "rdma", o.Status.String()).Inc()
	}
}

// refusedDataPlane is the data plane's tcp.ServerConfig.Refused hook.
func (m *metrics) refusedDataPlane(r tcp.Refusal) {
	if int(r) < len(m.dpRefused) {
		m.dpRefused[r].Inc()
	}
}

// emulatedLatency is the latency injected into accesses to tier by
// Config.EmulateLatency (0: none), which farmem_emulated_latency_seconds
// reports.
func emulatedLatency(cfg Config, name string) time.Duration {
	t, err := tier.Parse(name)
	if err != nil {
		return 0
	}
	tg, _ := cfg.EmulateLatency.Target(t)
	return tg.Latency
}

// poolCollector reads the core's state at scrape time, so the gauges are
// never stale and cost nothing between scrapes.
type poolCollector struct{ p *core }

var (
	deviceLabels   = []string{"tier", "device", "kind", "emulated"}
	capacityDesc   = promDesc("tier_capacity_bytes", "Capacity of a device, in bytes.", deviceLabels...)
	usedDesc       = promDesc("tier_used_bytes", "Bytes of a device held by segments (extents, rounded up to the device's alignment).", deviceLabels...)
	freeDesc       = promDesc("tier_free_bytes", "Free bytes of a device.", deviceLabels...)
	segmentsDesc   = promDesc("segments", "Segments in this node's table, by tier and state (active; degraded: redundant with a home lost or rebuilding; lost).", "tier", "state")
	redundantDesc  = promDesc("redundant_segments", "Redundant segments whose records this node holds, by state: ok (every home holds its copy or shard), degraded (a home is lost and no rebuild runs yet), rebuilding (a lost home is being rebuilt elsewhere), lost (more homes lost than the redundancy covers).", "state")
	sessionsDesc   = promDesc("sessions", "Live client sessions.")
	membersDesc    = promDesc("cluster_members", "Cluster members by state, this node included; a node in no cluster counts itself alive.", "state")
	emuLatDesc     = promDesc("emulated_latency_seconds", "Latency injected into accesses to a tier by latency emulation (0: none).", "tier")
	drainingDesc   = promDesc("draining", "1 while this node drains (memctl drain: no new placements for peers; its segments stay unless it evacuates; kept across restarts until memctl drain --undo), else 0.")
	drainSinceDesc = promDesc("draining_since_timestamp_seconds", "Unix time this node began to drain; 0 while it is not draining.")
	evacSegsDesc   = promDesc("evacuation_segments_left", "Segments peers placed on this node that its evacuation (memctl drain --evacuate) has yet to move; 0 while it does not evacuate.")
	evacBytesDesc  = promDesc("evacuation_bytes_left", "Bytes of the segments counted by farmem_evacuation_segments_left.")
	commitsDesc    = promDesc("metadata_commits_total", "Commits to a file of the metadata store, and whether each is fsynced: segments.db holds the records of segments on persistent memory or on peers, segments-volatile.db those of segments in volatile memory.", "file", "fsync")
	memberStates   = []string{"alive", "suspect", "dead", "left"}
	segmentStates  = []string{"active", "degraded", "lost"}
)

func promDesc(name, help string, labels ...string) *prometheus.Desc {
	return prometheus.NewDesc(prometheus.BuildFQName(metricsNamespace, "", name), help, labels, nil)
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{capacityDesc, usedDesc, freeDesc, segmentsDesc, redundantDesc, sessionsDesc, membersDesc, emuLatDesc, drainingDesc, drainSinceDesc, evacSegsDesc, evacBytesDesc, commitsDesc} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	c.p.collect(func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	})
	for _, f := range c.p.st.files() {
		ch <- prometheus.MustNewConstMetric(commitsDesc, prometheus.CounterValue, float64(f.commits.Load()), filepath.Base(f.path), strconv.FormatBool(!f.db.NoSync))
	}
}

// collect reports the core's gauges (the descriptors above) to gauge.
func (p *core) collect(gauge func(d *prometheus.Desc, v float64, labels ...string)) {
	p.mu.Lock()
	tiers := map[string]bool{}
	for _, d := range p.devs {
		st := d.ext.Stats()
		t := tierName(d.tier)
		tiers[t] = true
		labels := []string{t, d.Name(), d.kindName(), strconv.FormatBool(d.isEmulated())}
		gauge(capacityDesc, float64(st.Capacity), labels...)
		gauge(usedDesc, float64(st.Capacity-st.Free), labels...)
		gauge(freeDesc, float64(st.Free), labels...)
	}
	if p.cl != nil {
		tiers["rdma"] = true // peers' memory
	}
	segs := map[[2]string]int{}
	redundant := map[poolv1.RedundancyState]int{}
	for _, r := range p.segs {
		if s := r.redundancyState(); s != poolv1.RedundancyState_REDUNDANCY_STATE_NONE {
			redundant[s]++
		}
		state := "active"
		switch {
		case r.Lost:
			state = "lost"
		case r.degraded():
			state = "degraded"
		}
		segs[[2]string{tierName(r.Tier), state}]++
		tiers[tierName(r.Tier)] = true
	}
	sessions := len(p.sessions)
	drainSince := p.drained.since
	p.mu.Unlock()

	for t := range tiers {
		for _, s := range segmentStates {
			gauge(segmentsDesc, float64(segs[[2]string{t, s}]), t, s)
		}
		gauge(emuLatDesc, emulatedLatency(p.cfg, t).Seconds(), t)
	}
	for _, s := range redundancyStates {
		gauge(redundantDesc, float64(redundant[s]), redundancyLabel(s))
	}
	gauge(sessionsDesc, float64(sessions))
	if drainSince.IsZero() {
		gauge(drainingDesc, 0)
		gauge(drainSinceDesc, 0)
	} else {
		gauge(drainingDesc, 1)
		gauge(drainSinceDesc, float64(drainSince.UnixMilli())/1e3)
	}
	var evSegs, evBytes float64
	if ev := p.evac.progress(); ev != nil {
		evSegs, evBytes = float64(ev.SegmentsLeft), float64(ev.BytesLeft)
	}
	gauge(evacSegsDesc, evSegs)
	gauge(evacBytesDesc, evBytes)
	members := map[string]int{}
	if p.cl == nil {
		members["alive"] = 1
	} else {
		for _, mb := range p.cl.Members() {
			members[cluster.StateString(mb.State)]++
		}
	}
	for _, s := range memberStates {
		gauge(membersDesc, float64(members[s]), s)
		delete(members, s)
	}
	for s, n := range members { // a state this list does not know yet
		gauge(membersDesc, float64(n), s)
	}
}
