package emulation

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/internal/size"
	"github.com/farmem/farmem/internal/tier"
)

// MaxLatency is the largest latency a spec may inject: far above any
// memory, low enough that a typo (2s for 2us) is caught.
const MaxLatency = time.Second

// Target is what emulation adds to one tier's accesses. The zero value
// injects nothing. A plain value, safe for concurrent use.
type Target struct {
	// Latency is the target duration of one call (ReadAt, WriteAt, an
	// atomic) moving no bytes; 0 injects nothing.
	Latency time.Duration
	// Bandwidth caps the bytes per second a call moves: a call of n bytes
	// takes Latency + n/Bandwidth. 0 means no cap.
	Bandwidth int64
}

// Zero reports whether t injects nothing.
func (t Target) Zero() bool { return t.Latency == 0 && t.Bandwidth == 0 }

// Duration is how long a call moving n bytes should take in all.
func (t Target) Duration(n int) time.Duration {
	d := t.Latency
	if t.Bandwidth > 0 && n > 0 {
		d += time.Duration(float64(n) * 1e9 / float64(t.Bandwidth))
	}
	return d
}

// String writes t as Parse reads it after "TIER=": "200ns", "2µs/12GB/s".
func (t Target) String() string {
	s := t.Latency.String()
	if t.Bandwidth > 0 {
		s += "/" + formatBandwidth(t.Bandwidth)
	}
	return s
}

// Spec is a target per tier, as --emulate-latency writes it. The zero value
// injects nothing. A tier can be named with a zero target ("cxl=0"), which
// turns emulation off for it when the spec overrides another (see
// Override). A plain value, safe for concurrent use; it implements
// pflag.Value and encoding.TextUnmarshaler so flags and YAML share one
// syntax.
type Spec struct {
	targets [4]Target // by poolv1.Tier
	named   [4]bool
}

// Parse reads a spec: "" or "none" for no emulation, else comma-separated
// TIER=LATENCY[/BANDWIDTH] items, e.g. "cxl=200ns,rdma=2us/12GB/s". TIER is
// local, cxl or rdma; LATENCY a Go duration (ns, us or µs, ms) from 0 to
// MaxLatency; BANDWIDTH bytes per second with a unit, e.g. 12GB/s or
// 800MiB/s. Errors are *SyntaxError.
func Parse(s string) (Spec, error) {
	var sp Spec
	text := strings.TrimSpace(s)
	if text == "" || text == "none" {
		return sp, nil
	}
	for item := range strings.SplitSeq(text, ",") {
		item = strings.TrimSpace(item)
		bad := func(reason, instead string) (Spec, error) {
			return Spec{}, &SyntaxError{Spec: s, Item: item, Reason: reason, Instead: instead}
		}
		if item == "" {
			return bad("an empty item (two commas, or a comma at an end)", "items separated by single commas, e.g. cxl=200ns,rdma=2us")
		}
		name, val, ok := strings.Cut(item, "=")
		name, val = strings.TrimSpace(name), strings.TrimSpace(val)
		if !ok {
			return bad("no TIER= before the latency", "TIER=LATENCY, e.g. cxl="+item)
		}
		t, terr := tier.ParseMemory(name)
		if unknown := (*tier.UnknownError)(nil); errors.As(terr, &unknown) {
			return bad(fmt.Sprintf("unknown tier %q", name), unknown.Valid()+" before the =, e.g. cxl="+val)
		}
		if sp.named[t] {
			return bad(fmt.Sprintf("tier %s is given twice", name), "each tier once")
		}
		lat, bw, hasBW := strings.Cut(val, "/")
		target, err := parseTarget(name, strings.TrimSpace(lat))
		if err != nil {
			return bad(err.reason, err.instead)
		}
		if hasBW {
			if target.Bandwidth, err = parseBandwidth(name, lat, strings.TrimSpace(bw)); err != nil {
				return bad(err.reason, err.instead)
			}
		}
		sp.targets[t], sp.named[t] = target, true
	}
	return sp, nil
}

// problem is a reason and what to write instead, before Parse adds the item.
type problem struct{ reason, instead string }

func parseTarget(tier, lat string) (Target, *problem) {
	if lat == "" {
		return Target{}, &problem{"no latency after the =", tier + "=200ns (or " + tier + "=0 for none)"}
	}
	if _, err := strconv.ParseFloat(lat, 64); err == nil && lat != "0" {
		return Target{}, &problem{fmt.Sprintf("latency %q has no unit", lat), tier + "=" + lat + "ns"}
	}
	d, err := time.ParseDuration(lat)
	switch {
	case err != nil:
		return Target{}, &problem{fmt.Sprintf("latency %q is not a duration", lat), "a duration such as " + tier + "=200ns, " + tier + "=1.5us or " + tier + "=2ms"}
	case d < 0:
		return Target{}, &problem{fmt.Sprintf("latency %q is negative", lat), tier + "=" + strings.TrimPrefix(lat, "-") + " (or " + tier + "=0 for none)"}
	case d > MaxLatency:
		return Target{}, &problem{fmt.Sprintf("latency %q is above the %s limit", lat, MaxLatency), "a latency up to 1s, e.g. " + tier + "=2ms"}
	}
	return Target{Latency: d}, nil
}

func parseBandwidth(tier, lat, bw string) (int64, *problem) {
	num, ok := strings.CutSuffix(bw, "/s")
	if !ok {
		return 0, &problem{fmt.Sprintf("bandwidth %q does not end in /s", bw), tier + "=" + lat + "/12GB/s"}
	}
	num = strings.TrimSpace(num)
	if i := strings.IndexFunc(num, func(r rune) bool { return (r < '0' || r > '9') && r != '.' }); i > 0 && isBits(num[i:]) {
		if n, err := strconv.ParseFloat(num[:i], 64); err == nil {
			bytes := formatBandwidth(int64(n * bitUnit(num[i:]) / 8))
			return 0, &problem{fmt.Sprintf("bandwidth %q is in bits", bw), fmt.Sprintf("bytes per second, e.g. %s=%s/%s", tier, lat, bytes)}
		}
	}
	n, err := size.Parse(num)
	switch {
	case err != nil:
		return 0, &problem{fmt.Sprintf("bandwidth %q is not a number of bytes per second", bw), tier + "=" + lat + "/12GB/s (units B, KB, MB, GB, KiB, MiB, GiB)"}
	case n == 0:
		return 0, &problem{fmt.Sprintf("bandwidth %q is zero", bw), tier + "=" + lat + " without a cap, or a positive bandwidth such as 12GB/s"}
	}
	return int64(n), nil
}

// isBits reports whether a unit is in bits (Gb, Gbit, Gbps, ...): an ending
// in a lower-case b that size.Parse would read as bytes.
func isBits(unit string) bool {
	u := strings.TrimSpace(unit)
	return strings.HasSuffix(u, "bit") || strings.HasSuffix(u, "bps") ||
		len(u) == 2 && strings.ContainsRune("kKmMgGtT", rune(u[0])) && u[1] == 'b'
}

func bitUnit(unit string) float64 {
	switch strings.ToLower(strings.TrimSpace(unit))[0] {
	case 'k':
		return 1e3
	case 'm':
		return 1e6
	case 'g':
		return 1e9
	case 't':
		return 1e12
	}
	return 1
}

// formatBandwidth writes bytes per second in the largest decimal unit that
// divides it exactly, so that Parse reads back the same number.
func formatBandwidth(bps int64) string {
	for _, u := range []struct {
		m    int64
		name string
	}{{1e12, "TB"}, {1e9, "GB"}, {1e6, "MB"}, {1e3, "KB"}} {
		if bps%u.m == 0 {
			return strconv.FormatInt(bps/u.m, 10) + u.name + "/s"
		}
	}
	return strconv.FormatInt(bps, 10) + "B/s"
}

// Target returns the target for tier t and whether the spec names t.
func (s Spec) Target(t poolv1.Tier) (Target, bool) {
	if t < 0 || int(t) >= len(s.targets) {
		return Target{}, false
	}
	return s.targets[t], s.named[t]
}

// With returns s with tier t set to target.
func (s Spec) With(t poolv1.Tier, target Target) Spec {
	if t >= 0 && int(t) < len(s.targets) {
		s.targets[t], s.named[t] = target, true
	}
	return s
}

// Override returns s with every tier that o names replaced by o's target
// (a client's spec over the daemon's: "cxl=0" turns the daemon's off).
func (s Spec) Override(o Spec) Spec {
	for t := range s.targets {
		if o.named[t] {
			s.targets[t], s.named[t] = o.targets[t], true
		}
	}
	return s
}

// Zero reports whether s injects nothing on any tier.
func (s Spec) Zero() bool {
	for _, t := range s.targets {
		if !t.Zero() {
			return false
		}
	}
	return true
}

// String writes s as Parse reads it: "" for an empty spec, else the named
// tiers in the order local, cxl, rdma.
func (s Spec) String() string {
	var parts []string
	for _, t := range tier.Memory() {
		if s.named[t] {
			parts = append(parts, tier.Name(t)+"="+s.targets[t].String())
		}
	}
	return strings.Join(parts, ",")
}

// Set implements flag.Value and pflag.Value.
func (s *Spec) Set(v string) error {
	sp, err := Parse(v)
	if err != nil {
		return err
	}
	*s = sp
	return nil
}

// Type implements pflag.Value.
func (s *Spec) Type() string { return "spec" }

// UnmarshalText implements encoding.TextUnmarshaler (YAML strings).
func (s *Spec) UnmarshalText(b []byte) error { return s.Set(string(b)) }

// MarshalText implements encoding.TextMarshaler.
func (s Spec) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
