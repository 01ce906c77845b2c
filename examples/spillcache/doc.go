// Command spillcache is a cache a Go service would copy: hot entries on the
// Go heap, cold ones spilled to CXL memory and then to a remote host's
// memory through farmem, out of the garbage collector's sight. It runs a
// YCSB-like workload against it and, in the same run, against caches that
// hold the whole dataset on the heap (otter, ristretto) and against
// fastcache, and prints hits per tier, Get latency, throughput, Go heap in
// use and GC cost. With no poold running it starts one in the process.
//
// It is smoke-run by its test against an embedded pool.
package main
