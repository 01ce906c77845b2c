package main

import (
	"fmt"
	"slices"
	"strings"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/redundancy"
	"github.com/farmem/farmem/internal/tier"
)

// tierJSON is a tier as -o json prints it.
type tierJSON struct {
	Tier           string       `json:"tier"`
	Kind           string       `json:"kind"`
	Emulated       bool         `json:"emulated"`
	Capacity       int64        `json:"capacity"`
	Free           int64        `json:"free"`
	Segments       int64        `json:"segments"`
	Devices        []string     `json:"devices"`
	Fragmentation  float64      `json:"fragmentation"`
	Transport      string       `json:"transport,omitempty"`
	ReadLatency    *latencyJSON `json:"read_latency,omitempty"`
	WriteLatency   *latencyJSON `json:"write_latency,omitempty"`
	HMATRead       *latencyJSON `json:"hmat_read_latency,omitempty"`
	ReadBandwidth  int64        `json:"read_bandwidth_bps,omitempty"`
	WriteBandwidth int64        `json:"write_bandwidth_bps,omitempty"`
	// Injected is the tier's latency emulation; when set, read_latency and
	// write_latency have source "injected" and measured_* hold what was
	// measured of the real memory.
	Injected      *injectedJSON `json:"injected,omitempty"`
	MeasuredRead  *latencyJSON  `json:"measured_read_latency,omitempty"`
	MeasuredWrite *latencyJSON  `json:"measured_write_latency,omitempty"`
	Note          string        `json:"note,omitempty"`
}

type injectedJSON struct {
	LatencyNs    int64 `json:"latency_ns"`
	BandwidthBps int64 `json:"bandwidth_bps,omitempty"`
}

type latencyJSON struct {
	P50Ns   int64  `json:"p50_ns"`
	P99Ns   int64  `json:"p99_ns"`
	Samples int64  `json:"samples"`
	Source  string `json:"source"`
}

func latency(l *poolv1.Latency) *latencyJSON {
	if l == nil || l.Samples == 0 && l.P50Ns == 0 {
		return nil
	}
	return &latencyJSON{P50Ns: l.P50Ns, P99Ns: l.P99Ns, Samples: l.Samples, Source: l.Source}
}

func tierView(t *poolv1.TierInfo) tierJSON {
	v := tierJSON{
		Tier: tier.Name(t.Tier), Kind: t.Kind, Emulated: t.Emulated, Capacity: t.Capacity, Free: t.Free,
		Segments: t.Segments, Devices: t.Devices, Fragmentation: t.Fragmentation, Transport: t.Transport,
		ReadLatency: latency(t.ReadLatency), WriteLatency: latency(t.WriteLatency), HMATRead: latency(t.HmatReadLatency),
		ReadBandwidth: t.ReadBandwidthBps, WriteBandwidth: t.WriteBandwidthBps, Note: t.Note,
		MeasuredRead: latency(t.MeasuredReadLatency), MeasuredWrite: latency(t.MeasuredWriteLatency),
	}
	if e := t.Injected; e != nil {
		v.Injected = &injectedJSON{LatencyNs: e.LatencyNs, BandwidthBps: e.BandwidthBps}
	}
	return v
}

// segmentJSON is a segment as -o json prints it.
type segmentJSON struct {
	ID           uint64   `json:"id"`
	Name         string   `json:"name"`
	Tier         string   `json:"tier"`
	Size         int64    `json:"size"`
	Emulated     bool     `json:"emulated"`
	Node         string   `json:"node"`
	Kind         string   `json:"kind"`
	Device       string   `json:"device"`
	NUMANode     int32    `json:"numa_node"`
	Offset       int64    `json:"offset"`
	State        string   `json:"state"`
	Owner        string   `json:"owner"`
	Persist      bool     `json:"persist"`
	LeaseExpires string   `json:"lease_expires,omitempty"`
	Created      string   `json:"created"`
	Attached     []string `json:"attached,omitempty"`
	// Creator is the identity that created a named segment; Allow and
	// AllowFree the identities it granted attach, and attach and free.
	Creator   string   `json:"creator,omitempty"`
	Allow     []string `json:"allow,omitempty"`
	AllowFree []string `json:"allow_free,omitempty"`
	// Sharers counts the segment's shared attachments (alloc.Shared) that
	// its home heard from within two leases.
	Sharers uint32 `json:"sharers"`
	// A redundant segment: its redundancy as placed ("replicas=2",
	// "ec=4+2"), how much of it holds (ok, degraded, rebuilding, lost), its
	// homes, and for erasure coding the bytes of a shard in a stripe.
	Redundancy      string     `json:"redundancy,omitempty"`
	RedundancyState string     `json:"redundancy_state,omitempty"`
	Homes           []homeJSON `json:"homes,omitempty"`
	ShardChunk      int64      `json:"shard_chunk,omitempty"`
	// While it rebuilds, RebuiltBytes of the RebuildBytes its new homes
	// hold are copied.
	RebuiltBytes int64 `json:"rebuilt_bytes,omitempty"`
	RebuildBytes int64 `json:"rebuild_bytes,omitempty"`
}

// homeJSON is one copy or shard of a redundant segment.
type homeJSON struct {
	Node   string `json:"node"`
	HomeID uint64 `json:"home_id"`
	Role   string `json:"role"` // primary, backup, data, parity
	Index  int    `json:"index"`
	State  string `json:"state"` // ok, lost, rebuilding
	// MovingTo is, while the home moves live off its host (an
	// evacuation), the node its replacement is filled on.
	MovingTo string `json:"moving_to,omitempty"`
}

// redundancyName is a segment's redundancy as placed ("replicas=2",
// "ec=4+2"), "" for none.
func redundancyName(s *poolv1.Segment) string {
	r := s.Redundancy
	if r == nil || len(s.Homes) == 0 {
		return ""
	}
	return redundancy.Spec{Replicas: int(r.Replicas), Data: int(r.DataShards), Parity: int(r.ParityShards)}.String()
}

// homeRole is the role and index of home i of a redundant segment.
func homeRole(s *poolv1.Segment, i int) (string, int) {
	k := int(s.GetRedundancy().GetDataShards())
	switch {
	case k > 0 && i < k:
		return "data", i
	case k > 0:
		return "parity", i - k
	case i == 0:
		return "primary", 0
	}
	return "backup", i - 1
}

func lowerEnum(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }

func segmentView(s *poolv1.Segment) segmentJSON {
	v := segmentJSON{
		ID: s.Id, Name: s.Name, Tier: tier.Name(s.Tier), Size: s.Size, Emulated: s.Emulated, Node: s.Node,
		Kind: s.Kind, Device: s.Device, NUMANode: s.NumaNode, Offset: s.Offset, State: stateName(s.State),
		Owner: s.Owner, Persist: s.Persist, Created: time.UnixMilli(s.CreatedUnixMs).UTC().Format(time.RFC3339),
		Attached: s.Attached, Sharers: s.Sharers, Creator: s.Creator, Allow: s.Allow, AllowFree: s.AllowFree,
	}
	if s.LeaseExpiresUnixMs != 0 {
		v.LeaseExpires = time.UnixMilli(s.LeaseExpiresUnixMs).UTC().Format(time.RFC3339Nano)
	}
	if name := redundancyName(s); name != "" {
		v.Redundancy, v.RedundancyState, v.ShardChunk = name, lowerEnum(s.RedundancyState.String(), "REDUNDANCY_STATE_"), s.ShardChunk
		v.RebuiltBytes, v.RebuildBytes = rebuildProgress(s)
		for i, h := range s.Homes {
			role, idx := homeRole(s, i)
			v.Homes = append(v.Homes, homeJSON{Node: h.Node, HomeID: h.HomeId, Role: role, Index: idx, State: lowerEnum(h.State.String(), "HOME_STATE_"), MovingTo: h.MovingTo})
		}
	}
	return v
}

// redundancyCell is a segment's REDUNDANCY column: "replicas=2 ok",
// "ec=4+2 degraded", "replicas=2 rebuilding 37%" (the share of its new
// homes' bytes copied so far), "ec=4+2 moving 60%" (every home holds its
// shard, and one moves off its host), "-" for none.
func redundancyCell(v segmentJSON) string {
	if v.Redundancy == "" {
		return "-"
	}
	state := v.RedundancyState
	if state == "ok" && slices.ContainsFunc(v.Homes, func(h homeJSON) bool { return h.MovingTo != "" }) {
		state = "moving"
	}
	if v.RebuildBytes > 0 {
		return fmt.Sprintf("%s %s %d%%", v.Redundancy, state, v.RebuiltBytes*100/v.RebuildBytes)
	}
	return v.Redundancy + " " + state
}

// homesLine lists a redundant segment's homes, e.g. "b (primary, ok), c
// (backup, lost)".
func homesLine(v segmentJSON) string {
	parts := make([]string, len(v.Homes))
	for i, h := range v.Homes {
		role := h.Role
		if role == "data" || role == "parity" {
			role = fmt.Sprintf("%s %d", role, h.Index)
		}
		state := h.State
		if h.MovingTo != "" {
			state += ", moving to " + h.MovingTo
		}
		parts[i] = fmt.Sprintf("%s (%s, %s)", h.Node, role, state)
	}
	return strings.Join(parts, ", ")
}

func stateName(s poolv1.SegmentState) string {
	return strings.ToLower(strings.TrimPrefix(s.String(), "SEGMENT_STATE_"))
}

// reality says plainly whether a tier or segment is the hardware it names.
func reality(emulated bool) string {
	if emulated {
		return "EMULATED"
	}
	return "real"
}

// human prints bytes for people.
func human(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
