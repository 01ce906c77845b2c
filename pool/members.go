// This file holds the members a node remembers: the gossip addresses of
// the peers it last saw alive, kept in its metadata store, so that a
// restarted poold contacts them when none of its --join seeds answers. Without them a
// node started without seeds (the cluster's first) or whose seeds are all
// gone would, after a restart its peers did not notice, know no member
// until one of them happened to pick it for a push/pull: its peers still
// list it alive and never join it again.

package pool

import (
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/farmem/farmem/internal/cluster"
)

// keyMembers, in the meta bucket, lists the gossip addresses (host:port)
// of the members the node last saw alive, one per line, sorted.
var keyMembers = []byte("members")

const (
	// rememberedMax bounds how many addresses the store keeps: a sample
	// of a large cluster reaches it as well as the whole list would.
	rememberedMax = 256
	// rejoinMax is how many remembered addresses a restarted node
	// contacts in a round in which no seed answered: any one that
	// answers hands it the cluster's whole membership in its push/pull.
	rejoinMax = 8
	// rememberedTries is how many rounds (each up to 5 s, then a growing
	// pause) a node without --join seeds tries the members it remembers:
	// about a minute, as long as a peer's restart or a short partition.
	rememberedTries = 6
	// rememberEvery is how long the node waits between two writes of the
	// members it sees, however often they change.
	rememberEvery = 10 * time.Second
)

// knownMembers returns the addresses keyMembers holds.
func (s *store) knownMembers() (addrs []string, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		for a := range strings.SplitSeq(string(tx.Bucket(bucketMeta).Get(keyMembers)), "\n") {
			// An entry that is not host:port (a damaged store) would
			// make the whole join fail: it is skipped.
			if _, _, err := net.SplitHostPort(a); err == nil {
				addrs = append(addrs, a)
			}
		}
		return nil
	})
	return addrs, err
}

// setKnownMembers replaces the remembered addresses with addrs (sorted).
func (s *store) setKnownMembers(addrs []string) error {
	return s.update(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketMeta).Put(keyMembers, []byte(strings.Join(addrs, "\n")))
	}, false)
}

// aliveAddrs returns the sorted gossip addresses of the alive members
// other than this node, at most rememberedMax of them.
func aliveAddrs(cl *cluster.Cluster) []string {
	self := cl.Self().Addr
	var addrs []string
	for _, m := range cl.Members() {
		if m.State == cluster.StateAlive && m.Addr != self && m.Addr != "" {
			addrs = append(addrs, m.Addr)
		}
	}
	slices.Sort(addrs)
	if len(addrs) > rememberedMax {
		// A sample spread evenly over the sorted list.
		step := float64(len(addrs)) / rememberedMax
		picked := make([]string, rememberedMax)
		for i := range picked {
			picked[i] = addrs[int(float64(i)*step)]
		}
		addrs = picked
	}
	return addrs
}

// pickRemembered returns up to rejoinMax of the remembered addresses,
// picked at random each round, so that rounds after one whose picks are
// all gone try others.
func pickRemembered(remembered []string) []string {
	out := slices.Clone(remembered)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out[:min(len(out), rejoinMax)]
}

// rememberMembers writes the members this node sees alive to its store
// when they changed since the last write (last): at once when it sees
// members the list lacks (a joining node learns the cluster in a few
// steps), else at most once per rememberEvery since the last attempt; it
// returns what the store now holds. An empty view (the node alone, or cut
// off) is not written: the members it had are the ones to try after a
// restart.
func (d *Daemon) rememberMembers(last []string, lastAt *time.Time) []string {
	now := aliveAddrs(d.pool.gossip())
	if len(now) == 0 || slices.Equal(now, last) {
		return last
	}
	grew := slices.ContainsFunc(now, func(a string) bool { _, found := slices.BinarySearch(last, a); return !found })
	if !grew && time.Since(*lastAt) < rememberEvery {
		return last
	}
	*lastAt = time.Now()
	if err := d.pool.st.setKnownMembers(now); err != nil {
		d.log.Warn("cannot remember the cluster's members in the metadata store; a restart will contact only the --join seeds", "err", err)
		return last
	}
	return now
}
