package size

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrSyntax is returned for a string that is not a byte size.
var ErrSyntax = errors.New("not a byte size: write a whole number with an optional unit, e.g. 4096, 64KiB, 256MiB, 1GiB, 2G")

// Size is a number of bytes. A plain value, safe for concurrent use.
type Size int64

// Common sizes.
const (
	KiB Size = 1 << 10
	MiB Size = 1 << 20
	GiB Size = 1 << 30
	TiB Size = 1 << 40
)

// units maps the accepted suffixes (lower case) to multipliers. Decimal
// spellings (KB, MB, GB) mean powers of 1000; the binary ones powers of 1024;
// bare K, M, G, T mean powers of 1024, as in dd and most memory tools.
var units = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "tib": 1 << 40, "tb": 1e12,
}

// Parse reads a size such as "64MiB", "1.5GiB", "2G" or "4096".
func Parse(s string) (Size, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	mult, ok := units[unit]
	if num == "" || !ok {
		return 0, fmt.Errorf("%q: %w", s, ErrSyntax)
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n > math.MaxInt64/mult {
			return 0, fmt.Errorf("%q: %w", s, ErrSyntax)
		}
		return Size(n * mult), nil
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil || f*float64(mult) >= math.MaxInt64 {
		return 0, fmt.Errorf("%q: %w", s, ErrSyntax)
	}
	return Size(f * float64(mult)), nil
}

// String prints the size in the largest binary unit that divides it exactly
// (so that Parse(String()) round-trips), e.g. "64MiB", "1536KiB", "100B".
func (s Size) String() string {
	if s == 0 {
		return "0B"
	}
	for _, u := range []struct {
		m    Size
		name string
	}{{TiB, "TiB"}, {GiB, "GiB"}, {MiB, "MiB"}, {KiB, "KiB"}} {
		if s%u.m == 0 {
			return strconv.FormatInt(int64(s/u.m), 10) + u.name
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}

// Human prints the size rounded for people, e.g. "1.5 GiB".
func (s Size) Human() string {
	v := float64(s)
	for _, u := range []string{"B", "KiB", "MiB", "GiB", "TiB"} {
		if math.Abs(v) < 1024 || u == "TiB" {
			if u == "B" {
				return fmt.Sprintf("%d B", int64(s))
			}
			return fmt.Sprintf("%.1f %s", v, u)
		}
		v /= 1024
	}
	return ""
}

// Set implements flag.Value.
func (s *Size) Set(v string) error {
	n, err := Parse(v)
	if err != nil {
		return err
	}
	*s = n
	return nil
}

// Type implements pflag.Value.
func (s *Size) Type() string { return "size" }

// UnmarshalText implements encoding.TextUnmarshaler (YAML, JSON strings).
func (s *Size) UnmarshalText(b []byte) error { return s.Set(string(b)) }

// MarshalText implements encoding.TextMarshaler.
func (s Size) MarshalText() ([]byte, error) { return []byte(s.String()), nil }
