package cluster

import (
	"encoding/binary"
	"time"
)

// The overflow lane. memberlist fills each gossip packet with its own
// broadcasts first (alive, suspect and dead messages, each sent
// RetransmitMult*ceil(log10(n+1)) times by every node that finds it news)
// and offers the delegate only the room left. When many members are
// suspected at once (a loaded machine, a flaky link), those messages fill
// whole packets for tens of rounds, and the capacity updates and leave
// announcements in the broadcast queue wait: at 200 simulated hosts on a
// starved machine a capacity change took 12.9 to 92.1 gossip rounds to
// reach every host, with 50 to 100 bytes offered per packet, where 4 to 9
// rounds are usual (docs/scale.md). So once per gossip interval, if
// messages are queued and no gossip packet since the last look took all
// that were queued (broadcastQueue.crowded), the node sends them itself:
// a packet of its own to each of up to GossipNodes random alive peers
// that read such packets (their Meta says so, flagLane: a node of an
// older build would drop them), each with as many queued messages as fit,
// as memberlist's gossip would. The messages' transmissions are counted
// in the same queue, so each is still sent as many times in all; the lane
// only adds packets. It also runs when more is queued than one packet
// holds (many nodes changed at once), or when a stalled process missed a
// gossip round: then it only makes the wave faster.

// msgBatch is the first byte of a packet of the overflow lane, several
// leave announcements and capacity updates:
//
//	+---------+---------+------------------------------------------+
//	| 0x04    | count   | count x (length uvarint, message)        |
//	| 1 byte  | uvarint | each message a leave or capacity update  |
//	+---------+---------+------------------------------------------+
const msgBatch = 0x04

// laneOverhead is what a lane packet adds to its messages besides their
// length prefixes: memberlist's user message byte, the batch's type byte
// and count, its CRC header (5 bytes), and sealing with the gossip key
// (memberlist's encryption overhead, at most 45 bytes), rounded up. A
// gossip label (Config.Label) adds its own (labelOverhead).
const laneOverhead = 64

// labelOverhead is what memberlist's label header adds to a packet: a
// type byte, a length byte and the label.
func labelOverhead(label string) int {
	if label == "" {
		return 0
	}
	return 2 + len(label)
}

// laneLenOverhead is a message's length prefix in a batch: a uvarint of
// at most two bytes, as every message is under 16 KiB.
const laneLenOverhead = 2

// encodeBatch frames msgs as one overflow lane packet.
func encodeBatch(msgs [][]byte) []byte {
	n := 1 + binary.MaxVarintLen64
	for _, m := range msgs {
		n += laneLenOverhead + len(m)
	}
	b := make([]byte, 0, n)
	b = append(b, msgBatch)
	b = binary.AppendUvarint(b, uint64(len(msgs)))
	for _, m := range msgs {
		b = binary.AppendUvarint(b, uint64(len(m)))
		b = append(b, m...)
	}
	return b
}

// decodeBatch splits an overflow lane packet into its messages, which
// alias b. ok is false for anything else, a batch inside a batch, an
// empty message, or bytes left over.
func decodeBatch(b []byte) (msgs [][]byte, ok bool) {
	if len(b) < 2 || b[0] != msgBatch {
		return nil, false
	}
	b = b[1:]
	count, k := binary.Uvarint(b)
	// Each message takes at least two bytes (its length and type).
	if k <= 0 || count > uint64(len(b)-k)/2 {
		return nil, false
	}
	b = b[k:]
	msgs = make([][]byte, 0, count)
	for range count {
		n, k := binary.Uvarint(b)
		if k <= 0 || n == 0 || n > uint64(len(b)-k) {
			return nil, false
		}
		m := b[k : k+int(n)]
		if m[0] == msgBatch {
			return nil, false
		}
		msgs = append(msgs, m)
		b = b[k+int(n):]
	}
	if len(b) > 0 {
		return nil, false
	}
	return msgs, true
}

// laneRound is one round of the overflow lane (each gossip interval, until
// the Cluster shuts down): when the queue is crowded it sends the queue's
// messages itself to up to fanout peers, in packets of room bytes.
func (c *Cluster) laneRound(fanout, room int) {
	if c.state.Load() == closed || !c.bcast.crowded() {
		return
	}
	for _, n := range c.randomPeers(fanout, true) {
		msgs, own := c.bcast.overflow(laneLenOverhead, room)
		if len(msgs) == 0 {
			break
		}
		c.ctr.capacitySends.Add(uint64(own))
		c.ctr.lanePackets.Add(1)
		if err := c.ml.SendBestEffort(n, encodeBatch(msgs)); err != nil {
			c.log.Debug("overflow lane packet not sent", "peer", n.Name, "err", err)
		}
	}
}

// tickLoop calls fn every d until the Cluster shuts down; c.loops counts
// it.
func (c *Cluster) tickLoop(d time.Duration, fn func()) {
	defer c.loops.Done()
	tick := time.NewTicker(d)
	defer tick.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-tick.C:
		}
		fn()
	}
}
