// Package memnet is an in-memory network for hashicorp/memberlist: every
// Transport it makes is a memberlist.NodeAwareTransport, so many cluster
// nodes (tests, or a simulation of hundreds of poold daemons) gossip inside
// one process without sockets.
//
// It exists because memberlist's own MockNetwork cannot model failures: its
// WriteToAddress sends on an unbuffered channel, so a packet to a node that
// was shut down blocks the sender's probe goroutine forever (failure
// detection stalls and the goroutine leaks), and its maps are not safe for a
// transport created while others run. memnet behaves like UDP and TCP
// instead:
//
//   - packets are copied and queued without blocking; a packet to an
//     unknown, shut-down or cut-off address, or to a full queue, is dropped
//     and counted, exactly as a lost datagram;
//   - a stream dial to such an address fails at once ("connection refused"),
//     and a dial that is not accepted within its timeout fails with a
//     timeout;
//   - each node name gets one address (127.1.x.y:7946) for the lifetime of
//     the Network, so a node that is shut down and started again under the
//     same name comes back at the same address, like a restarted daemon;
//   - Cut and Heal drop traffic between chosen nodes to simulate partitions;
//   - Filter drops chosen packets (by sender, receiver and content), to lose
//     particular gossip messages without a partition that failure detection
//     would notice.
//
// Addresses look like loopback addresses but no socket is ever opened.
//
// Concurrency: Network and Transport are safe for concurrent use. A Network
// spawns no goroutines; a Transport holds two channels and no goroutine.
// Pure Go, any OS.
package memnet
