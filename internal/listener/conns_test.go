package listener

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConnsMakeRoom: at its per-source limit a source's oldest idle
// connection makes room for its new one, at the total anyone's oldest
// idle one does; busy connections are never closed, and a new connection
// is refused when every one that could make room is busy. A connection
// closed (by its server or to make room) counts no more, once.
func TestConnsMakeRoom(t *testing.T) {
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var logs bytes.Buffer
	var refused []string
	c, err := NewConns(tl, Limits{Name: "metrics", Total: 3, PerSource: 2, OnRefuse: func(s string) { refused = append(refused, s) },
		Logger: slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))})
	require.NoError(t, err)
	defer c.Close()

	// conn dials from IP from and returns the client's end and the
	// server's, or nil for the server's when the connection was refused.
	conn := func(from string) (cl, srv net.Conn) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		cl, err := d.Dial("tcp", tl.Addr().String())
		require.NoError(t, err)
		t.Cleanup(func() { cl.Close() })
		nc, err := c.Listener.Accept()
		require.NoError(t, err)
		if tc := c.admit(nc); tc != nil {
			require.True(t, samePeer(cl, tc))
			return cl, tc
		}
		nc.Close()
		return cl, nil
	}
	// closed reports whether the server closed cl (a read that times out
	// is not a close).
	closed := func(cl net.Conn) bool {
		cl.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := cl.Read(make([]byte, 1))
		return errors.Is(err, io.EOF)
	}

	a1, s1 := conn("127.0.0.2")
	a2, s2 := conn("127.0.0.2")
	SetIdle(s1, false)
	SetIdle(s2, false)
	a3, s3 := conn("127.0.0.2")
	require.Nil(t, s3, "both of the source's connections are busy")
	require.True(t, closed(a3))
	require.Equal(t, []string{"127.0.0.2"}, refused)
	require.Contains(t, logs.String(), "refused a connection: limit reached")

	SetIdle(s2, true)
	a4, s4 := conn("127.0.0.2")
	require.NotNil(t, s4, "the idle one made room")
	require.True(t, closed(a2))
	require.False(t, closed(a1), "the busy one is kept though older")
	s2.Close() // its server closing it too counts it off once
	require.Len(t, c.open, 2)
	require.Contains(t, logs.String(), "closed the oldest idle connection to make room")

	b1, s5 := conn("127.0.0.3")
	require.NotNil(t, s5)
	SetIdle(s1, true) // the oldest idle of all now, from another source than the next
	b2, s6 := conn("127.0.0.3")
	require.NotNil(t, s6, "at the total, anyone's oldest idle connection makes room")
	require.True(t, closed(a1))
	require.False(t, closed(a4))
	require.False(t, closed(b1))

	for _, s := range []net.Conn{s4, s5, s6} {
		SetIdle(s, false)
	}
	_, s7 := conn("127.0.0.4")
	require.Nil(t, s7, "every connection is busy")
	require.NoError(t, s6.Close())
	require.True(t, closed(b2))
	_, s8 := conn("127.0.0.4")
	require.NotNil(t, s8, "a connection closed makes room")
	SetIdle(a4, true) // not from Accept: ignored
	require.Len(t, c.open, 3)
	require.Equal(t, []string{"127.0.0.2", "127.0.0.4"}, refused)
}
