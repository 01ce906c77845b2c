// Package oncecheck is a test workload that checks that writes and atomics
// are applied exactly once while the connections under them break: Add64
// and CAS from a few goroutines against a Target (a segment, a data-plane
// client), whose retry layer the test puts behind a fault-injecting proxy
// (internal/faultproxy). It checks the counter against the successful and
// indeterminate adds, that successful adds saw distinct previous values
// (each one linearizes at its own point), and that every CAS's answer is
// what its owner, the only writer of its word, must see: a CAS that says it
// did not swap really did not store. A last, short run of reads and CAS on
// one shared word is checked for linearizability with porcupine
// (coherence/lincheck).
//
// Run is safe to call from one test at a time per Target; it runs its own
// goroutines and waits for them. Any OS.
package oncecheck
