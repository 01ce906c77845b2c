package alloc

import (
	"context"
	"fmt"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/redundancy"
)

// Redundancy is how many lost homes an rdma segment survives: none (the
// zero value), n full copies (Replicas) or k data and m parity shards
// (ErasureCoded). A plain value, safe to copy and to share between
// goroutines.
//
// What each costs and survives, on a pool of enough distinct hosts (the
// daemon places every copy or shard on its own host, in distinct zones
// while there are as many):
//
//   - Replicas(n): survives n-1 lost homes, holds n times the segment's
//     size of far memory. Writes and atomics go to the primary copy,
//     which applies them and forwards their effect to the other copies
//     before it answers: a write takes about two network round trips
//     instead of one. Reads take one, from the primary, or from another
//     copy when the primary does not answer.
//   - ErasureCoded(k, m): survives m lost homes, holds (k+m)/k times the
//     segment's size (1.5x for 4+2). The segment is cut into chunks of
//     4 KiB dealt round-robin over the k data shards; a write goes to the
//     data shards it touches, in parallel, and each updates the m parity
//     shards (Reed–Solomon) before it answers. Size is padded up to a whole
//     stripe (k chunks). Reading a chunk whose shard is lost fetches the
//     same range from k other shards and decodes it: a degraded read. A
//     write or atomic there goes through the client's poold, which
//     decodes the old bytes and updates the parity shards (milliseconds,
//     one at a time per segment; an atomic whose answer is lost is
//     ErrIndeterminate); with fewer than k+1 other shards up it fails with
//     ErrUnavailable until the pool rebuilds the shard.
//
// One limit of erasure coding: a data home lost in the middle of a write
// may have updated some parity shards and not others, so the stripe's
// parity disagrees about those bytes (the RAID write hole): reads and
// writes of them fail with ErrUnavailable until the pool's rebuild
// settles it, and losing a second data shard of that stripe before then
// decodes those bytes wrong. Copies have no such window.
//
// A segment that has lost homes but no more than its redundancy covers is
// degraded: every byte is still there and every call works (reads fail
// over to another home without an error), until the pool rebuilds the
// lost copy or shard elsewhere. More lost homes than that and the segment
// is lost (ErrSegmentLost).
type Redundancy struct {
	spec redundancy.Spec
	err  error // a constructor's argument out of range, reported by Alloc
}

// Replicas asks for n full copies on n distinct hosts; Replicas(1) is
// none, the zero Redundancy. n below 1 or above 64 makes Alloc fail with
// ErrInvalid.
func Replicas(n int) Redundancy {
	if n < 1 {
		return Redundancy{spec: redundancy.Spec{Replicas: n}, err: fmt.Errorf("%w: Replicas(%d): the number of copies must be at least 1 (1 means none) and at most %d", errs.ErrInvalid, n, redundancy.MaxHomes)}
	}
	return canonical(redundancy.Spec{Replicas: n})
}

// canonical is the Redundancy of s, every form of none the zero value, so
// that == compares what two Redundancy values protect.
func canonical(s redundancy.Spec) Redundancy {
	if s.None() {
		return Redundancy{}
	}
	return Redundancy{spec: s}
}

// ErasureCoded asks for k data and m parity shards on k+m distinct hosts:
// k ≥ 1, m ≥ 1 and k+m ≤ 64, else Alloc fails with ErrInvalid.
func ErasureCoded(k, m int) Redundancy {
	if k < 1 || m < 1 {
		return Redundancy{spec: redundancy.Spec{Data: k, Parity: m}, err: fmt.Errorf("%w: ErasureCoded(%d, %d): k and m must each be at least 1 and k+m at most %d; for no redundancy leave WithRedundancy out", errs.ErrInvalid, k, m, redundancy.MaxHomes)}
	}
	return Redundancy{spec: redundancy.Spec{Data: k, Parity: m}}
}

// OrFewer lets Alloc place fewer copies or shards than asked when the pool
// has too few distinct hosts (Segment.Redundancy says what it got),
// instead of failing with ErrNoCapacity. On none it changes nothing.
func (r Redundancy) OrFewer() Redundancy {
	if r.err == nil && !r.spec.None() {
		r.spec.Fallback = true
	}
	return r
}

// String is "none", "replicas=N" or "ec=K+M", with ",or-fewer" after
// OrFewer: the form ParseRedundancy, poold --default-redundancy and memctl
// read.
func (r Redundancy) String() string { return r.spec.String() }

// Survives is how many homes the segment can lose and keep every byte.
func (r Redundancy) Survives() int { return r.spec.Survives() }

// ParseRedundancy reads what String prints: "none", "replicas=N" or
// "ec=K+M", optionally followed by ",or-fewer". Errors match ErrInvalid
// and show the accepted forms.
func ParseRedundancy(s string) (Redundancy, error) {
	spec, err := redundancy.Parse(s)
	if err != nil {
		return Redundancy{}, err
	}
	return canonical(spec), nil
}

// validate is r's error, if a constructor or its numbers are out of range.
func (r Redundancy) validate() error {
	if r.err != nil {
		return r.err
	}
	return r.spec.Validate()
}

func (r Redundancy) proto() *poolv1.Redundancy {
	return &poolv1.Redundancy{Replicas: uint32(r.spec.Replicas), DataShards: uint32(r.spec.Data), ParityShards: uint32(r.spec.Parity), AllowFallback: r.spec.Fallback}
}

func redundancyFromProto(p *poolv1.Redundancy) Redundancy {
	return canonical(redundancy.Spec{Replicas: int(p.GetReplicas()), Data: int(p.GetDataShards()), Parity: int(p.GetParityShards()), Fallback: p.GetAllowFallback()})
}

// WithRedundancy keeps the segment's bytes through the loss of homes (see
// Redundancy). It applies to the rdma tier only: with TierAny (the
// default) it asks for TierRDMA; with TierLocal or TierCXL, or a fallback
// to them, Alloc fails with ErrInvalid, since a load/store segment is one
// host's memory mapped into its applications, whose stores no second copy
// would see. Out-of-range numbers fail with ErrInvalid before anything is
// sent; too few distinct hosts fail with ErrNoCapacity naming how many it
// needs and has, unless OrFewer. Default: the daemon's
// (poold --default-redundancy, none unless set).
func WithRedundancy(r Redundancy) AllocOption {
	return func(o *allocConfig) { o.redundancy = &r }
}

// checkRedundancy checks o's redundancy and puts it in req.
func (o *allocConfig) checkRedundancy(req *poolv1.AllocRequest) error {
	r := o.redundancy
	if r == nil {
		return nil
	}
	if err := r.validate(); err != nil {
		return err
	}
	if !r.spec.None() {
		for _, t := range append([]Tier{o.tier}, o.fallback...) {
			if t == TierLocal || t == TierCXL {
				return fmt.Errorf("%w: WithRedundancy(%s) with the %s tier: redundancy is for the rdma tier; a %s segment is one host's memory mapped into its applications, whose stores a copy elsewhere would not see; ask for TierRDMA or leave WithRedundancy out", ErrInvalid, r, t, t)
			}
		}
		if o.tier == TierAny {
			req.Tier = poolv1.Tier_TIER_RDMA
		}
	}
	req.Redundancy = r.proto()
	return nil
}

// RedundancyStatus is what a segment has now: the redundancy it was placed
// with (fewer copies or shards than asked only with OrFewer), its state
// and its homes. A plain value.
type RedundancyStatus struct {
	// Asked is the redundancy the segment was placed with.
	Asked Redundancy
	// State is "none" (not redundant), "ok" (every home holds its copy or
	// shard), "degraded" (homes are lost, no more than Asked survives, and
	// none is rebuilt yet), "rebuilding" (a lost home's copy or shard is
	// being filled elsewhere) or "lost" (more homes lost than Asked
	// survives: ErrSegmentLost).
	State string
	// Homes is one entry per copy (the primary first) or shard (data 0..k-1,
	// then parity 0..m-1).
	Homes []HomeStatus
}

// HomeStatus is one home of a redundant segment.
type HomeStatus struct {
	// Node is the host holding the copy or shard.
	Node string
	// Role is "primary", "backup", "data" or "parity".
	Role string
	// Index is the copy's place in the list, or the shard's number among
	// the data or among the parity shards.
	Index int
	// State is "ok", "lost" or "rebuilding".
	State string
}

var redundancyStates = map[poolv1.RedundancyState]string{
	poolv1.RedundancyState_REDUNDANCY_STATE_NONE:       "none",
	poolv1.RedundancyState_REDUNDANCY_STATE_OK:         "ok",
	poolv1.RedundancyState_REDUNDANCY_STATE_DEGRADED:   "degraded",
	poolv1.RedundancyState_REDUNDANCY_STATE_REBUILDING: "rebuilding",
	poolv1.RedundancyState_REDUNDANCY_STATE_LOST:       "lost",
}

var homeStates = map[poolv1.HomeState]string{
	poolv1.HomeState_HOME_STATE_OK:          "ok",
	poolv1.HomeState_HOME_STATE_LOST:        "lost",
	poolv1.HomeState_HOME_STATE_REBUILDING:  "rebuilding",
	poolv1.HomeState_HOME_STATE_UNREACHABLE: "unreachable",
}

// redundancyStatus is the status info describes.
func redundancyStatus(info *poolv1.Segment) RedundancyStatus {
	st := RedundancyStatus{Asked: redundancyFromProto(info.Redundancy), State: redundancyStates[info.RedundancyState]}
	k := int(info.GetRedundancy().GetDataShards())
	for i, h := range info.Homes {
		hs := HomeStatus{Node: h.Node, Index: i, State: homeStates[h.State]}
		switch {
		case st.Asked.spec.Coded() && i < k:
			hs.Role = "data"
		case st.Asked.spec.Coded():
			hs.Role, hs.Index = "parity", i-k
		case i == 0:
			hs.Role = "primary"
		default:
			hs.Role = "backup"
		}
		st.Homes = append(st.Homes, hs)
	}
	if st.State == "" {
		st.State = "none"
	}
	return st
}

// Redundancy says what protects the segment now: asked of the daemon
// (within WithDialTimeout), or, when it cannot be reached, what this client
// last learned (when it opened the segment or last failed over). A segment
// that is not redundant (every cxl and local one) has State "none".
func (s *Segment) Redundancy() RedundancyStatus {
	r, ok := s.base().(*redundant)
	if !ok {
		return redundancyStatus(s.info)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.c.opts.timeout)
	defer cancel()
	r.refresh(ctx, nil)
	return redundancyStatus(r.view.Load().info)
}
