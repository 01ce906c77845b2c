package faultproxy

import (
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo serves an echo server on loopback until the test ends.
func echo(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String()
}

// TestForwardAndKill: bytes pass both ways; KillAll resets the
// connection; a reply budget delivers at most that many bytes and then
// kills the connection.
func TestForwardAndKill(t *testing.T) {
	p, err := Start(Config{Target: echo(t)})
	require.NoError(t, err)
	defer p.Close()
	c, err := net.Dial("tcp", p.Addr())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	got := make([]byte, 4)
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.Equal(t, "ping", string(got))
	p.KillAll()
	_, err = c.Read(got)
	require.Error(t, err, "the connection survived KillAll")
	require.EqualValues(t, 1, p.Kills())

	q, err := Start(Config{Target: echo(t), ReplyBudget: func() int { return 3 }})
	require.NoError(t, err)
	defer q.Close()
	c2, err := net.Dial("tcp", q.Addr())
	require.NoError(t, err)
	defer c2.Close()
	_, err = c2.Write([]byte("hello"))
	require.NoError(t, err)
	// The reset may overtake the budget's bytes, which the kernel then
	// drops; what arrives is never more than the budget.
	b, err := io.ReadAll(c2)
	require.Error(t, err, "the connection was closed cleanly, not reset")
	require.Equal(t, "hel"[:len(b)], string(b), "bytes past the budget were delivered")
	require.EqualValues(t, 1, q.Kills())
}
