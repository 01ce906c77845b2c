//go:build !amd64

package main

import "time"

var epoch = time.Now()

// cycles counts nanoseconds of the monotonic clock where there is no
// time-stamp counter to read.
func cycles() uint64 { return uint64(time.Since(epoch)) }
