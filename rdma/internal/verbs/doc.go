// Package verbs is farmem's libibverbs backend for the rdma tier: one-sided
// RDMA READ, WRITE, compare-and-swap and fetch-and-add executed by the RDMA
// device, with the exporting host's CPU not involved. It is the only
// package in farmem that imports "C".
//
// # Mapping onto verbs
//
//   - One device and protection domain per process (ibv_open_device,
//     ibv_alloc_pd): FARMEM_VERBS_DEVICE names it, else the first device
//     with an active port; the GID is a RoCE v2 entry with an IPv4-mapped
//     address unless FARMEM_VERBS_GID_INDEX says otherwise. FARMEM_VERBS=off
//     disables the backend.
//   - [Server] (rdma.Exporter): every exported segment is its own memory
//     region, registered on the already mapped segment memory (never the Go
//     heap) with REMOTE_READ|REMOTE_WRITE|REMOTE_ATOMIC. Its rkey is a
//     per-segment key: Revoke and Fence deregister it, so the rkey stops
//     working; SetEpoch re-registers (a new rkey) to fence holders of the
//     old epoch; MarkLost deregisters and answers SEGMENT_LOST.
//   - [Conn] (rdma.Conn): one RC queue pair per connection, connected
//     through the control protocol below (no rdma_cm). Read, Write, CAS and
//     FADD post IBV_WR_RDMA_READ / RDMA_WRITE / ATOMIC_CMP_AND_SWP /
//     ATOMIC_FETCH_AND_ADD work requests through a registered bounce buffer;
//     a transfer is split into 64 KiB work requests posted as one list with
//     only the last signalled (RC completes in order). Completions are
//     polled by the waiting caller (leader/follower), with no goroutine per
//     operation and none per connection.
//   - Errors: an out-of-range or unaligned request is refused before it is
//     posted; IBV_WC_REM_ACCESS_ERR makes the client resolve the segment
//     again, which reports rdma.ErrAccessDenied (revoked), ErrLeaseExpired
//     (fenced, stale epoch) or ErrSegmentLost; any error completion leaves
//     the queue pair in the error state, so the connection then fails with
//     rdma.ErrClosed and callers dial again.
//
// The 32-bit rkey is guessable, so it is handed out only in exchange for
// the segment's 128-bit rdma.Key, over the control connection.
//
// # Control protocol
//
// It runs on the data plane's TCP port, shared with rdma/tcp (the server's
// listener routes a connection by its first four bytes; a tcp-only server
// answers a verbs hello with its own magic, which Dial reports as
// rdma.ErrNotSupported so the picker falls back to tcp). Little-endian.
//
//	hello (client → server), 40 bytes + credential:
//	+--------+--------+--------+---------------+------------------+- - - - -+
//	| magic  |version |reserved| credential len| queue pair (28)  | cred    |
//	|"FMVB" 4| u16 = 1| u16 = 0| u32 ≤ 4096    |                  |         |
//	+--------+--------+--------+---------------+------------------+- - - - -+
//	0        4        6        8               12                 40
//
//	queue pair: qpn u32 | psn u32 | lid u16 | mtu u8 | grh u8 | gid [16]
//
//	reply (server → client), 36 bytes:
//	+--------+--------+--------+------------------+
//	| magic  |version | code   | queue pair (28)  |
//	+--------+--------+--------+------------------+
//	0        4        6        8                  36
//
// Reply codes (append only): 0 ACCEPT, 1 BAD_MAGIC, 2 BAD_VERSION,
// 3 AUTH_FAILED, 4 CRED_TOO_LONG, 6 SHUTTING_DOWN, 7 INTERNAL. On ACCEPT
// both sides move their queue pair to RTR/RTS towards the other's; the
// server's queue pair lives as long as the TCP connection.
//
// Then the client sends RESOLVE requests, one at a time, 40 bytes each:
//
//	op u8 = 1 | flags u8 (bit 0: WRITE) | reserved u16 + u32 = 0 |
//	segment u64 | key [16] | epoch u64
//
// and the server answers 32 bytes:
//
//	status u16 | reserved u16 | rkey u32 | address u64 | size u64 | epoch u64
//
// Status codes are rdma/tcp's (0 OK, 1 ACCESS_DENIED, 3 SEGMENT_LOST,
// 4 LEASE_EXPIRED, 6 PROTOCOL, 7 UNSUPPORTED) plus 8 INTERNAL. A RESOLVE
// with the WRITE flag and an epoch older than the segment's gets
// LEASE_EXPIRED; READs are not fenced, as in rdma/tcp.
//
// # Atomics
//
// A device's atomics are used only when its atomic_cap is IBV_ATOMIC_GLOB
// (atomic with the host CPU's atomics too): the exporting host's CPU runs
// the atomics of tcp peers on the same words, and with IBV_ATOMIC_HCA (what
// rxe reports) the two can interleave and lose an update. Conn.AtomicScope
// reports the capability and AtomicsOnDevice decides; rdma/dialer sends
// the atomics of any other device over a tcp connection to the same data
// plane, where the home's CPU runs them.
//
// Exactly once: RC retransmission applies a work request once within a
// queue pair, but when a queue pair fails nobody can tell whether its
// outstanding WRITE or atomic ran, and a new queue pair cannot ask. A write
// or atomic with an exactly-once ticket (rdma.Op.Once) that was posted
// before is therefore not posted again: it fails with
// rdma.ErrIndeterminate. (Atomics routed over tcp get the tcp transport's
// reply cache, which answers such a retry.)
//
// The fetched value is written back in the byte order the provider uses;
// rxe (Soft-RoCE) and the exporter's host agree on host order, which is
// what rdma.Conn promises.
//
// # Messages
//
// Conn.Message (rdma.Conn's two-sided MSG, which carries the coherence
// protocol of shared segments) fails with an error matching
// rdma.ErrNotSupported: the control protocol above has no message and the
// queue pair carries only one-sided work requests. rdma/dialer sends the
// messages of a verbs connection over a tcp connection to the same data
// plane, as it does atomics the device cannot run.
//
// # Concurrency
//
// Transport, Conn and Server are safe for concurrent use.
//
// # OS and tags
//
// The backend is built with `//go:build linux && cgo && verbs` and needs
// libibverbs (Debian: libibverbs-dev to build, libibverbs1 and
// ibverbs-providers to run). Every other build gets a stub whose
// constructors fail with an error matching rdma.ErrNotSupported, so a plain
// `go build ./...` needs no C library. The control protocol (wire.go) and
// the listener multiplexer (mux.go) are plain Go and tested everywhere.
package verbs
