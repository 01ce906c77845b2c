package alloc

import (
	"context"
	"sync"
	"sync/atomic"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// preconnects are the data-plane connections a client opens ahead of the
// live moves of its segments. A live move pauses the segment's
// operations from the old home's seal until the client's first operation
// at the new home; a first connection to that node (a TLS handshake and
// the data plane's hello) inside that pause would be most of it. So the
// daemon tells the clients of a moving segment, before the seal, where it
// is going (SegmentEvents.moving), and the client connects there during
// the copy. Client.mu guards addrs.
type preconnects struct {
	// addrs are the addresses dialed ahead now: at most one dial each.
	addrs map[string]bool
	// ctx ends when the client closes, and with it the dials under way,
	// which Client.Close waits for (wg).
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
	// made counts the connections opened ahead (ClientStats);
	// handovers the operations that followed a move's handover.
	made, handovers atomic.Int64
}

// maxPreconnects bounds the dials ahead under way at once: a move's
// notice names one node, and an evacuation moves a few segments at a
// time; more notices than that wait for the operation's own dial.
const maxPreconnects = 4

// preconnect opens, in the background, the data-plane connection to the
// node that one of this client's open segments is moving to, as its
// daemon named it on the client's own session, unless the client has one
// there or is dialing it already. The connection is the one a later
// operation there takes from the client's cache: same address, the
// credential the daemon delegated to this client there, the node verified
// as for any home. A dial that fails is dropped without a word: the first
// operation at the new home dials, as it would without the notice.
func (c *Client) preconnect(mv *poolv1.SegmentMoving) {
	k := connKey{addr: mv.DataAddr}
	c.mu.Lock()
	if c.closed || mv.DataAddr == "" || len(mv.DataCredential) == 0 || c.data[k] != nil || c.pre.addrs[k.addr] || len(c.pre.addrs) >= maxPreconnects || !c.holds(mv.Id) {
		c.mu.Unlock()
		return
	}
	c.pre.addrs[k.addr] = true
	c.pre.wg.Add(1)
	c.mu.Unlock()
	go func() {
		defer c.pre.wg.Done()
		defer func() {
			c.mu.Lock()
			delete(c.pre.addrs, k.addr)
			c.mu.Unlock()
		}()
		tc, err := dataTLS(&poolv1.Segment{Id: mv.Id, DataAddr: mv.DataAddr, DataTls: mv.DataTls, DataTlsCa: mv.DataTlsCa, DataServerName: mv.DataServerName}, c.dataCerts())
		if err != nil {
			return
		}
		ctx, cancel := context.WithTimeout(c.pre.ctx, c.opts.timeout)
		defer cancel()
		if _, _, err := c.dataConn(ctx, k, mv.DataCredential, tc); err == nil {
			c.pre.made.Add(1)
		}
	}()
}

// holds reports whether one of the client's open segments is id; c.mu is
// held.
func (c *Client) holds(id uint64) bool {
	for s := range c.segs {
		if s.info.Id == id {
			return true
		}
	}
	return false
}
