package pool

import (
	"bufio"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestOpsConnectionsBounded: the metrics and health endpoints keep at most
// maxOpsConnsPerSource connections of one IP open, idle between requests
// or not, and close more at once; one closed makes room for the next. Idle
// connections and slow answers are timed out.
func TestOpsConnectionsBounded(t *testing.T) {
	o, err := listenOps("127.0.0.1:0", nil, nil)
	require.NoError(t, err)
	o.serve(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("ok")) }), slog.New(slog.DiscardHandler))
	t.Cleanup(func() { o.close() })
	require.Equal(t, opsIdleTimeout, o.srv.IdleTimeout)
	require.Equal(t, opsWriteTimeout, o.srv.WriteTimeout)

	// get sends a request on a new connection and reads the answer,
	// leaving the connection open (keep-alive).
	get := func() (net.Conn, error) {
		c, err := net.Dial("tcp", o.addr())
		if err != nil {
			return nil, err
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: farmem\r\n\r\n")); err != nil {
			return nil, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return nil, err
		}
		resp.Body.Close()
		return c, nil
	}
	held := make([]net.Conn, 0, maxOpsConnsPerSource)
	for range maxOpsConnsPerSource {
		c, err := get()
		require.NoError(t, err)
		held = append(held, c)
	}
	_, err = get()
	require.Error(t, err, "a connection beyond %d of one IP is closed unanswered", maxOpsConnsPerSource)
	held[0].Close()
	require.Eventually(t, func() bool {
		_, err := get()
		return err == nil
	}, 10*time.Second, 10*time.Millisecond, "a connection closed makes room")
}
