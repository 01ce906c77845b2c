// Package redundancy names how many lost homes a segment survives — n full
// copies, or k data and m parity shards (Reed–Solomon) — and parses and
// checks the text form the command line uses ("none", "replicas=2",
// "ec=4+2"). The client library, poold and memctl share it, so the three
// accept and refuse the same specs with the same messages.
//
// A Spec is a plain value, safe to copy and to use from many goroutines.
package redundancy
