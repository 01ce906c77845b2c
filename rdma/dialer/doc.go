// Package dialer picks the data-plane transport: libibverbs where this build
// (tag `verbs`, cgo, Linux) and host have an active RDMA device, else the
// TCP fallback. It exists so that code outside rdma/ (the client library,
// the daemon) can reach the verbs backend, which is internal to rdma/.
//
//   - [Dial] (client side) tries verbs first and falls back to tcp when verbs
//     reports rdma.ErrNotSupported: no device here, a build without the tag,
//     or a peer whose data plane serves only tcp. A verbs connection sends
//     over a tcp connection of its own what the device cannot carry:
//     messages (rdma.Conn.Message) always, atomics unless the device's are
//     atomic with the CPU's.
//   - [Server] (exporting side) serves both transports on one TCP port.
//   - [Preferred] says which transport this host uses and why, for
//     `memctl tiers` and logs.
//
// Environment: FARMEM_VERBS=off disables verbs; FARMEM_VERBS_DEVICE and
// FARMEM_VERBS_GID_INDEX choose the device and GID (see rdma/internal/verbs).
//
// Dial, Preferred and Server are safe for concurrent use. No build tags are
// needed; without the verbs tag the verbs side reports ErrNotSupported.
package dialer
