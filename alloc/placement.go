package alloc

import "time"

// Placement says why a segment is on its tier: the figures poold judged the
// tier by when Alloc placed it, the budget they were held against, and
// poold's reason in a line a person reads. A plain value, safe for
// concurrent use.
type Placement struct {
	// Tier is the tier the segment got.
	Tier Tier
	// ReadLatency is the tier's read latency placement judged by: Source
	// "injected" where poold emulates a latency for the tier, "measured"
	// where it measured the tier, "hmat" where only the firmware's figure
	// is known; zero when nothing was known.
	ReadLatency Latency
	// ReadBandwidth is the tier's read bandwidth in bytes per second, 0
	// when not known; ReadBandwidthSource is "measured" or "injected".
	ReadBandwidth       int64
	ReadBandwidthSource string
	// MaxLatency and MinBandwidth are the budget asked for
	// (WithMaxLatency, WithMinBandwidth); zero for none.
	MaxLatency   time.Duration
	MinBandwidth int64
	// Reason says how the tier was chosen: the order tiers were tried in,
	// those left out by the budget, and those tried first that had no room.
	Reason string
}

// Placement says why the segment is on its tier, and false for a segment
// not placed by this client's Alloc (one attached by name): the decision
// is made at allocation and not kept.
func (s *Segment) Placement() (Placement, bool) {
	p := s.info.GetPlacement()
	if p == nil {
		return Placement{}, false
	}
	return Placement{
		Tier:        s.Tier(),
		ReadLatency: latencyFromProto(p.ReadLatency), ReadBandwidth: p.ReadBandwidthBps, ReadBandwidthSource: p.ReadBandwidthSource,
		MaxLatency: time.Duration(p.MaxReadLatencyNs), MinBandwidth: p.MinReadBandwidthBps, Reason: p.Reason,
	}, true
}
