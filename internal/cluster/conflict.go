package cluster

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/hashicorp/memberlist"
)

// ErrNameConflict means another live member already gossips under this
// node's name from another address. memberlist keeps the first holder and
// ignores the newcomer, which would otherwise believe it joined while no
// peer ever sees it. The concrete error is a *NameConflictError naming the
// holder; give every node a unique name.
var ErrNameConflict = errors.New("cluster: node name already used by a live member")

// NameConflictError is what Join returns when a seed's view holds a live
// member with this node's name at another address. A value; safe to share.
type NameConflictError struct {
	Name   string // the contested node name
	Holder string // gossip address (host:port) of the live member that holds it
	Self   string // this node's own gossip address
}

// Error names the holder and says what to do.
func (e *NameConflictError) Error() string {
	return fmt.Sprintf("cluster: node name %q is already used by a live member at %s (this node gossips at %s); "+
		"give each poold a unique name with --node (it defaults to the host name)", e.Name, e.Holder, e.Self)
}

// Is reports ErrNameConflict as a match.
func (e *NameConflictError) Is(target error) bool { return target == ErrNameConflict }

// Conflict is one name claimed by two addresses, as this node saw it: the
// member it knows (Known, which is this node itself when Self) and the other
// address that claimed the same name (Claimant). A value.
type Conflict struct {
	Name     string
	Known    string    // address of the member this node keeps under Name
	Claimant string    // address of the node that also claimed Name
	Self     bool      // Name is this node's own name
	First    time.Time // when this node first saw the claim
	Last     time.Time // when it saw the claim last (memberlist repeats it with every gossip of the claimant)
	Count    uint64    // how often it saw the claim
}

// maxConflicts bounds the conflict table; the oldest entries give way.
const maxConflicts = 16

// conflictTable remembers recent name conflicts. Guarded by Cluster.mu.
type conflictTable []Conflict

// note records a claim of name by claimant while known holds it, and
// returns the entry.
func (t *conflictTable) note(name, known, claimant string, self bool, now time.Time) Conflict {
	for i := range *t {
		c := &(*t)[i]
		if c.Name == name && c.Known == known && c.Claimant == claimant {
			c.Last, c.Count = now, c.Count+1
			return *c
		}
	}
	if len(*t) == maxConflicts {
		oldest := 0
		for i, c := range *t {
			if c.Last.Before((*t)[oldest].Last) {
				oldest = i
			}
		}
		*t = slices.Delete(*t, oldest, oldest+1)
	}
	c := Conflict{Name: name, Known: known, Claimant: claimant, Self: self, First: now, Last: now, Count: 1}
	*t = append(*t, c)
	return c
}

// onConflict records memberlist's report that other claims existing's
// name from another address.
func (c *Cluster) onConflict(existing, other *memberlist.Node) {
	c.conflicts.Add(1)
	c.mu.Lock()
	defer c.mu.Unlock()
	self := existing.Name == c.name
	if self {
		c.selfClaims++
		c.lastClaimant = other.Address()
	}
	c.nameClashes.note(existing.Name, existing.Address(), other.Address(), self, c.now())
}

// selfClaimMark returns how many claims of this node's own name it saw so
// far, for selfConflictSince.
func (c *Cluster) selfClaimMark() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.selfClaims
}

// Conflicts returns the name conflicts this node saw since New (at most
// the 16 most recent), oldest first: empty in a healthy cluster.
func (c *Cluster) Conflicts() []Conflict {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Clone(c.nameClashes)
	slices.SortFunc(out, func(a, b Conflict) int { return a.First.Compare(b.First) })
	return out
}

// selfConflictSince returns the address that last claimed this node's name
// if any claim came after mark (a count from selfClaimMark): during Join,
// the live member that holds the name in the seed's view.
func (c *Cluster) selfConflictSince(mark uint64) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lastClaimant, c.selfClaims != mark
}
