// Command memctl is farmem's admin CLI. Against one poold (its unix socket,
// or --addr with mutual TLS):
//
//   - status, tiers, segments: the daemon's version and node, each memory
//     tier (what backs it, real or emulated, capacity, free, latency), and
//     the segments it holds;
//   - alloc and free: allocate a segment that stays until freed (on the
//     cheapest tier within --max-latency, --min-bandwidth), free one by
//     id or name;
//   - nodes: the cluster's members, their state, addresses and free memory;
//   - move SEGMENT: move an rdma segment to another node (--to) while it is
//     in use;
//   - drain NODE: stop new placements on a node, across its restarts, until
//     --undo; --evacuate also moves its segments off (--wait: until done);
//   - keyring: list and rotate the gossip keys of every node;
//   - top: tiers, clients and operation rates, refreshed in place;
//   - bench: each tier's latency, throughput and CPU per operation, with
//     --compare beside memcached, Redis, gRPC and raw TCP (bench-serve, a
//     hidden command, serves those comparison servers);
//
// and on this host alone:
//
//   - doctor: what far memory and RDMA this host has, and how to fix what
//     is wrong;
//   - certs init: a CA and node and client certificates for mutual TLS and a
//     gossip key;
//   - completion: shell completion scripts.
//
// Every command that prints data takes -o json. TestDocNamesEveryCommand
// keeps this list complete.
package main
