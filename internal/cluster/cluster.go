package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Lifecycle states of a Cluster.
const (
	running int32 = iota
	leaving       // Leave started or done
	closed        // Shutdown done
)

// Cluster is this node's membership in the poold gossip cluster: its own
// Meta, the table of members with their decoded Meta, and subscriptions to
// changes. Create it with New; end it with Leave (optional) and Shutdown.
//
// Safe for concurrent use. memberlist's callbacks into a Cluster never block:
// they decode at most 512 bytes, update the table under a mutex that is held
// only for such in-memory work, and hand events to subscribers without
// waiting.
type Cluster struct {
	cfg   Config
	log   *slog.Logger
	name  string
	boot  uint64
	ml    *memberlist.Memberlist
	kr    *memberlist.Keyring // nil: gossip in plaintext
	keyMu sync.Mutex          // serializes keyring changes
	tr    *countingTransport
	bcast *broadcastQueue
	ctr   counters
	// reapAfter is memberlist's GossipToTheDeadTime: dead and left members
	// are dropped from the table this long after their state changed.
	reapAfter time.Duration

	state  atomic.Int32 // running, leaving, closed
	resync resyncer     // push/pulls after dropped gossip (resync.go)
	// loops is done when the overflow lane's goroutine (lane.go) and the
	// reconnect loop (reconnect.go) end.
	loops  sync.WaitGroup
	lifeMu sync.Mutex // serializes Leave and Shutdown
	done   chan struct{}

	metaMu  sync.Mutex             // serializes SetMeta's read-modify-write of meta
	updMu   sync.Mutex             // serializes memberlist.UpdateNode, which reads its own node unlocked
	meta    Meta                   // own metadata; guarded by metaMu
	capSeq  uint64                 // sequence number of the last capacity update; guarded by metaMu
	enc     atomic.Pointer[[]byte] // own metadata encoded, read by memberlist
	now     func() time.Time       // clock for Since and reaping
	alive   atomic.Int64           // members Alive or Suspect, self included
	mu      sync.Mutex             // guards members, subs, seq; never held while calling memberlist
	members map[string]*record
	// failed holds the members this node saw die, to contact again
	// (reconnect.go); guarded by mu.
	failed map[string]*failedMember
	subs   map[*subscription]struct{}
	seq    uint64
	// reapedAt is when reapLocked last walked members; guarded by mu.
	reapedAt time.Time
	// nameClashes, selfClaims and lastClaimant record name conflicts
	// (conflict.go); guarded by mu.
	nameClashes  conflictTable
	selfClaims   uint64
	lastClaimant string

	dropped   atomic.Uint64
	conflicts atomic.Uint64
}

// record is one member in the table. m.Meta is never modified in place;
// hand out m.clone().
type record struct {
	m       Member
	raw     []byte     // metadata bytes as gossiped, to tell real updates from repeats
	base    Meta       // raw decoded; m.Meta is base with cap's free bytes
	metaSeq uint64     // the capacity sequence number raw carries
	cap     *capUpdate // the newest capacity update newer than raw, or nil
	lane    bool       // raw says the node reads overflow lane batches
}

// New starts gossip for this node: it binds the transport (or takes over
// cfg.Transport), announces meta, and returns. It does not contact any seed;
// call Join. On error nothing keeps running and cfg.Transport is shut down.
func New(cfg Config, meta Meta) (*Cluster, error) {
	fail := func(err error) (*Cluster, error) {
		if cfg.Transport != nil {
			_ = cfg.Transport.Shutdown()
		}
		return nil, err
	}
	if err := cfg.Validate(); err != nil {
		return fail(err)
	}
	cfg = cfg.withDefaults()
	cfg.Join = slices.Clone(cfg.Join)
	boot := rand.Uint64() | 1 // never 0, which means "unknown"
	enc, err := encodeMeta(meta, stamp{boot: boot, lane: true})
	if err != nil {
		return fail(fmt.Errorf("cluster: node %q: %w", cfg.Name, err))
	}
	c := &Cluster{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "cluster", "node", cfg.Name),
		name:    cfg.Name,
		boot:    boot,
		done:    make(chan struct{}),
		meta:    meta.Clone(),
		now:     time.Now,
		members: make(map[string]*record),
		subs:    make(map[*subscription]struct{}),
	}
	c.enc.Store(&enc)

	mc := cfg.profile()
	cfg.override(mc)
	mc.Name = cfg.Name
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertiseAddr = cfg.AdvertiseAddr
	mc.AdvertisePort = cfg.AdvertisePort
	mc.Logger = memberlistLogger(cfg.Logger, c.onHandoffDrop)
	if len(cfg.Keys) > 0 {
		kr, err := memberlist.NewKeyring(cfg.Keys[1:], cfg.Keys[0])
		if err != nil {
			return fail(fmt.Errorf("%w: node %q: %v", ErrBadKey, cfg.Name, err))
		}
		// Every packet and stream sealed, and only sealed ones accepted
		// (memberlist's defaults, stated: a node without a key must not
		// get in).
		c.kr, mc.Keyring = kr, kr
		mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	}
	d := &delegate{c}
	mc.Delegate, mc.Events, mc.Conflict = d, d, d
	c.reapAfter = mc.GossipToTheDeadTime
	c.bcast = newBroadcastQueue(func() int { return transmits(mc.RetransmitMult, int(c.alive.Load())) },
		mc.GossipNodes, mc.GossipInterval)

	inner := cfg.Transport
	if inner == nil {
		nt, err := newNetTransport(cfg, mc)
		if err != nil {
			return nil, fmt.Errorf("cluster: node %q: listen for gossip on %s port %d: %w; pick a free port or another address",
				cfg.Name, cfg.BindAddr, cfg.BindPort, err)
		}
		inner = nt
	}
	c.tr = newCountingTransport(inner, &c.ctr)
	mc.Transport = c.tr

	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = c.tr.Shutdown()
		return nil, fmt.Errorf("cluster: node %q: start gossip: %w", cfg.Name, err)
	}
	c.ml = ml
	c.loops.Add(2)
	go c.tickLoop(mc.GossipInterval, func() {
		c.laneRound(mc.GossipNodes, mc.UDPBufferSize-laneOverhead-labelOverhead(mc.Label))
	})
	go c.tickLoop(reconnectTick, c.reconnectOnce)
	return c, nil
}

// newNetTransport binds memberlist's UDP+TCP transport and records the port
// it got in mc, as memberlist does when it makes the transport itself.
func newNetTransport(cfg Config, mc *memberlist.Config) (*memberlist.NetTransport, error) {
	nc := &memberlist.NetTransportConfig{
		BindAddrs: []string{cfg.BindAddr},
		BindPort:  cfg.BindPort,
		Logger:    mc.Logger,
	}
	tries := 1
	if cfg.BindPort == 0 {
		tries = 10 // TCP and UDP bind the same port in turn; another process may take it between the two
	}
	var err error
	for range tries {
		var nt *memberlist.NetTransport
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			port := nt.GetAutoBindPort()
			mc.BindPort = port
			if mc.AdvertisePort == 0 {
				mc.AdvertisePort = port
			}
			return nt, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

// Join contacts the seeds (host:port; nil means Config.Join) and merges
// their view of the cluster into this node's, returning how many seeds
// answered. Seeds equal to this node's own address are skipped; with no
// seeds left Join returns (0, nil): the node forms a cluster of its own.
//
// When a seed's view holds a live member with this node's name at another
// address, Join returns a *NameConflictError (ErrNameConflict) at once:
// memberlist keeps that member and ignores this node, so it would never
// be seen by its peers. The caller should stop this node (Shutdown, not
// Leave: a leave under a contested name is about the other node too).
//
// Join contacts every seed of a round at once and returns after the first
// round in which any seed answered; seeds that failed are logged. When
// none answered it retries with backoff (100 ms doubling to 5 s) until ctx
// ends, then returns an error matching ErrNoSeed and ctx.Err(). A seed can
// take up to the profile's TCP timeout (1 s local, 10 s lan, 30 s wan),
// plus a DNS lookup for host names, when its host is off: a round ends
// when every seed answered or failed, joinGrace after the first answer,
// or when ctx ends, whichever is first; a contact still under way then
// finishes on its own.
func (c *Cluster) Join(ctx context.Context, seeds []string) (int, error) {
	if seeds == nil {
		seeds = c.cfg.Join
	}
	self := c.Self().Addr
	var todo []string
	for _, s := range seeds {
		if _, _, err := net.SplitHostPort(s); err != nil {
			return 0, fmt.Errorf("%w: join seed %q is not host:port: %v", ErrInvalidConfig, s, err)
		}
		if s != self {
			todo = append(todo, s)
		}
	}
	if len(todo) == 0 {
		return 0, nil
	}
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		if err := c.usable(); err != nil {
			return 0, err
		}
		mark := c.selfClaimMark()
		n, errs := c.joinRound(ctx, todo)
		// Each push/pull merged its seed's view synchronously: a live
		// member with this node's name shows up as a conflict now.
		if holder, clash := c.selfConflictSince(mark); clash {
			return n, &NameConflictError{Name: c.name, Holder: holder, Self: self}
		}
		if n > 0 {
			if len(errs) > 0 {
				c.log.Warn("some seeds did not answer", "reached", n, "seeds", len(todo), "err", errors.Join(errs...))
			}
			return n, nil
		}
		c.log.Debug("no seed answered", "attempt", attempt, "err", errors.Join(errs...))
		timer := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			timer.Stop()
			return 0, fmt.Errorf("cluster: node %q: join %s: %w after %d attempts (%w): %w",
				c.name, strings.Join(todo, ","), ErrNoSeed, attempt, ctx.Err(), errors.Join(errs...))
		case <-c.done:
			timer.Stop()
			return 0, ErrClosed
		case <-timer.C:
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// joinRound contacts every seed at once (a push/pull each) and returns how
// many answered and the errors of those that did not, once all are done or
// ctx ended or the cluster closed; the contacts still under way then are
// counted as not answered.
func (c *Cluster) joinRound(ctx context.Context, seeds []string) (int, []error) {
	type result struct {
		n   int
		err error
	}
	results := make(chan result, len(seeds)) // buffered: a late contact never blocks
	for _, s := range seeds {
		go func() {
			k, err := c.ml.Join([]string{s})
			results <- result{k, err}
		}()
	}
	n := 0
	var errs []error
	var grace <-chan time.Time // from the first answer on: how long the others may take
	for range seeds {
		select {
		case r := <-results:
			n += r.n
			if r.err != nil {
				errs = append(errs, r.err)
			}
			if n > 0 && grace == nil {
				tm := time.NewTimer(joinGrace)
				defer tm.Stop()
				grace = tm.C
			}
		case <-grace:
			return n, append(errs, fmt.Errorf("other seeds still contacted %v after the first answer", joinGrace))
		case <-ctx.Done():
			return n, append(errs, fmt.Errorf("contacting the other seeds: %w", ctx.Err()))
		case <-c.done:
			return n, append(errs, ErrClosed)
		}
	}
	return n, errs
}

// joinGrace is how long a join round waits for the other seeds once one
// answered: its push/pull brought the cluster's view already, and a seed
// whose host is off would hold the round for TCP's whole timeout.
const joinGrace = time.Second

// usable returns ErrClosed or ErrLeft once the node can no longer change.
func (c *Cluster) usable() error {
	switch c.state.Load() {
	case closed:
		return ErrClosed
	case leaving:
		return ErrLeft
	}
	return nil
}

// SetMeta changes this node's metadata: fn edits a copy of the current Meta,
// which is validated, encoded and gossiped (memberlist.UpdateNode). If the
// new Meta is invalid or too large, SetMeta returns the error and the old
// Meta stays. Concurrent calls are serialized; fn must not call the Cluster.
//
// When SetMeta returns nil, Self shows the new Meta and it is queued for
// gossip: peers see it within a few gossip intervals, or at the latest at
// their next push/pull with a node that has it. SetMeta does not wait for
// peers (see announce for why memberlist's own wait cannot be trusted), so
// it returns in microseconds. After Leave it returns ErrLeft, after Shutdown
// ErrClosed.
func (c *Cluster) SetMeta(fn func(*Meta)) error {
	c.metaMu.Lock()
	if err := c.usable(); err != nil {
		c.metaMu.Unlock()
		return err
	}
	m := c.meta.Clone()
	if fn != nil {
		fn(&m)
	}
	enc, err := encodeMeta(m, stamp{boot: c.boot, capSeq: c.capSeq, lane: true})
	if err != nil {
		c.metaMu.Unlock()
		return fmt.Errorf("cluster: node %q: SetMeta: %w", c.name, err)
	}
	prev := c.meta
	c.meta = m.Clone() // fn may have kept a reference to m.Tiers
	if freeOnly(prev, m) {
		// Only free bytes moved: gossip a capacity update, not a new Meta.
		// The encoded Meta carries the change too, for the alive messages
		// memberlist builds from NodeMeta (refutations) and for the next
		// full announcement.
		c.capSeq++
		enc, err = encodeMeta(m, stamp{boot: c.boot, capSeq: c.capSeq, lane: true})
		if err == nil {
			c.enc.Store(&enc)
		}
		u := capUpdate{name: c.name, boot: c.boot, seq: c.capSeq, free: make([]int64, len(m.Tiers))}
		for i, t := range m.Tiers {
			u.free[i] = t.Free
		}
		c.metaMu.Unlock()
		c.onCapacity(u)
		c.bcast.queue(&gossipBroadcast{key: "cap/" + c.name, msg: u.encode(), seq: u.seq}, true)
		return err
	}
	c.enc.Store(&enc)
	c.metaMu.Unlock()
	// Not under metaMu: announcing blocks, and a SetMeta waiting its turn in
	// announce sends the newest Meta anyway (NodeMeta reads c.enc).

	return c.announce()
}

// announce makes the current encoded Meta memberlist's state for this node
// (memberlist.UpdateNode), which queues it for gossip.
//
// memberlist v0.7.0 has three races here, handled as follows. UpdateNode
// reads the local node's address after releasing its lock while a
// concurrent UpdateNode writes it: updMu serializes the calls. UpdateNode
// takes its incarnation number before locking, so a refutation (this node
// answering a suspicion) that takes a higher one in between makes it drop
// the update without a word: the Meta is checked in this node's own table,
// where NotifyUpdate puts it synchronously, and the call is repeated. And
// UpdateNode's wait for the broadcast is lossy (the queue signals an
// unbuffered channel without blocking, so a broadcast sent or superseded
// before UpdateNode starts waiting is never reported): announce does not
// wait for it, since a timeout there would say nothing.
func (c *Cluster) announce() error {
	c.updMu.Lock()
	defer c.updMu.Unlock()
	for attempt := 1; attempt <= maxAnnounce; attempt++ {
		sent := c.enc.Load()                 // what NodeMeta returns, unless a SetMeta stores a newer one meanwhile
		_ = c.ml.UpdateNode(time.Nanosecond) // only "not confirmed yet", see above
		if err := c.usable(); err != nil {
			return err
		}
		if c.selfMetaIs(*sent) || c.selfMetaIs(*c.enc.Load()) {
			return nil
		}
		c.log.Debug("metadata update lost to a refutation; retrying", "attempt", attempt)
	}
	return fmt.Errorf("cluster: node %q: %w %d times", c.name, ErrUpdateLost, maxAnnounce)
}

// reapEvery is how often reapLocked walks the member table at most: dead
// and left members are listed up to this much longer than reapAfter.
const reapEvery = time.Second

// maxAnnounce bounds announce's attempts; each loss needs a refutation in a
// window of microseconds, so more than one in a row is already rare.
const maxAnnounce = 5

// selfMetaIs reports whether this node's own table entry carries enc.
func (c *Cluster) selfMetaIs(enc []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.members[c.name]
	return r != nil && bytes.Equal(r.raw, enc)
}

// Self returns this node as the table shows it.
func (c *Cluster) Self() Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.members[c.name]; r != nil {
		return r.m.clone()
	}
	return Member{Name: c.name, State: StateAlive, Boot: c.boot}
}

// Members returns every node this node knows, itself included, sorted by
// name. Dead and left nodes stay listed until memberlist forgets them,
// Config.GossipToTheDeadTime after their state changed (profile default:
// 30 s lan, 15 s local, 60 s wan). The slice and its Members are the
// caller's.
func (c *Cluster) Members() []Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reapLocked(c.now())
	out := make([]Member, 0, len(c.members))
	for _, r := range c.members {
		out = append(out, r.m.clone())
	}
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Member returns the named node, if this node knows it (see Members).
func (c *Cluster) Member(name string) (Member, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reapLocked(c.now())
	r := c.members[name]
	if r == nil {
		return Member{}, false
	}
	return r.m.clone(), true
}

// reapLocked forgets dead and left members older than reapAfter, as
// memberlist does. Never self. It walks the table at most once a reapEvery,
// so that Member stays O(1) (the scale simulation's polling of 200 tables
// spent a core here). Caller holds c.mu.
func (c *Cluster) reapLocked(now time.Time) {
	if !c.reapedAt.IsZero() && now.Sub(c.reapedAt) < reapEvery && now.After(c.reapedAt) {
		return
	}
	c.reapedAt = now
	for name, r := range c.members {
		if name != c.name && deadOrLeft(r.m.State) && now.Sub(r.m.Since) > c.reapAfter {
			delete(c.members, name)
		}
	}
}

// Leave announces that this node leaves, so that peers list it as Left (not
// Dead) and stop placing on it at once, and waits up to timeout (> 0) for the
// announcement to go out. The node keeps answering gossip until Shutdown,
// which should follow. Leave is idempotent; after Shutdown it returns
// ErrClosed. A timeout error means some peers may list the node as Dead
// before they learn it left.
func (c *Cluster) Leave(timeout time.Duration) error {
	if timeout <= 0 {
		return fmt.Errorf("cluster: node %q: Leave timeout %v: %w; pass a positive duration", c.name, timeout, ErrInvalidConfig)
	}
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	switch c.state.Load() {
	case closed:
		return ErrClosed
	case leaving:
		return nil
	}
	c.metaMu.Lock() // wait out a SetMeta in progress, then refuse new ones
	c.state.Store(leaving)
	c.metaMu.Unlock()
	deadline := time.Now().Add(timeout)

	// 1. Tell peers this boot of the node is leaving. memberlist's own leave
	// message does not reach delegates as such (NotifyLeave looks the same
	// for left and failed nodes), so the announcement rides on gossip as a
	// user message; see delegate.NotifyMsg.
	sent := make(chan struct{})
	c.mu.Lock()
	if r := c.members[c.name]; r != nil && !r.m.Leaving {
		r.m.Leaving = true
		c.publishLocked(EventUpdate, r.m.clone())
	}
	c.mu.Unlock()
	c.bcast.queue(&gossipBroadcast{key: "leave/" + c.name, msg: encodeLeave(c.name, c.boot), sent: sent}, false)
	if c.alive.Load() > 1 {
		t := time.NewTimer(timeout / 2)
		select {
		case <-sent:
		case <-t.C:
			c.log.Warn("leave announcement not yet sent to peers; continuing", "timeout", timeout/2)
		}
		t.Stop()
	}
	// 2. memberlist's leave: peers mark the node left.
	rest := max(time.Until(deadline), time.Millisecond) // 0 would mean "wait forever" to memberlist
	if err := c.ml.Leave(rest); err != nil {
		return fmt.Errorf("cluster: node %q: leave within %v: %w", c.name, timeout, err)
	}
	return nil
}

// Shutdown stops gossip at once: peers detect the node as Dead unless Leave
// ran first. It stops every goroutine the Cluster started, closes every
// subscription channel, and is idempotent. Members and Self keep returning
// the last known table (with this node Dead, or Left after Leave).
func (c *Cluster) Shutdown() error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.state.Load() == closed {
		return nil
	}
	c.metaMu.Lock()
	c.state.Store(closed)
	c.metaMu.Unlock()
	// memberlist shuts the transport down first; tr.Shutdown is then a no-op
	// returning that result, or does the job if memberlist could not.
	err := errors.Join(c.ml.Shutdown(), c.tr.Shutdown())
	c.stopResync()
	close(c.done)
	c.loops.Wait()
	c.mu.Lock()
	for s := range c.subs {
		close(s.ch)
	}
	c.subs = nil
	if r := c.members[c.name]; r != nil && !deadOrLeft(r.m.State) {
		c.setStateLocked(r, StateDead)
	}
	c.mu.Unlock()
	if err != nil {
		return fmt.Errorf("cluster: node %q: shutdown: %w", c.name, err)
	}
	return nil
}

// Stats is a snapshot of one node's gossip. A value.
type Stats struct {
	Alive, Suspect, Dead, Left int // members by state, self included
	Leaving                    int // alive members that announced Leave
	BadMeta                    int // members whose metadata does not decode

	PacketsSent, PacketBytesSent         uint64 // gossip packets (UDP) written
	PacketsReceived, PacketBytesReceived uint64 // gossip packets read
	Streams                              uint64 // stream connections (TCP) dialed or accepted: joins, push/pull, fallback probes
	StreamBytesSent, StreamBytesReceived uint64 // bytes over those streams

	Subscribers   int    // open subscriptions
	EventsDropped uint64 // events dropped from full subscriber buffers, all subscriptions
	NameConflicts uint64 // times another node claimed this node's name (or a peer's) at another address
	HealthScore   int    // memberlist's self-assessed health, 0 = healthy; higher slows probing

	// Broadcasts is how many leave announcements and capacity updates
	// wait in this node's queue for gossip now.
	Broadcasts int
	// BroadcastCalls counts the gossip packets to which memberlist offered
	// room for them (it fills each packet with its own messages first and
	// offers none when no room is left); BroadcastRoom sums the bytes
	// offered.
	BroadcastCalls, BroadcastRoom uint64
	// CapacitySends counts the times one of this node's own capacity
	// updates went into a gossip or overflow lane packet; LanePackets the
	// packets the overflow lane sent, when memberlist's own messages left
	// too little room (lane.go); CapacityRepairs the times the
	// node sent its newest one again after its wave (broadcast.go).
	CapacitySends, LanePackets, CapacityRepairs uint64
	// HandoffDrops counts gossip messages memberlist dropped on receipt
	// because its handler queue was full (the node could not keep up);
	// Resyncs the push/pulls the node started after such drops (resync.go).
	HandoffDrops, Resyncs uint64
	// Reconnects counts the contacts this node made with members it had
	// seen die, Reconnected those that one answered (reconnect.go).
	Reconnects, Reconnected uint64
}

// Stats returns counters since New.
func (c *Cluster) Stats() Stats {
	var s Stats
	c.mu.Lock()
	c.reapLocked(c.now())
	for _, r := range c.members {
		switch r.m.State {
		case StateAlive:
			s.Alive++
			if r.m.Leaving {
				s.Leaving++
			}
		case StateSuspect:
			s.Suspect++
		case StateDead:
			s.Dead++
		case StateLeft:
			s.Left++
		}
		if r.m.MetaErr != nil {
			s.BadMeta++
		}
	}
	s.Subscribers = len(c.subs)
	c.mu.Unlock()
	s.PacketsSent = c.ctr.packetsOut.Load()
	s.PacketBytesSent = c.ctr.packetBytesOut.Load()
	s.PacketsReceived = c.ctr.packetsIn.Load()
	s.PacketBytesReceived = c.ctr.packetBytesIn.Load()
	s.Streams = c.ctr.streams.Load()
	s.StreamBytesSent = c.ctr.streamBytesOut.Load()
	s.StreamBytesReceived = c.ctr.streamBytesIn.Load()
	s.EventsDropped = c.dropped.Load()
	s.NameConflicts = c.conflicts.Load()
	s.HealthScore = c.ml.GetHealthScore()
	s.Broadcasts, s.CapacityRepairs = c.bcast.stats()
	s.BroadcastCalls = c.ctr.broadcastCalls.Load()
	s.BroadcastRoom = c.ctr.broadcastRoom.Load()
	s.CapacitySends = c.ctr.capacitySends.Load()
	s.HandoffDrops = c.ctr.handoffDrops.Load()
	s.Resyncs = c.ctr.resyncs.Load()
	s.Reconnects, s.Reconnected = c.ctr.reconnects.Load(), c.ctr.reconnected.Load()
	s.LanePackets = c.ctr.lanePackets.Load()
	return s
}

// setStateLocked changes r's state, keeping the alive count. Caller holds c.mu.
func (c *Cluster) setStateLocked(r *record, s memberlist.NodeStateType) {
	if r.m.State == s {
		return
	}
	if wasAlive, isAlive := !deadOrLeft(r.m.State), !deadOrLeft(s); wasAlive != isAlive {
		if isAlive {
			c.alive.Add(1)
		} else {
			c.alive.Add(-1)
		}
	}
	r.m.State = s
	r.m.Since = c.now()
}

// onAlive records that memberlist saw name alive with metadata raw (a join,
// a return, or a metadata update) and publishes the event.
func (c *Cluster) onAlive(name, addr string, raw []byte) {
	meta, st, err := decodeMeta(raw)
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.members[name]
	var kind EventKind
	switch {
	case r == nil:
		kind = EventJoin
		r = &record{m: Member{Name: name, State: StateDead}}
		c.members[name] = r
	case deadOrLeft(r.m.State):
		kind = EventAlive
	case bytes.Equal(raw, r.raw) && addr == r.m.Addr:
		return // nothing a subscriber could see changed
	default:
		kind = EventUpdate
	}
	if st.boot != r.m.Boot {
		r.m.Leaving = false // a new boot has not announced Leave
	}
	if !bytes.Equal(raw, r.raw) {
		r.m.MetaAt = c.now()
	}
	r.raw = raw
	r.m.Addr = addr
	r.base, r.metaSeq, r.lane = meta, st.capSeq, st.lane
	r.m.Meta, r.m.Boot, r.m.MetaErr = meta, st.boot, err
	if err != nil {
		r.m.Boot = 0
		c.log.Debug("peer metadata does not decode", "peer", name, "addr", addr, "err", err)
	}
	if r.cap != nil && (err != nil || r.cap.boot != st.boot || r.cap.seq <= st.capSeq) {
		r.cap = nil // the Meta is newer, or from another boot
	}
	if r.cap != nil {
		if m, ok := withFree(meta, r.cap); ok {
			r.m.Meta = m
		}
	}
	c.setStateLocked(r, StateAlive)
	delete(c.failed, name)
	c.publishLocked(kind, r.m.clone())
}

// onGone records that memberlist declared name dead or left.
func (c *Cluster) onGone(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.members[name]
	if r == nil || deadOrLeft(r.m.State) {
		return
	}
	if r.m.Leaving {
		c.setStateLocked(r, StateLeft)
		c.publishLocked(EventLeave, r.m.clone())
		return
	}
	c.setStateLocked(r, StateDead)
	c.noteFailedLocked(r)
	c.publishLocked(EventDead, r.m.clone())
}

// pushState encodes what push/pull adds to memberlist's state: the leave
// announcements and the newest capacity updates in the table.
func (c *Cluster) pushState() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	var names []string
	var boots []uint64
	for name, r := range c.members {
		if r.m.Leaving && r.m.Boot != 0 && len(names) < maxLeaveSet {
			names = append(names, name)
			boots = append(boots, r.m.Boot)
		}
	}
	return c.appendCapacitySetLocked(encodeLeaveSet(names, boots))
}

// onLeave records a peer's leave announcement. It reports whether the
// announcement was news, so that the caller passes it on.
func (c *Cluster) onLeave(name string, boot uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.members[name]
	if r == nil || r.m.Boot != boot || r.m.Leaving {
		return false // unknown, another boot of the node, or known already
	}
	r.m.Leaving = true
	if r.m.State == StateDead { // memberlist's leave message came first
		c.setStateLocked(r, StateLeft)
		delete(c.failed, name)
		c.publishLocked(EventLeave, r.m.clone())
	} else if r.m.State != StateLeft {
		c.publishLocked(EventUpdate, r.m.clone())
	}
	return true
}
