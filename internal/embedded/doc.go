// Package embedded connects a program to the local poold, or, when none
// answers, starts one inside the process on temporary directories (in
// shared memory where the host has it) and says so: what lets the examples
// run with one command on a fresh machine.
//
// Connect is safe for concurrent use; each call that starts a daemon starts
// its own.
package embedded
