package tier

import (
	"fmt"
	"slices"
	"strings"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// names are the canonical names, by tier. "any" is the unspecified tier: a
// request that lets the daemon choose.
var names = [...]string{
	poolv1.Tier_TIER_UNSPECIFIED: "any",
	poolv1.Tier_TIER_LOCAL:       "local",
	poolv1.Tier_TIER_CXL:         "cxl",
	poolv1.Tier_TIER_RDMA:        "rdma",
}

// memory are the tiers of memory (not "any"), in the order listings and
// specs write them.
var memory = [...]poolv1.Tier{poolv1.Tier_TIER_LOCAL, poolv1.Tier_TIER_CXL, poolv1.Tier_TIER_RDMA}

// Name returns t's canonical name: any, local, cxl or rdma; tier(N) for a
// value outside the enum.
func Name(t poolv1.Tier) string {
	if t >= 0 && int(t) < len(names) {
		return names[t]
	}
	return fmt.Sprintf("tier(%d)", int32(t))
}

// Names returns a new slice of every tier's name, the ones Parse reads: any, local, cxl
// and rdma, in that order.
func Names() []string { return slices.Clone(names[:]) }

// Memory returns a new slice of the tiers of memory, local, cxl and rdma, in that order.
func Memory() []poolv1.Tier { return slices.Clone(memory[:]) }

// Parse reads a tier name in any letter case: any, local, cxl or rdma
// ("any" is TIER_UNSPECIFIED). Anything else is an *UnknownError.
func Parse(s string) (poolv1.Tier, error) {
	for t, n := range names {
		if strings.EqualFold(s, n) {
			return poolv1.Tier(t), nil
		}
	}
	return 0, &UnknownError{Name: s, Any: true}
}

// ParseMemory reads the name of a tier of memory in any letter case:
// local, cxl or rdma, for settings that hold one tier's value (quotas,
// latency emulation). "any" and anything else is an *UnknownError.
func ParseMemory(s string) (poolv1.Tier, error) {
	for _, t := range memory {
		if strings.EqualFold(s, names[t]) {
			return t, nil
		}
	}
	return 0, &UnknownError{Name: s}
}
