//go:build !linux

package tcp

import (
	"io"
	"net"
	"time"
)

// newBusyReader returns nc: busy polling is implemented on Linux only.
func newBusyReader(nc net.Conn, _ time.Duration, _ func() int) io.Reader { return nc }
