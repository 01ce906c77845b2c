package verbs

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestMuxRoutes: a connection that opens with the verbs magic goes to the
// verbs handler; any other reaches Accept with its first bytes intact,
// including one that sends fewer than four bytes and stops.
func TestMuxRoutes(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	got := make(chan [4]byte, 1)
	m := newMux(l, 200*time.Millisecond, func(nc net.Conn, first [4]byte) {
		got <- first
		nc.Close()
	})
	defer func() { m.Close(); m.wait() }()

	v, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	defer v.Close()
	_, err = v.Write(appendHello(nil, testQP(), nil))
	require.NoError(t, err)
	require.Equal(t, magic, <-got)

	tests := []struct {
		name string
		send string
	}{
		{"tcp hello", "FMRD\x01\x00\x00\x00rest of the stream"},
		{"short", "FM"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("tcp", l.Addr().String())
			require.NoError(t, err)
			defer c.Close()
			_, err = c.Write([]byte(tt.send))
			require.NoError(t, err)
			a, err := m.Accept()
			require.NoError(t, err)
			defer a.Close()
			if tt.name == "tcp hello" {
				_, ok := a.(*tcpPrefixed)
				require.True(t, ok, "a TCP connection keeps *net.TCPConn's methods (writev)")
			}
			b := make([]byte, len(tt.send))
			_, err = io.ReadFull(a, b)
			require.NoError(t, err)
			require.Equal(t, tt.send, string(b))
		})
	}

	require.NoError(t, m.Close())
	_, err = m.Accept()
	require.ErrorIs(t, err, net.ErrClosed)
}
