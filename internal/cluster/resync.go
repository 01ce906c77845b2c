package cluster

import (
	"math/rand/v2"
	"net/netip"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// Resync after lost gossip. memberlist drops a gossip message on receipt
// when its handler queue is full (the node could not keep up: a CPU
// stall, or a burst of suspicions). Gossip sends each message only a few
// times, so the node may have missed capacity updates and leave
// announcements for good, and memberlist's own push/pull, which would
// repair that, comes only every few minutes at a few hundred nodes (30 s
// times 4 at 200). So after such a drop the node exchanges state with one
// random alive peer itself (a push/pull, as Join does): resyncDelay after
// the first drop, once the burst is likely over, and at most once per
// resyncEvery. At 200 nodes a push/pull moves about 30 KB each way; a node
// that never drops a message never pays it.
const (
	resyncDelay = time.Second
	resyncEvery = 10 * time.Second
)

// resyncer schedules a Cluster's resyncs. Safe for concurrent use.
type resyncer struct {
	mu    sync.Mutex
	timer *time.Timer // the pending resync, or nil
	last  time.Time   // when the last resync started
	off   bool        // no more resyncs: the Cluster shuts down
	wg    sync.WaitGroup
}

// onHandoffDrop counts a gossip message memberlist dropped on receipt and
// schedules a resync unless one is pending. memberlist calls it (through
// its logger) from its packet goroutine; it does not block.
func (c *Cluster) onHandoffDrop() {
	c.ctr.handoffDrops.Add(1)
	r := &c.resync
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.off || r.timer != nil {
		return
	}
	wait := max(resyncDelay, time.Until(r.last.Add(resyncEvery)))
	r.wg.Add(1)
	r.timer = time.AfterFunc(wait, c.resyncNow)
}

// resyncNow exchanges state with one random alive peer.
func (c *Cluster) resyncNow() {
	r := &c.resync
	defer r.wg.Done()
	r.mu.Lock()
	r.timer, r.last = nil, time.Now()
	r.mu.Unlock()
	if c.usable() != nil {
		return
	}
	peers := c.randomPeers(1, false)
	if len(peers) == 0 {
		return
	}
	c.ctr.resyncs.Add(1)
	if _, err := c.ml.Join([]string{peers[0].Address()}); err != nil {
		c.log.Debug("resync after dropped gossip failed", "peer", peers[0].Name, "err", err)
	}
}

// stopResync cancels a pending resync and waits for one in progress.
func (c *Cluster) stopResync() {
	r := &c.resync
	r.mu.Lock()
	r.off = true
	if r.timer != nil && r.timer.Stop() {
		r.timer = nil
		r.wg.Done()
	}
	r.mu.Unlock()
	r.wg.Wait()
}

// randomPeers returns up to k random alive members other than this node,
// those that read overflow lane batches only if lane is set, as memberlist
// addresses them: every node of this build speaks memberlist's newest
// protocol version, with which packets carry a CRC.
func (c *Cluster) randomPeers(k int, lane bool) []*memberlist.Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var picked []*record
	n := 0
	for name, r := range c.members {
		if name == c.name || r.m.State != StateAlive || (lane && !r.lane) || r.m.Addr == "" {
			continue
		}
		// Reservoir sampling: each is kept with probability k/n.
		n++
		if len(picked) < k {
			picked = append(picked, r)
		} else if i := rand.IntN(n); i < k {
			picked[i] = r
		}
	}
	out := make([]*memberlist.Node, 0, len(picked))
	for _, r := range picked {
		if ap, err := netip.ParseAddrPort(r.m.Addr); err == nil { // memberlist always gives an IP
			out = append(out, &memberlist.Node{Name: r.m.Name, Addr: ap.Addr().AsSlice(), Port: ap.Port(), PMax: memberlist.ProtocolVersionMax})
		}
	}
	return out
}
