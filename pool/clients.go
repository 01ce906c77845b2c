package pool

import (
	"sort"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/tier"
)

// clientInfos describes, for Status, every client that has a session or
// owns segments here: a client whose lease ran out is listed as long as its
// pinned (named or persistent) segments stay. Segments an administrator
// allocated (memctl alloc) have no owner and are in no client's counts.
// Sorted by bytes held, most first, then by id.
func (p *core) clientInfos() []*poolv1.ClientInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	byID := make(map[string]*poolv1.ClientInfo, len(p.clients))
	for id, c := range p.clients {
		ci := &poolv1.ClientInfo{Id: id, Name: c.name, Pid: c.pid, Uid: c.uid, Sessions: int64(c.sessions)}
		if c.sessions == 0 && !c.expires.IsZero() {
			ci.LeaseExpiresUnixMs = c.expires.UnixMilli()
		}
		byID[id] = ci
	}
	for _, r := range p.segs {
		if r.Owner == "" {
			continue
		}
		ci := byID[r.Owner]
		if ci == nil {
			ci = &poolv1.ClientInfo{Id: r.Owner}
			byID[r.Owner] = ci
		}
		ci.Segments++
		ci.Bytes += r.Size
	}
	out := make([]*poolv1.ClientInfo, 0, len(byID))
	for _, ci := range byID {
		out = append(out, ci)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Bytes != out[j].Bytes {
			return out[i].Bytes > out[j].Bytes
		}
		return out[i].Id < out[j].Id
	})
	return out
}

// tierOps reads the operation counters of the daemon's metrics registry
// into per-tier totals for Status: memctl top turns them into rates. They
// are the counters /metrics exports, so the two never disagree.
func (m *metrics) tierOps() []*poolv1.TierOps {
	byTier := map[string]*poolv1.TierOps{}
	opsOf := func(name string) *poolv1.TierOps {
		t := byTier[name]
		if t == nil {
			pt, err := tier.Parse(name)
			if err != nil {
				return nil
			}
			t = &poolv1.TierOps{Tier: pt}
			byTier[name] = t
		}
		return t
	}
	for _, t := range tier.Memory() {
		opsOf(tierName(t))
	}
	if m == nil {
		return sortedTierOps(byTier)
	}
	// On error Gather still returns what it collected, and the counters
	// read here cannot fail to collect.
	families, _ := m.reg.Gather()
	for _, f := range families {
		for _, mt := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range mt.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			t := opsOf(labels["tier"])
			if t == nil {
				continue
			}
			v := int64(mt.GetCounter().GetValue())
			switch f.GetName() {
			case metricsNamespace + "_allocations_total":
				t.Allocations += v
			case metricsNamespace + "_frees_total":
				t.Frees += v
			case metricsNamespace + "_dataplane_operations_total":
				switch labels["op"] {
				case "read":
					t.Reads += v
				case "write":
					t.Writes += v
				case "cas", "fadd":
					t.Atomics += v
				}
			case metricsNamespace + "_dataplane_bytes_total":
				switch labels["op"] {
				case "read":
					t.ReadBytes += v
				case "write":
					t.WriteBytes += v
				}
			}
		}
	}
	return sortedTierOps(byTier)
}

func sortedTierOps(byTier map[string]*poolv1.TierOps) []*poolv1.TierOps {
	out := make([]*poolv1.TierOps, 0, len(byTier))
	for _, t := range byTier {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Tier < out[j].Tier })
	return out
}
