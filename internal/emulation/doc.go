// Package emulation injects latency into far-memory accesses so that a
// developer without the hardware can see how a program would behave with
// CXL memory at ~200 ns or RDMA at ~2 µs.
//
// A [Spec] is what poold's --emulate-latency flag, its emulate-latency key
// and alloc.WithEmulateLatency take: per tier, a target latency and an
// optional bandwidth cap, written
//
//	cxl=200ns,rdma=2us/12GB/s
//
// [Parse] reads it; a mistake is a [*SyntaxError] that says what to write
// instead. An [Injector] applies one tier's [Target] to a call: the caller
// notes the time before the untreated operation, does it, and calls
// [Injector.Wait], which spins (sleeping first for long waits) until
// target latency + size/bandwidth has passed since then. The wait is
// calibrated once per process against the real cost of reading the clock
// and of the code around the operation, so that the whole call takes the
// target, not the target plus the real cost. An operation whose real cost
// already exceeds the target is not slowed further: emulation only adds
// latency, it cannot remove it.
//
// Emulation is honest: whatever shows an injected latency labels it
// "injected", never as a measurement of real hardware.
//
// Concurrency: Spec, Target and Injector are plain values, safe for
// concurrent use; Calibrate runs once per process and is safe to call from
// many goroutines.
//
// OS and tags: none.
package emulation
