// This file holds the per-tier summary of the devices, and tierName, the
// tier names (internal/tier) as records, metrics and listings use them.

package pool

import (
	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/tier"
)

// tiers summarizes devices per tier.
func (p *core) tiers() []*poolv1.TierInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	byTier := map[poolv1.Tier]*poolv1.TierInfo{}
	var order []poolv1.Tier
	var largest = map[poolv1.Tier]int64{}
	for _, d := range p.devs {
		ti := byTier[d.tier]
		if ti == nil {
			ti = &poolv1.TierInfo{Tier: d.tier, Kind: d.kindName(), NumaNode: int32(d.Node())}
			if d.tier == poolv1.Tier_TIER_RDMA {
				ti.Transport = "tcp"
			}
			byTier[d.tier] = ti
			order = append(order, d.tier)
		} else if ti.Kind != d.kindName() {
			ti.Kind += "+" + d.kindName()
		}
		st := d.ext.Stats()
		ti.Emulated = ti.Emulated || d.isEmulated()
		ti.Capacity += st.Capacity
		if d.usable {
			ti.Free += st.Free
		}
		ti.Devices = append(ti.Devices, d.Name())
		ti.Segments += int64(st.Allocated) // one extent per segment on the device
		largest[d.tier] = max(largest[d.tier], st.LargestFree)
		if d.note != "" {
			if ti.Note != "" {
				ti.Note += "; "
			}
			ti.Note += d.note
		}
	}
	out := make([]*poolv1.TierInfo, 0, len(order)+1)
	for _, t := range order {
		ti := byTier[t]
		if ti.Free > 0 {
			ti.Fragmentation = 1 - float64(largest[t])/float64(ti.Free)
		}
		p.addMeasured(ti)
		out = append(out, ti)
	}
	return out
}

// tierName is the tier's canonical name, used in records, flags, metrics
// and listings.
func tierName(t poolv1.Tier) string { return tier.Name(t) }
