package alloc

import (
	"fmt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/tier"
)

// Tier is a class of memory. The zero value is TierAny. A plain value, safe for concurrent use.
type Tier int

// The tiers.
const (
	// TierAny lets the daemon choose: the fastest tier by read latency
	// first, tiers within 25% of each other the cheaper first (rdma, cxl,
	// local); cxl, local, rdma before poold has measured its tiers.
	TierAny Tier = iota
	// TierLocal is DRAM of this host, the reference point.
	TierLocal
	// TierCXL is CXL memory (a devdax device or a memory-only NUMA node), or
	// its emulation on hosts without CXL (Segment.Emulated says which).
	TierCXL
	// TierRDMA is memory of a remote host reached by one-sided operations.
	TierRDMA
)

// String returns any, local, cxl or rdma.
func (t Tier) String() string {
	if t < TierAny || t > TierRDMA {
		return fmt.Sprintf("tier(%d)", int(t))
	}
	return tier.Name(t.proto())
}

// ParseTier reads a tier name as String prints it, in any letter case. An
// unknown name is an error matching ErrInvalid that lists the valid ones.
func ParseTier(s string) (Tier, error) {
	t, err := tier.Parse(s)
	if err != nil {
		return 0, err
	}
	return tierFromProto(t), nil
}

func (t Tier) proto() poolv1.Tier {
	switch t {
	case TierLocal:
		return poolv1.Tier_TIER_LOCAL
	case TierCXL:
		return poolv1.Tier_TIER_CXL
	case TierRDMA:
		return poolv1.Tier_TIER_RDMA
	}
	return poolv1.Tier_TIER_UNSPECIFIED
}

func tierFromProto(t poolv1.Tier) Tier {
	switch t {
	case poolv1.Tier_TIER_LOCAL:
		return TierLocal
	case poolv1.Tier_TIER_CXL:
		return TierCXL
	case poolv1.Tier_TIER_RDMA:
		return TierRDMA
	}
	return TierAny
}

// Latency is a latency distribution and where it came from: "measured" on
// this host, "injected" by latency emulation, or "hmat" (the firmware's
// figure). Zero Samples means nothing is known yet. A plain value.
type Latency struct {
	// P50Ns and P99Ns are the median and 99th percentile, in nanoseconds.
	P50Ns, P99Ns int64
	// Samples is how many measurements the percentiles come from.
	Samples int64
	// Source is "measured", "injected" or "hmat".
	Source string
}

// TierInfo describes one tier as the daemon offers it. It is a plain value.
type TierInfo struct {
	// Tier is the tier described.
	Tier Tier
	// Kind says what backs the tier: devdax, numa, emulated, dram, tcp, verbs, loopback.
	Kind string
	// Emulated is true when the tier stands in for hardware the host lacks.
	Emulated bool
	// Capacity and Free are in bytes.
	Capacity, Free int64
	// Devices names the devices behind the tier.
	Devices []string
	// Segments is how many segments the tier holds.
	Segments int64
	// Fragmentation is 1 - largest free extent / free bytes.
	Fragmentation float64
	// ReadLatency, WriteLatency are measured, or injected when Injected is
	// set; HMATReadLatency is the firmware's.
	ReadLatency, WriteLatency, HMATReadLatency Latency
	// Injected is the latency emulation this client applies to the tier's
	// ReadAt, WriteAt and atomics (the daemon's, or WithEmulateLatency's);
	// zero for none.
	Injected Injected
	// MeasuredReadLatency, MeasuredWriteLatency are what was measured of the
	// tier's real memory when ReadLatency is injected; zero otherwise.
	MeasuredReadLatency, MeasuredWriteLatency Latency
	// ReadBandwidth, WriteBandwidth are in bytes per second.
	ReadBandwidth, WriteBandwidth int64
	// Note explains the label in a line a person reads.
	Note string
}

func latencyFromProto(l *poolv1.Latency) Latency {
	if l == nil {
		return Latency{}
	}
	return Latency{P50Ns: l.P50Ns, P99Ns: l.P99Ns, Samples: l.Samples, Source: l.Source}
}

func tierInfoFromProto(t *poolv1.TierInfo) TierInfo {
	return TierInfo{
		Tier: tierFromProto(t.Tier), Kind: t.Kind, Emulated: t.Emulated, Capacity: t.Capacity, Free: t.Free,
		Devices: t.Devices, Segments: t.Segments, Fragmentation: t.Fragmentation,
		ReadLatency: latencyFromProto(t.ReadLatency), WriteLatency: latencyFromProto(t.WriteLatency),
		HMATReadLatency: latencyFromProto(t.HmatReadLatency),
		ReadBandwidth:   t.ReadBandwidthBps, WriteBandwidth: t.WriteBandwidthBps, Note: t.Note,
		Injected:            Injected(targetFromProto(t.Injected)),
		MeasuredReadLatency: latencyFromProto(t.MeasuredReadLatency), MeasuredWriteLatency: latencyFromProto(t.MeasuredWriteLatency),
	}
}
