package tcp

import (
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestRawWrites writes batches of up to rawMaxWrite bytes (raw writev
// calls), each in more buffers than one writev takes and with empty ones
// among them, to a reader that starts late, so the socket fills: the
// writes wait for it in the poller, go on where the kernel stopped, and
// consume each batch; then one batch larger than rawMaxWrite (the
// runtime's path). The reader gets every byte in order. A write past the
// deadline fails as a timeout, and one after Close as net.ErrClosed.
func TestRawWrites(t *testing.T) {
	a, b := tcpPair(t)
	write := rawWrites(a)
	require.NotNil(t, write)
	var want []byte
	var batches []net.Buffers
	for range 700 { // some 20 MB: more than the socket buffers hold
		var nb net.Buffers
		n := 0
		for i := range maxIovecs + 100 {
			buf := bytes.Repeat([]byte{byte(len(want) + n)}, i%58)
			n += len(buf)
			nb = append(nb, buf)
		}
		require.LessOrEqual(t, n, rawMaxWrite)
		for _, buf := range nb {
			want = append(want, buf...)
		}
		batches = append(batches, nb)
	}
	big := net.Buffers{bytes.Repeat([]byte{7}, 3*rawMaxWrite)}
	want = append(want, big[0]...)
	batches = append(batches, big)
	got := make(chan []byte, 1)
	go func() {
		time.Sleep(50 * time.Millisecond) // the socket fills first
		buf := make([]byte, len(want))
		if _, err := io.ReadFull(b, buf); err != nil {
			buf = nil
		}
		got <- buf
	}()
	for i := range batches {
		require.NoError(t, write(&batches[i]))
		require.Empty(t, batches[i], "batch %d is consumed", i)
	}
	require.Equal(t, want, <-got)

	// Nobody reads b now: small writes fill the socket and time out.
	require.NoError(t, a.SetWriteDeadline(time.Now().Add(50*time.Millisecond)))
	var err error
	for err == nil {
		nb := net.Buffers{make([]byte, rawMaxWrite)}
		err = write(&nb)
	}
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "%v", err)

	require.NoError(t, a.Close())
	more := net.Buffers{[]byte("x")}
	require.ErrorIs(t, write(&more), net.ErrClosed)
}

// TestRawOnlyNonBlocking: a socket set blocking (through a dup of its
// descriptor, as os.File.Fd does) is read and written the runtime's way,
// where a raw call could wait for ever holding its processor.
func TestRawOnlyNonBlocking(t *testing.T) {
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	require.Nil(t, rawWrites(p), "not TCP")

	a, _ := tcpPair(t)
	require.NotNil(t, rawWrites(a))
	f, err := a.(*net.TCPConn).File()
	require.NoError(t, err)
	defer f.Close()
	f.Fd() // sets the shared file description blocking
	require.Nil(t, rawWrites(a), "blocking socket")
	require.Equal(t, a, newBusyReader(a, time.Millisecond, func() int { return spinRead }), "blocking socket: the connection itself")
}
