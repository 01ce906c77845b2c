// Command spillcache is a cache a Go service would copy: hot entries on the
// Go heap, cold ones spilled to CXL memory and then to a remote host's
// memory through farmem, out of the garbage collector's sight. Far hits
// move up only when a frequency sketch admits them, no lock is held across
// far I/O, and GetMany reads the rdma records of many keys in one batch.
// It runs a YCSB-like workload against it from 64 goroutines and, in the
// same run and driven the same way, against caches that hold the whole
// dataset on the heap (otter, ristretto) and against fastcache, each
// measured after a warm-up of the same number of operations, and
// prints hits per tier, Get latency beside the rdma tier's own ReadAt,
// throughput, CPU per operation, Go heap in use and GC cost. With no poold
// running it starts one in the process. On amd64 a Get prefetches the far
// index bucket it may need, and a cxl hit its record's lines, with
// assembly prefetch instructions (prefetch_amd64.s); elsewhere those hints
// are no-ops.
//
// It is smoke-run by its test against an embedded pool.
package main
