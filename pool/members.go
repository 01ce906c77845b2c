// This file holds the members a node remembers: the gossip addresses of
// the peers it last saw alive, kept in its metadata store, so that a
// restarted poold contacts them beside its --join seeds. Without them a
// node started without seeds (the cluster's first) or whose seeds are all
// gone would, after a restart its peers did not notice, know no member
// until one of them happened to pick it for a push/pull: its peers still
// list it alive and never join it again.

package pool

import (
	"math/rand/v2"
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
	// contacts beside its seeds: any one that answers hands it the
	// cluster's whole membership in its push/pull.
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
		if v := tx.Bucket(bucketMeta).Get(keyMembers); len(v) > 0 {
			addrs = strings.Split(string(v), "\n")
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
		// A sample spread over the sorted list, so that it keeps the
		// same addresses while they stay members.
		step := float64(len(addrs)) / rememberedMax
		picked := make([]string, rememberedMax)
		for i := range picked {
			picked[i] = addrs[int(float64(i)*step)]
		}
		addrs = picked
	}
	return addrs
}

// rejoinTargets returns the seeds a starting node contacts: its --join
// seeds and up to rejoinMax of the addresses it remembers, picked at
// random, that are not seeds already.
func rejoinTargets(seeds, remembered []string) []string {
	var extra []string
	for _, a := range remembered {
		if a != "" && !slices.Contains(seeds, a) {
			extra = append(extra, a)
		}
	}
	rand.Shuffle(len(extra), func(i, j int) { extra[i], extra[j] = extra[j], extra[i] })
	if len(extra) > rejoinMax {
		extra = extra[:rejoinMax]
	}
	return append(slices.Clone(seeds), extra...)
}

// rememberMembers writes the members this node sees alive to its store
// when they changed since the last write (last), at most once per
// rememberEvery; it returns what the store now holds. An empty view (the
// node alone, or cut off) is not written: the members it had are the ones
// to try after a restart.
func (d *Daemon) rememberMembers(last []string, lastAt *time.Time) []string {
	if time.Since(*lastAt) < rememberEvery {
		return last
	}
	now := aliveAddrs(d.pool.gossip())
	if len(now) == 0 || slices.Equal(now, last) {
		return last
	}
	if err := d.pool.st.setKnownMembers(now); err != nil {
		d.log.Warn("cannot remember the cluster's members in the metadata store; a restart will contact only the --join seeds", "err", err)
		return last
	}
	*lastAt = time.Now()
	return now
}
