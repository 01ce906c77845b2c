// Command quickstart is farmem's first run: it connects to the local poold
// (or, when none is running, starts one inside this process on temporary
// directories and says so), allocates a segment from every tier the pool
// offers, writes and verifies it, measures it, and prints what it found —
// labelling every emulated tier as such.
//
//	go run ./examples/quickstart
package main
