// Package rdma is farmem's one-sided remote memory data plane: a client reads,
// writes and atomically updates memory that another host exports, and the
// application that owns that memory is never involved, exactly as with RDMA
// verbs.
//
// The package defines the vocabulary shared by every transport:
//
//   - [Key], a random 128-bit access key that authorises operations on one
//     exported segment, and [Region], what a client needs to address remote
//     memory (segment id, key, lease epoch).
//   - [Exporter], the server side: it registers mapped segment memory under
//     a fresh key (like ibv_reg_mr), revokes it, and fences stale lease
//     holders by epoch.
//   - [Conn], the client side: Read, Write, CompareAndSwap64, FetchAdd64 and
//     the batch form Do, which posts several [Op] work requests and waits
//     for all their completions once (like ibv_post_send + ibv_poll_cq);
//     and Message, the one two-sided operation, which hands a request to
//     the exporting host's message handler and returns its answer (the
//     coherence protocol of shared segments rides it).
//   - [Transport] and [Pick], which try transports in order and fall back to
//     the next one when a transport reports [ErrNotSupported] (no RDMA NIC,
//     binary built without the verbs tag).
//
// Two transports implement these interfaces: rdma/tcp, a TCP fallback of the
// same one-sided protocol that works everywhere, and rdma/internal/verbs, a
// libibverbs backend built with the `verbs` tag. Code outside rdma/ dials
// through rdma/dialer, which picks verbs where it works and tcp otherwise.
//
// Messages: rdma/tcp carries them as its MSG opcode. The verbs Conn cannot
// (its control protocol has no message and its queue pair carries only
// one-sided work requests) and fails Message with an error matching
// [ErrNotSupported]; the connection rdma/dialer returns for verbs sends its
// messages over a tcp connection to the same data plane instead, so a
// caller of Conn.Message works on either transport.
//
// # Semantics
//
// Operations are one-sided: the server checks the key, the epoch and the
// bounds and then touches the mapped memory itself. As with RDMA, plain
// reads and writes that race with other writers or with atomics on the same
// bytes may observe torn data; only CompareAndSwap64 and FetchAdd64 on
// 8-byte aligned offsets are atomic, and they are atomic with respect to each
// other and to the host's own sync/atomic operations on that memory. Atomic
// values use the byte order of the host that exports the memory.
//
// Atomics are atomic across transports too: the exporting host's CPU runs
// the atomics of tcp peers, so a verbs connection runs atomics on its RDMA
// device only when the device's atomics are atomic with the CPU's
// (IBV_ATOMIC_GLOB); otherwise rdma/dialer sends them over a tcp connection
// (see verbs.AtomicsOnDevice).
//
// # Exactly once
//
// A Write, CompareAndSwap64 or FetchAdd64 whose connection breaks after it
// was sent may or may not have run. Posting it again (Conn.Do) with the same
// [Ticket] of a [Session] in Op.Once makes the retry exactly-once: rdma/tcp
// keeps a bounded reply cache per session at the server and answers a
// retried ticket with the original result; when that answer is gone (server
// restarted, session evicted, slot reused) the retry fails with
// [ErrIndeterminate] and is not applied. Within one verbs queue pair RC's own
// retransmission is exactly-once, but a work request cannot be re-posted
// safely on a new queue pair: the verbs Conn answers a ticket posted a
// second time with ErrIndeterminate instead. Reads are idempotent and are
// simply retried.
//
// # Concurrency
//
// Every Conn and Exporter implementation is safe for concurrent use by
// multiple goroutines. [Key] and [Region] are plain values. An [Op] belongs to
// the caller, who must not touch it (nor its Buf) while a Do call that holds
// it is running.
//
// This package has no OS-specific code and needs no build tags.
package rdma
