// Package cluster is how poold daemons find each other: a small wrapper over
// hashicorp/memberlist (SWIM gossip with Lifeguard) that gossips each node's
// Meta — protocol version, control and data plane addresses, draining flag,
// and capacity and free bytes per tier — keeps a table of members with their
// decoded Meta, tells subscribers about changes, and chooses a peer for a
// remote allocation (Pick).
//
// # Use
//
//	c, err := cluster.New(cfg, meta)          // binds, announces itself; contacts nobody
//	events, stop := c.Subscribe()             // before Members, so that no change is missed
//	_, err = c.Join(ctx, nil)                 // contacts cfg.Join until one answers or ctx ends
//	err = c.SetMeta(func(m *cluster.Meta) { m.Tiers = current })
//	peer, err := cluster.Pick(c.Members(), "rdma", size, cfg.Name, rnd)
//	_ = c.Leave(5 * time.Second)              // peers list the node Left, not Dead
//	_ = c.Shutdown()
//
// # Membership semantics
//
// Members lists every node this node knows, itself included, with State
// Alive, Dead or Left. memberlist marks a node dead only through its failure
// detector (probe, indirect probes, suspicion timeout: a few seconds on a
// LAN); a node that comes back — restarted under the same name, or after a
// partition heals — is Alive again with an EventAlive. Dead and left nodes
// stay listed until memberlist forgets them, GossipToTheDeadTime after their
// state changed (30 s lan, 15 s local, 60 s wan); no event marks that.
//
// memberlist never contacts a member it declared dead again, so two halves
// of a partition that declared each other dead would meet again only
// through a third node's news (the daemon also contacts every seed it does
// not list alive). Each node therefore keeps the members it saw die (not
// those that left) for 15 minutes and exchanges state with each itself, as
// Join does: about 5 s after the death, then at doubling intervals up to 2
// minutes, one contact at a time (reconnect.go). A node that is back
// refutes what the contacting node believed of it, and the contacting node
// learns it is alive (from the push/pull, or the refutation's gossip);
// Stats counts the contacts and the answers.
//
// memberlist v0.7.0 does not tell its delegates whether a node failed or
// left (its NotifyLeave is the same for both, and Node.State is never set),
// nor when a node becomes suspect. This package therefore gossips its own
// leave announcement (a user message, also carried in push/pull) before
// memberlist's leave, which makes peers report Left; a peer that hears the
// announcement only after it declared the node dead reports EventDead, then
// EventLeave. StateSuspect is never reported.
//
// Names are identities. memberlist keeps the first live member it knows
// under a name and ignores any other address that claims it (logging
// "Conflicting address"); the claimant believes it joined while no peer ever
// lists it. Join therefore returns a *NameConflictError (ErrNameConflict,
// naming the holder's address) when the seed's view holds a live member with
// this node's name, and every node records the claims it sees (Conflicts).
//
// A SetMeta that changes nothing but free bytes (what every allocation
// does) is gossiped as a capacity update of about 50 bytes instead of a new
// Meta, which memberlist would send as a 190-byte alive message: gossip
// carries only a few thousand bytes per node and round, and at 200
// simulated hosts under load capacity changes queued behind each other for
// tens of rounds (capacity.go, docs/scale.md). Members show a node's Meta
// with its newest capacity update applied.
//
// Capacity updates and leave announcements wait in the Cluster's own
// broadcast queue (broadcast.go), not in memberlist's TransmitLimitedQueue,
// which (v0.7.0) can replace a queued message by another without a trace
// once its ids restart. Each message goes out RetransmitMult times more than
// memberlist's retransmit limit, RetransmitMult*(ceil(log10(nodes+1))+1)
// (16 at 200 nodes), and every node that finds it news does the same: a
// node that misses a wave places on stale free bytes until its next
// push/pull, so the wave is made wide enough that one in about 45,000
// misses a node at 200 nodes (broadcast.go, transmits). A wave that dies at the
// start (every peer the origin reached dropped it) would wait for a
// push/pull, which memberlist spaces out to minutes at a few hundred
// nodes; so the origin sends its newest capacity update again, to one
// gossip round's peers, 5, 20 and 80 rounds after its wave. Peers that
// have it ignore it and do not pass it on: a repair costs a few small
// packets per change and nothing while capacity stands still. A node that
// missed a wave itself, because its memberlist dropped messages on receipt
// (its handler queue was full), resyncs: 1 s after the first such drop,
// and at most every 10 s, it exchanges state with one random peer by
// push/pull, which carries every node's newest capacity update
// (resync.go). memberlist offers the queue only the room its own messages
// leave in a packet; when suspicions crowd that out (a starved machine, a
// flaky link), a round in which no gossip packet took all that was queued
// makes the node send the queued messages itself, batched in packets of
// its own to a gossip round's peers, their transmissions counted in the
// same queue (lane.go). Stats counts the queue, the room memberlist leaves
// it, the node's own sends and repairs, the overflow lane's packets, the
// messages memberlist dropped on receipt and the resyncs.
//
// # Keys
//
// With Config.Keys, memberlist seals every gossip packet and stream with
// AES-GCM under the primary key and drops whatever no key of the keyring
// opens, plaintext included: a node without a key is not admitted and its
// packets change nothing. InstallKey, UseKey and RemoveKey rotate the keys
// without downtime (keyring.go); ParseKeys reads a key file. Config.Label
// names the cluster on the wire: a node takes only packets and streams
// carrying its own label, so that clusters never merge through an address
// one's node contacts that the other's holds (a stale seed, the address of
// a member that died).
//
// SetMeta returns once the new Meta is this node's state in memberlist (or
// its capacity update is queued) and queued for gossip; it does not wait for
// peers, because memberlist v0.7.0's
// confirmation (UpdateNode's wait) loses its signal when the broadcast goes
// out before the wait starts. Peers see a change within a few gossip
// intervals; Config.PushPullInterval bounds how long a node that missed the
// broadcast keeps the old Meta.
//
// Each Cluster instance has a random Boot id, gossiped with its Meta: a new
// Boot for a known name means the daemon restarted and lost whatever it held
// in volatile memory.
//
// Meta is encoded in a versioned binary form (see encodeMeta) that must fit
// memberlist's 512-byte node metadata (memberlist.MetaMaxSize); a realistic
// Meta takes about 100 bytes. An oversized or invalid Meta is refused with an
// error, never truncated. A peer whose metadata does not decode is listed
// with MetaErr set and never chosen by Pick.
//
// # Concurrency
//
// Cluster is safe for concurrent use. memberlist calls into the Cluster from
// its own goroutines, sometimes while holding its node lock; those callbacks
// never block: they copy and decode at most 512 bytes, update the member
// table under a mutex that is only ever held for in-memory work (never
// across a call into memberlist), and hand events to subscribers with
// non-blocking sends. Each subscriber has a buffered channel; when it is
// full the oldest event is dropped and counted (Stats.EventsDropped, and a
// gap in Event.Seq), so a slow subscriber never slows gossip. Everything the
// Cluster hands out (Member, Meta, Event) is a copy the caller owns. Pick is
// a pure function.
//
// # Transports, tests and simulation
//
// Config.Transport nil means memberlist's UDP+TCP transport. Package
// memnet provides an in-memory network for tests and for simulating hundreds
// of nodes in one process; memberlist's own MockNetwork is not suitable: a
// packet to a node that has shut down blocks the sender forever, which
// stalls failure detection and leaks goroutines. Per node the Cluster adds
// three goroutines (counting gossip bytes in and out, for Stats; the
// overflow lane; the reconnect loop) to memberlist's seven, and no
// goroutine, timer or channel per member: a member is one
// table entry, so a process simulating N nodes holds N² entries in all.
// Measured with 100 memnet nodes (CLUSTER_SIM_NODES=100 go test -run
// TestSimulationScale -v): 10 goroutines and about 170 KiB of heap per node,
// memberlist's state included. With the local profile such a cluster, all
// joined through one seed, converges in about a minute: memberlist sends each
// broadcast only a few times and push/pull (every 15 s) repairs the rest;
// lower PushPullInterval for faster simulations.
//
// Pure Go, any OS; no build tags.
package cluster
