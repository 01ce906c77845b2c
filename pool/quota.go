package pool

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/tier"
)

// Quotas limits the bytes an identity may hold per tier: identity ("uid:N",
// "cn:NAME", "insecure", or "default" for every identity without an entry
// of its own) → tier name (local, cxl, rdma) → bytes. A tier missing from
// an identity's entry falls back to the default's; missing from both, it is
// unlimited. In YAML:
//
//	quotas:
//	  default: {cxl: 1GiB, rdma: 4GiB}
//	  uid:1000: {cxl: 8GiB}
//
// As a flag (repeatable): --quota uid:1000/cxl=8GiB. A plain value, not
// safe for concurrent mutation.
type Quotas map[string]map[string]size.Size

// String implements pflag.Value: the entries as the flag takes them.
func (q Quotas) String() string {
	var out []string
	for _, id := range slices.Sorted(maps.Keys(q)) {
		for _, t := range slices.Sorted(maps.Keys(q[id])) {
			out = append(out, fmt.Sprintf("%s/%s=%s", id, t, q[id][t]))
		}
	}
	return strings.Join(out, ",")
}

// Type implements pflag.Value.
func (q *Quotas) Type() string { return "quota" }

// Set implements pflag.Value: adds IDENTITY/TIER=SIZE entries, several
// separated by commas.
func (q *Quotas) Set(v string) error {
	for _, e := range strings.Split(v, ",") {
		id, rest, ok1 := strings.Cut(e, "/")
		tier, sz, ok2 := strings.Cut(rest, "=")
		if !ok1 || !ok2 || id == "" {
			return fmt.Errorf("quota %q: write IDENTITY/TIER=SIZE, e.g. uid:1000/cxl=8GiB or default/rdma=4GiB", e)
		}
		n, err := size.Parse(sz)
		if err != nil {
			return fmt.Errorf("quota %q: %w", e, err)
		}
		if *q == nil {
			*q = Quotas{}
		}
		if (*q)[id] == nil {
			(*q)[id] = map[string]size.Size{}
		}
		(*q)[id][tier] = n
	}
	return nil
}

// validate reports the first entry that cannot work.
func (q Quotas) validate() error {
	for id, tiers := range q {
		if id == "" {
			return fmt.Errorf("%w: quotas: an empty identity; use uid:N, cn:NAME, insecure or default", ErrConfig)
		}
		seen := map[poolv1.Tier]string{}
		for _, t := range slices.Sorted(maps.Keys(tiers)) {
			n := tiers[t]
			pt, err := tier.ParseMemory(t)
			if err != nil {
				return fmt.Errorf("%w: quotas.%s: %w", ErrConfig, id, err)
			}
			if prev, ok := seen[pt]; ok {
				return fmt.Errorf("%w: quotas.%s: %q and %q name the same tier; keep one", ErrConfig, id, prev, t)
			}
			seen[pt] = t
			if n <= 0 {
				return fmt.Errorf("%w: quotas.%s.%s is %d; give a positive size (leave the tier out for no quota)", ErrConfig, id, t, n)
			}
		}
	}
	return nil
}

// limit is ident's quota on tier t and the entry it comes from; 0 for
// none. An entry names its tier in any letter case, as tier.ParseMemory
// reads it.
func (q Quotas) limit(ident string, t poolv1.Tier) (int64, string) {
	for _, id := range []string{ident, identityDefault} {
		for name, n := range q[id] {
			if pt, err := tier.ParseMemory(name); err == nil && pt == t {
				return int64(n), id
			}
		}
	}
	return 0, ""
}

// usage counts, per owner (client id), the segments it holds and their
// bytes per tier, for quotas and the per-client segment limit. It is safe
// for concurrent use; the core updates it as segments come and go.
type usage struct {
	mu      sync.Mutex
	byOwner map[string]*ownerUsage
}

type ownerUsage struct {
	segments int
	bytes    map[string]int64 // tier name -> bytes
}

func (u *usage) change(r *record, sign int) {
	if r.Owner == "" {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.byOwner == nil {
		u.byOwner = map[string]*ownerUsage{}
	}
	o := u.byOwner[r.Owner]
	if o == nil {
		o = &ownerUsage{bytes: map[string]int64{}}
		u.byOwner[r.Owner] = o
	}
	o.segments += sign
	o.bytes[tierName(r.Tier)] += int64(sign) * r.Size
	if o.segments <= 0 {
		delete(u.byOwner, r.Owner)
	}
}

// add counts a segment placed (or restored) for its owner.
func (u *usage) add(r *record) { u.change(r, 1) }

// sub uncounts a segment released or unplaced.
func (u *usage) sub(r *record) { u.change(r, -1) }

// of returns what the owners hold together: segments, and bytes on tier.
func (u *usage) of(owners []string, tier string) (segments int, bytes int64) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, id := range owners {
		if o := u.byOwner[id]; o != nil {
			segments += o.segments
			bytes += o.bytes[tier]
		}
	}
	return segments, bytes
}

// admit checks a placement of n bytes on tier t for the caller against the
// per-client segment limit (an error: ErrLimit) and the caller identity's
// quota on t (a reason to try the next tier, returned as why; the caller
// ends with ErrNoCapacity naming it). Administrators (no session) are not
// limited.
func (p *core) admit(c caller, t poolv1.Tier, n int64) (why string, err error) {
	if c.client == nil {
		return "", nil
	}
	tier := tierName(t)
	if max := p.cfg.MaxSegmentsPerClient; max > 0 {
		if segs, _ := p.usage.of([]string{c.client.id}, tier); segs >= max {
			return "", fmt.Errorf("%w: client %q holds %d segments, the most one client may hold (max-segments-per-client %d); free some, use an alloc.Arena for many small objects, or raise --max-segments-per-client", errs.ErrLimit, c.client.id, segs, max)
		}
	}
	ident := p.auth.identity(c.client.id)
	quota, entry := p.cfg.Quotas.limit(ident, t)
	if quota == 0 {
		return "", nil
	}
	_, held := p.usage.of(p.auth.owners(ident), tier)
	if held+n <= quota {
		return "", nil
	}
	return fmt.Sprintf("%s: quota of %s (quotas.%s.%s = %s) would be exceeded: it holds %s, asked for %s more; free segments, or raise it in poold's config or with --quota %s/%s=SIZE",
		tier, ident, entry, tier, size.Size(quota).Human(), size.Size(held).Human(), size.Size(n).Human(), entry, tier), nil
}

// quotaUsage lists, for Status, what each identity holds per tier beside
// its quota: identities that hold something or have a quota of their own,
// sorted by identity and tier.
func (p *core) quotaUsage() []*poolv1.QuotaUsage {
	p.auth.load()
	p.auth.mu.Lock()
	byIdent := map[string][]string{}
	for id, ident := range p.auth.bound {
		byIdent[ident] = append(byIdent[ident], id)
	}
	p.auth.mu.Unlock()
	for ident := range p.cfg.Quotas {
		if _, ok := byIdent[ident]; !ok {
			byIdent[ident] = nil
		}
	}
	var out []*poolv1.QuotaUsage
	for _, ident := range slices.Sorted(maps.Keys(byIdent)) {
		for _, t := range tier.Memory() {
			_, used := p.usage.of(byIdent[ident], tierName(t))
			quota, entry := p.cfg.Quotas.limit(ident, t)
			if used == 0 && (quota == 0 || entry != ident) {
				continue
			}
			out = append(out, &poolv1.QuotaUsage{Identity: ident, Tier: t, UsedBytes: used, QuotaBytes: quota})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Identity < out[j].Identity })
	return out
}

// IDList is a list of uids or gids, as a flag (comma-separated, repeatable)
// and in YAML (a sequence). A plain value.
type IDList []uint32

// String implements pflag.Value.
func (l IDList) String() string {
	s := make([]string, len(l))
	for i, v := range l {
		s[i] = strconv.FormatUint(uint64(v), 10)
	}
	return strings.Join(s, ",")
}

// Type implements pflag.Value.
func (l *IDList) Type() string { return "ids" }

// Set implements pflag.Value: it replaces the list with the comma-separated ids.
func (l *IDList) Set(v string) error {
	var out IDList
	for _, f := range strings.Split(v, ",") {
		n, err := strconv.ParseUint(strings.TrimSpace(f), 10, 32)
		if err != nil {
			return fmt.Errorf("id %q: give a numeric uid or gid", f)
		}
		out = append(out, uint32(n))
	}
	*l = out
	return nil
}
