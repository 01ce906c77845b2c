// Package pool is the core of poold, farmem's per-host daemon: the devices
// it carves segments from (discovered CXL memory, an emulated device, local
// DRAM, the memory it lends as the rdma tier), an extent allocator per
// device, the segment table in bbolt, clients' leases, the gRPC control
// plane on a unix socket (with descriptor passing beside it) and on TCP, the
// data plane that serves rdma-tier segments one-sided, and the gossip
// cluster through which daemons lend each other memory.
//
// Access: the unix socket admits the uids and gids of Config.AllowUIDs and
// AllowGIDs (SO_PEERCRED); the TCP control plane requires mutual TLS
// (Config.TLSCert, TLSKey, TLSCA) unless Config.Insecure. A session's
// identity (uid:N or the certificate's cn:NAME) owns its client id; the
// data plane admits connections presenting a live credential (a session's
// own, or one a peer's session had delegated to its client, delegate.go;
// a connection's client certificate, if any, must name the identity the
// credential was issued to) and serves each segment only to the
// credentials of its owner and attachers;
// Config.Quotas and the per-client limits bound what an identity holds. A
// named segment is attached only by its creator's identity and the
// identities it granted (grants.go); a call without a session is an
// administrator's only from an identity in Config.Admins.
// Peers: a node's name is its certificate's common name, checked both when
// dialing a peer and when accepting one, and a peer must answer under the
// name it was dialed by; reconcile frees at a peer only what that peer
// lists as its own (peers.go). Gossip is sealed with the keyring of
// Config.GossipKeyFile, changed by the Keyring call (keyring.go).
//
// Layout. Two halves with one boundary: the Daemon (daemon.go) serves the
// core (an unexported type, pool.go) and reaches it only through the
// core's methods, never its fields.
//
// The core, by concern:
//   - pool.go: its state, its start from the segment table (restore, the
//     orphan sweep), the accessors the Daemon uses, close.
//   - placement.go: Alloc, tiers tried in order, extents and ids reserved;
//     budget.go: the order itself, by the tiers' and the peers' read
//     figures and a request's budget, and the Placement a reply carries.
//   - segments.go: lookup, Free and reclaim, Attach, Detach, Stat,
//     listing pages, Backing.
//   - sessions.go: clients, sessions, callers, lease expiry and the reaper.
//   - tiers.go: the per-tier summary of the devices, and tierName.
//   - grants.go, quota.go, clients.go: who may attach and free, quotas
//     and limits, client descriptions.
//   - peers.go: placement on peers and reconciling with them; membership.go
//     holds the cluster's side (gossip metadata, members coming and going);
//     drain.go the drain (no placements for peers), kept in the store;
//     move.go a live move of a segment placed on a peer to another (the
//     origin's side: copy, seal, switch-over), moveintent.go its durable
//     intent, moveout.go the source's side (MoveOut; docs/MOVE.md);
//     tiermove.go the moves between this host's load/store tiers and the
//     rdma tier, and mappers.go who maps each load/store segment;
//     evacuate.go the evacuator, which asks each segment's origin to move
//     it off a node that evacuates.
//   - redundancy.go: redundant segments at their origin (one rdma
//     segment per copy or shard on distinct hosts and zones, a lost home
//     marked and a backup promoted; docs/REDUNDANCY.md); replicate.go the
//     home's side (Replicate: who writes a copy and where its data plane
//     forwards writes; a failed forward reported to the origin);
//     rebuild.go the rebuild of a lost home on another host, in the
//     background, and rebuildfill.go its copy (a copy from the primary or
//     a shard decoded from k others, with the move's copy-and-switch).
//   - record.go and store.go: the segment record and its versioned binary
//     form (a JSON form of older stores is rewritten on open), and the
//     bbolt store with grouped commits and its reserve for full
//     filesystems: an fsynced file for the records of segments that
//     survive a power loss and an unsynced one, trusted only on the boot
//     that wrote it, for those in volatile memory.
//   - inventory.go, sizecheck.go, fsspace.go: devices found and sized;
//     measure.go: the tier probe; peerprobe.go: the probe of peers' data
//     planes (this node's row of the latency matrix, and the matrix);
//     hotplug.go: the kernel's device events followed, devices that
//     appear or go applied while the daemon runs.
//   - dataplane.go, coherence.go, auth.go: the data plane, shared segments'
//     directories, identities and data-plane credentials.
//
// The Daemon: server.go (the gRPC service), access.go and refusal.go (who
// may do what, and the record of refusals), listing.go, keyring.go,
// health.go, metrics.go, opshttp.go, accepting.go and listener.go
// (listeners and their limits), tls.go, config.go and configfile.go,
// datadir*.go (the data directory's lock), retire.go.
//
// Use New (or Start) with a Config from DefaultConfig, Serve, and Close.
// Daemon is safe for concurrent use, as the core is; Config is a plain
// value.
//
// Linux only at run time (memfd, mmap, SCM_RIGHTS, SO_PEERCRED); it builds
// elsewhere, where the devices return ErrNotSupported.
package pool
