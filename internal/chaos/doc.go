// Package chaos holds farmem's fault suites: tests that run the real poold
// binary and make it fail the way production would, then check the
// promises of the README's "Guarantees" section. It has no code of its
// own, only tests:
//
//   - TestKillLoop: kill -9 of poold at random points under a concurrent
//     allocate/write/free load, restart, and after each restart every
//     acknowledged segment exists with its bytes, no orphan file or
//     overlapping extent remains, and free capacity is total minus the live
//     segments; calls in flight fail with alloc.ErrUnavailable, never hang.
//   - TestRestartedApplication: an application killed and started again
//     with the same alloc.WithClientID re-attaches to its segments within
//     the lease, across a daemon restart too.
//   - TestSoak: many clients allocating, writing, reading, freeing and
//     dying (processes killed, sessions dropped) for a bounded time;
//     afterwards no acknowledged write is lost, capacity is back to 100 %,
//     and the daemon's goroutines and memory are flat.
//
// The tests build poold with -race once (TestMain) and re-execute the test
// binary as client processes. Flags make them longer: -chaos.kills and
// -chaos.soak (see the README). Linux only (the emulated CXL device lives
// in /dev/shm); they skip elsewhere.
package chaos
