// Package testcluster runs multi-host tests on one Linux machine: each test
// host is a network namespace with its own IPv4 address, and the hosts are
// joined by veth pairs to a Linux bridge that lives in a namespace of its
// own (the "switch"), so nothing is created in the machine's root
// namespace:
//
//	root namespace: the test binary; no link, address or route is added here
//
//	+-- <prefix>-sw -------------------------------------------+
//	|                        br0  (bridge: no address, no STP) |
//	|           +-------------+-------------+                  |
//	|           p0            p1            p2   bridge ports  |
//	+-----------|-------------|-------------|------------------+
//	       veth |        veth |        veth |
//	+-- <prefix>-h0 -+ +-- <prefix>-h1 -+ +-- <prefix>-h2 -+
//	| eth0 10.211.X.1| | eth0 10.211.X.2| | eth0 10.211.X.3|
//	| lo   127.0.0.1 | | lo   127.0.0.1 | | lo   127.0.0.1 |
//	| route X.0/24   | | route X.0/24   | | route X.0/24   |
//	| (no default)   | | (no default)   | | (no default)   |
//	+----------------+ +----------------+ +----------------+
//
// The rules, which keep test traffic off every real network:
//   - Traffic stays inside the cluster's namespaces and their loopbacks. The
//     bridge has no uplink and no address; no interface of the root
//     namespace is attached; nothing is routed or NATed.
//   - A host's only route is its subnet's. There is no default route, so a
//     connection to any other address fails at once with "network is
//     unreachable" and no packet leaves the host.
//   - Dial, Listen and ListenPacket take literal IP:port addresses only, so
//     no name is ever resolved (which could send a DNS query from the root
//     namespace).
//   - The test process reaches hosts only through Host.Dial, Host.Listen,
//     Host.ListenPacket and Host.Do, never with plain net.Dial: the root
//     namespace is not attached to the bridge and would route a host's
//     address to the real network. Do checks that its thread really is in
//     the namespace before running anything.
//   - Every name starts with the cluster's prefix, so clusters of parallel
//     tests and of other people's test binaries never meet; Cleanup and the
//     teardown touch only their own prefix.
//
// Each cluster has its own bridge, so two clusters may use the same subnet.
// The switch namespace has no firewall rules, so bridge netfilter
// (br_netfilter), if loaded, passes all traffic; no sysctl is changed.
//
// Programs run in a host with Host.Command (the caller manages it) or
// Host.Start (output captured, SIGKILLed with its process group at cleanup).
// The test process itself reaches a host through Host.Dial, Host.Listen and
// Host.Do, which create sockets on an OS thread moved into the namespace
// with setns(2); a socket keeps its namespace for life.
//
// Partitions: Host.LinkDown sets the host's veth pair down; the host's own
// sends fail at once (its route is gone) and traffic to it is dropped, so
// peers see timeouts. Host.LinkUp restores the link and waits until it
// forwards again.
//
// Cleanup: New registers t.Cleanup, which kills the processes the test
// started, then anything else left in the namespaces, then deletes the
// namespaces (the veths and the bridge go with them) and fails the test if
// any is left. New also removes what an earlier run with the same prefix
// left, and the namespaces of default-prefixed clusters whose test binary
// (its pid is in the prefix) has died. Processes started by Host.Start die
// with the test binary even when it crashes (PR_SET_PDEATHSIG). To clean up
// by hand: `ip netns list`, then `ip netns delete NAME`, or call Cleanup.
//
// Concurrency: Cluster, Host and Process are safe for concurrent use; many
// clusters may exist at once, in one test binary or several.
//
// Needs: Linux, root (CAP_SYS_ADMIN and CAP_NET_ADMIN), and iproute2's
// `ip` (6.x tested). Without root, or elsewhere than Linux, New skips the
// test with the reason ("needs root: network namespaces"); CI runs as root,
// so the tests run there.
package testcluster
