package cluster

import (
	"math/bits"
	"math/rand/v2"
	"time"
)

// Pick chooses the member to place an allocation of size bytes on tier,
// among members that are Usable (alive, readable metadata, neither draining
// nor leaving), offer the tier with at least size bytes free, and are not
// named exclude (usually this node). It draws two distinct candidates at
// random and takes the one with the larger free fraction (free bytes over
// capacity) on the tier, the first drawn on a tie: the power of two random
// choices, which spreads load nearly as evenly as always taking the
// emptiest node without sending every node's allocations to the same peer
// at once. Comparing fractions rather than bytes fills hosts of different
// sizes to the same level: by bytes, a host twice as large takes every
// placement until its free bytes come down to the smaller host's, and ends
// much fuller (measured by the scale simulation in pool, docs/scale.md).
//
// When nobody fits it returns a *NoPeerError (matching ErrNoPeer and
// errs.ErrNoCapacity) whose Reason says why. rnd supplies randomness
// (a *rand.Rand is not safe for concurrent use; give each goroutine its
// own); nil uses math/rand/v2's global source. Pick does not modify members.
func Pick(members []Member, tier string, size int64, exclude string, rnd *rand.Rand) (Member, error) {
	return PickNear(members, tier, size, exclude, rnd, nil)
}

// Near reports the measured read latency from this node to the member
// named name; false when it is not measured. It must be safe to call
// from the goroutine that calls PickNear.
type Near func(name string) (time.Duration, bool)

// Weighing how near members are (PickNear): a candidate nearer than the
// other by more than nearFactor (its read latency times nearFactor is
// below the other's) wins although it is fuller, as long as its free
// fraction is at most nearSlack below the other's.
const (
	nearFactor = 1.25
	nearSlack  = 0.125
)

// PickNear is Pick that also weighs how near the two drawn candidates
// are: capacity first, so the emptier wins unless the other one is
// measured nearer by more than a quarter and its free fraction is within
// an eighth of the emptier's, in which case the nearer wins. A candidate
// that near does not report is compared by capacity alone: it is neither
// preferred nor passed over for lack of a figure, so a newly joined member
// still takes its share. A nil near is Pick.
func PickNear(members []Member, tier string, size int64, exclude string, rnd *rand.Rand, near Near) (Member, error) {
	if size < 0 || tier == "" {
		return Member{}, &NoPeerError{Tier: tier, Size: size, Reason: InvalidRequest}
	}
	intN := rand.IntN
	if rnd != nil {
		intN = rnd.IntN
	}
	e := NoPeerError{Tier: tier, Size: size}
	var fit [16]int
	cand := fit[:0] // indexes into members; no allocation for small clusters
	for i := range members {
		m := &members[i]
		if m.Name == exclude || m.State != StateAlive || m.MetaErr != nil {
			continue
		}
		e.Alive++
		if m.Meta.Draining || m.Leaving {
			continue
		}
		e.Usable++
		t, ok := m.Meta.Tier(tier)
		if !ok {
			continue
		}
		e.WithTier++
		if t.Free > e.MaxFree || e.MaxNode == "" {
			e.MaxFree, e.MaxNode = t.Free, m.Name
		}
		if t.Free >= size {
			cand = append(cand, i)
		}
	}
	switch len(cand) {
	case 0:
		switch {
		case e.Alive == 0:
			e.Reason = NoAlivePeer
		case e.Usable == 0:
			e.Reason = AllDraining
		case e.WithTier == 0:
			e.Reason = NoPeerWithTier
		default:
			e.Reason = NotEnoughFree
		}
		ne := e // only the failure path allocates
		return Member{}, &ne
	case 1:
		return members[cand[0]].clone(), nil
	}
	a := intN(len(cand))
	b := intN(len(cand) - 1)
	if b >= a {
		b++ // distinct from a, uniform over the rest
	}
	ma, mb := &members[cand[a]], &members[cand[b]]
	ta, _ := ma.Meta.Tier(tier)
	tb, _ := mb.Meta.Tier(tier)
	if first := nearer(near, ma.Name, mb.Name, ta, tb); first != 0 {
		if first > 0 {
			return ma.clone(), nil
		}
		return mb.clone(), nil
	}
	if freerThan(tb, ta) {
		return mb.clone(), nil
	}
	return ma.clone(), nil
}

// nearer is 1 when a wins by being nearer (see PickNear), -1 when b does,
// and 0 when capacity decides: either is unmeasured, neither is nearer by
// more than nearFactor, or the nearer one is fuller by more than nearSlack.
func nearer(near Near, a, b string, ta, tb TierFree) int {
	if near == nil {
		return 0
	}
	la, okA := near(a)
	lb, okB := near(b)
	if !okA || !okB || la <= 0 || lb <= 0 {
		return 0
	}
	fa, fb := fraction(ta), fraction(tb)
	switch {
	case float64(la)*nearFactor < float64(lb) && fa >= fb-nearSlack:
		return 1
	case float64(lb)*nearFactor < float64(la) && fb >= fa-nearSlack:
		return -1
	}
	return 0
}

// fraction is t's free fraction; 0 for a tier without capacity.
func fraction(t TierFree) float64 {
	if t.Capacity <= 0 || t.Free <= 0 {
		return 0
	}
	return float64(t.Free) / float64(t.Capacity)
}

// freerThan reports whether a has a larger free fraction than b:
// a.Free/a.Capacity > b.Free/b.Capacity, compared exactly as 128-bit cross
// products (byte counts up to 2^63 would overflow int64). A tier of zero
// capacity has nothing free and loses to any tier with free bytes.
func freerThan(a, b TierFree) bool {
	if a.Capacity <= 0 || a.Free <= 0 {
		return false
	}
	if b.Capacity <= 0 || b.Free <= 0 {
		return true
	}
	ah, al := bits.Mul64(uint64(a.Free), uint64(b.Capacity))
	bh, bl := bits.Mul64(uint64(b.Free), uint64(a.Capacity))
	return ah > bh || (ah == bh && al > bl)
}
