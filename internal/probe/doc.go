// Package probe measures memory: the latency of a dependent chain of
// 64-byte loads in random order over a span (LoadChain), sequential read
// and write bandwidth (SeqRead, SeqWrite), and the round-trip latency and
// bandwidth of one-sided reads over an rdma.Conn (RemoteRead).
//
// The probes take memory the caller owns; LoadChain and SeqWrite overwrite
// it. To measure a tier rather than the caches, the span should be much
// larger than the last-level cache (poold uses 64 MiB).
//
// Concurrency: the functions are safe to call from several goroutines on
// distinct spans; a span must not be touched by anything else while a probe
// runs on it. Results are plain values.
//
// OS and build tags: none; pure Go.
package probe
