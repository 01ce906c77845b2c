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
// data plane admits connections presenting a live session's credential;
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
// Use New (or Start) with a Config from DefaultConfig, Serve, and Close.
// Daemon and Pool are safe for concurrent use; Config is a plain value.
//
// Linux only at run time (memfd, mmap, SCM_RIGHTS, SO_PEERCRED); it builds
// elsewhere, where the devices return ErrNotSupported.
package pool
