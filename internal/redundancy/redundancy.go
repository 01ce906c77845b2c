package redundancy

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/farmem/farmem/internal/errs"
)

// MaxHomes is the most copies, or data plus parity shards, a segment may
// have.
const MaxHomes = 64

// Spec is a segment's redundancy. The zero Spec is none.
type Spec struct {
	// Replicas: full copies on distinct hosts; 0 (or 1) with no shards is
	// none.
	Replicas int
	// Data and Parity: erasure coding with Data data shards and Parity
	// parity shards on Data+Parity distinct hosts.
	Data, Parity int
	// Fallback: with too few distinct hosts, place fewer copies or shards
	// and say so, instead of failing with errs.ErrNoCapacity.
	Fallback bool
}

// None reports whether s asks for no redundancy.
func (s Spec) None() bool { return s.Replicas <= 1 && s.Data == 0 && s.Parity == 0 }

// Coded reports whether s is erasure coding.
func (s Spec) Coded() bool { return s.Data > 0 || s.Parity > 0 }

// Homes is how many distinct hosts s needs: n copies or k+m shards (1 for
// none).
func (s Spec) Homes() int {
	switch {
	case s.Coded():
		return s.Data + s.Parity
	case s.Replicas > 1:
		return s.Replicas
	}
	return 1
}

// Survives is how many homes s can lose and keep every byte: n-1 copies
// or m shards.
func (s Spec) Survives() int {
	if s.Coded() {
		return s.Parity
	}
	return max(s.Replicas-1, 0)
}

// Validate checks s's numbers; the error matches errs.ErrInvalid and says
// the allowed range.
func (s Spec) Validate() error {
	switch {
	case s.Replicas < 0:
		return fmt.Errorf("%w: replicas=%d: the number of copies must be at least 1 (1 means none)", errs.ErrInvalid, s.Replicas)
	case s.Coded() && s.Replicas > 1:
		return fmt.Errorf("%w: replicas=%d with ec=%d+%d: choose copies or erasure coding, not both", errs.ErrInvalid, s.Replicas, s.Data, s.Parity)
	case s.Coded() && s.Data < 1:
		return fmt.Errorf("%w: ec=%d+%d: erasure coding needs at least 1 data shard (k ≥ 1)", errs.ErrInvalid, s.Data, s.Parity)
	case s.Coded() && s.Parity < 1:
		return fmt.Errorf("%w: ec=%d+%d: erasure coding needs at least 1 parity shard (m ≥ 1); for no redundancy say none", errs.ErrInvalid, s.Data, s.Parity)
	case s.Homes() > MaxHomes:
		return fmt.Errorf("%w: %s needs %d homes; at most %d are allowed", errs.ErrInvalid, s, s.Homes(), MaxHomes)
	}
	return nil
}

// String is the text form Parse reads: "none", "replicas=N" or "ec=K+M",
// with ",or-fewer" when Fallback is set.
func (s Spec) String() string {
	var out string
	switch {
	case s.Coded():
		out = fmt.Sprintf("ec=%d+%d", s.Data, s.Parity)
	case s.Replicas > 1:
		out = fmt.Sprintf("replicas=%d", s.Replicas)
	default:
		out = "none"
	}
	if s.Fallback && !s.None() {
		out += ",or-fewer"
	}
	return out
}

// Parse reads "none" (or ""), "replicas=N", "ec=K+M", each optionally
// followed by ",or-fewer" (Fallback), and validates the result. Errors
// match errs.ErrInvalid and show the accepted forms.
func Parse(text string) (Spec, error) {
	t := strings.ToLower(strings.TrimSpace(text))
	var s Spec
	if rest, ok := strings.CutSuffix(t, ",or-fewer"); ok {
		t, s.Fallback = rest, true
	}
	bad := func(why string) (Spec, error) {
		return Spec{}, fmt.Errorf("%w: redundancy %q: %s; say none, replicas=N (2 ≤ N ≤ %d) or ec=K+M (K, M ≥ 1, K+M ≤ %d), optionally followed by ,or-fewer",
			errs.ErrInvalid, text, why, MaxHomes, MaxHomes)
	}
	switch {
	case t == "" || t == "none":
		if s.Fallback {
			return bad("or-fewer needs copies or shards")
		}
		return s, nil
	case strings.HasPrefix(t, "replicas="):
		n, err := strconv.Atoi(strings.TrimPrefix(t, "replicas="))
		if err != nil {
			return bad("the number of copies is not a whole number")
		}
		if n < 1 {
			return bad("the number of copies must be at least 1")
		}
		if n > 1 { // one copy is no redundancy: none, as String says
			s.Replicas = n
		}
	case strings.HasPrefix(t, "ec="):
		k, m, ok := strings.Cut(strings.TrimPrefix(t, "ec="), "+")
		if !ok {
			return bad("erasure coding is written ec=K+M")
		}
		var err1, err2 error
		s.Data, err1 = strconv.Atoi(k)
		s.Parity, err2 = strconv.Atoi(m)
		if err1 != nil || err2 != nil {
			return bad("K and M must be whole numbers")
		}
		if s.Data < 1 || s.Parity < 1 {
			return bad("K and M must each be at least 1")
		}
	default:
		return bad("unknown form")
	}
	if err := s.Validate(); err != nil {
		return Spec{}, err
	}
	return s, nil
}
