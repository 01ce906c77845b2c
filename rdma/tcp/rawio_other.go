//go:build !linux

package tcp

import "net"

// rawWrites returns nil: raw socket writes are made on Linux only.
func rawWrites(net.Conn) func(*net.Buffers) error { return nil }
