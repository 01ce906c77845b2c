package listener

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHandshakesBounded: past PerSource unfinished handshakes from one
// source its next connections are closed at once while another source is
// still admitted; past Total everyone's are; Settle and Close free slots.
func TestHandshakesBounded(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	refused := make(chan string, 10)
	h, err := NewHandshakes(tl, Limits{Name: "control-plane", Total: 3, PerSource: 2, OnRefuse: func(s string) { refused <- s }})
	require.NoError(t, err)
	defer h.Close()
	addr := tl.Addr().(*net.TCPAddr)

	dial := func(from string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", addr.String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c
	}
	// accept returns the next admitted connection, after the refused ones
	// queued before it.
	accept := func() net.Conn {
		c, err := h.Accept()
		require.NoError(t, err)
		return c
	}
	// closedByServer reports whether the server closed c within 5 s (a
	// read that times out is not a close).
	closedByServer := func(c net.Conn) bool {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}

	a1, a2 := dial("127.0.0.2"), dial("127.0.0.2")
	s1, s2 := accept(), accept()
	require.Equal(t, 2, h.Pending())
	a3 := dial("127.0.0.2") // over the per-source limit
	b1 := dial("127.0.0.3")
	s3 := accept()
	require.Equal(t, "127.0.0.2", <-refused)
	require.True(t, closedByServer(a3))
	require.True(t, samePeer(b1, s3))

	b2 := dial("127.0.0.3") // over the total
	next := make(chan net.Conn)
	go func() { c, _ := h.Accept(); next <- c }()
	require.Equal(t, "127.0.0.3", <-refused, "b2 came while 3 were pending")
	Settle(s1) // a handshake done frees a slot
	Settle(s1) // only once
	b3 := dial("127.0.0.3")
	s4 := <-next
	require.True(t, closedByServer(b2))
	require.True(t, samePeer(b3, s4))
	require.Equal(t, 3, h.Pending())
	require.NoError(t, s2.Close()) // a connection closed in its handshake frees its slot
	require.Equal(t, 2, h.Pending())
	Settle(a1) // not from Accept: ignored
	require.Equal(t, 2, h.Pending())
	require.True(t, samePeer(a2, s2))
}

// TestLimitsChecked: limits out of range are refused with a
// message naming them.
func TestLimitsChecked(t *testing.T) {
	for _, lim := range []Limits{{Total: 1, PerSource: 1}, {Name: "x", Total: 0, PerSource: 0}, {Name: "x", Total: 2, PerSource: 3}} {
		_, err := NewHandshakes(newFake(), lim)
		require.ErrorContains(t, err, "per source <= total")
	}
}

// samePeer reports whether the server's conn s is the client's conn c.
func samePeer(c, s net.Conn) bool { return c.LocalAddr().String() == s.RemoteAddr().String() }
