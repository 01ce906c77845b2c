//go:build !amd64

package main

// prefetch is a no-op where the example has no prefetch instruction.
func prefetch(uintptr) {}

// prefetchLines is a no-op where the example has no prefetch instruction.
func prefetchLines(uintptr, uintptr) {}
