//go:build linux

package testcluster

import (
	"fmt"
	"net"
	"os"
	"testing"
)

// BenchmarkNew measures building a 3-host cluster; each iteration also
// removes the previous one, since New first cleans its prefix.
func BenchmarkNew(b *testing.B) {
	prefix := fmt.Sprintf("fmtb%d", os.Getpid())
	for b.Loop() {
		New(b, Options{Hosts: 3, Prefix: prefix})
	}
}

// BenchmarkDial compares Host.Dial (a thread moved into the namespace and
// back) with net.Dial in the test's own namespace, both to a listener on
// that namespace's loopback.
func BenchmarkDial(b *testing.B) {
	c := New(b, Options{Hosts: 1})
	h := c.Hosts[0]
	inNS, err := h.Listen(b.Context(), "tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	root, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range []net.Listener{inNS, root} {
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Close()
			}
		}()
	}
	b.Cleanup(func() { inNS.Close(); root.Close() })
	b.Run("net.Dial", func(b *testing.B) {
		for b.Loop() {
			conn, err := net.Dial("tcp4", root.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			conn.Close()
		}
	})
	b.Run("Host.Dial", func(b *testing.B) {
		for b.Loop() {
			conn, err := h.Dial(b.Context(), "tcp4", inNS.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			conn.Close()
		}
	})
}
