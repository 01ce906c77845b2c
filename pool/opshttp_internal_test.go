package pool

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// opsTest is a metrics and health server whose /hold requests are busy
// until the test ends or release is closed.
type opsTest struct {
	t       *testing.T
	o       *opsHTTP
	started chan struct{} // a /hold request is being served
	release chan struct{}
}

func startOpsTest(t *testing.T) *opsTest {
	o, err := listenOps("127.0.0.1:0", nil, nil)
	require.NoError(t, err)
	ot := &opsTest{t: t, o: o, started: make(chan struct{}, maxOpsConns), release: make(chan struct{})}
	o.serve(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			ot.started <- struct{}{}
			<-ot.release
		}
		w.Write([]byte("ok"))
	}), slog.New(slog.DiscardHandler))
	t.Cleanup(func() { o.close() })
	t.Cleanup(func() {
		select {
		case <-ot.release:
		default:
			close(ot.release)
		}
	})
	return ot
}

// dial opens a connection from IP from (127.0.0.0/8).
func (ot *opsTest) dial(from string) net.Conn {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	c, err := d.Dial("tcp", ot.o.addr())
	require.NoError(ot.t, err)
	ot.t.Cleanup(func() { c.Close() })
	return c
}

// send writes a request for path on c.
func send(c net.Conn, path string) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	_, err := fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: farmem\r\n\r\n", path)
	return err
}

// answer reads the answer to a request sent on c, leaving c open.
func answer(c net.Conn) error {
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// get sends a request for /healthz on c and reads the answer.
func get(c net.Conn) error {
	if err := send(c, "/healthz"); err != nil {
		return err
	}
	return answer(c)
}

// idle opens n connections from IP from, each left open (keep-alive)
// after one request.
func (ot *opsTest) idle(from string, n int) []net.Conn {
	cs := make([]net.Conn, n)
	for i := range cs {
		cs[i] = ot.dial(from)
		require.NoError(ot.t, get(cs[i]))
	}
	return cs
}

// busy opens n connections from IP from, each in the middle of a /hold
// request once busy returns.
func (ot *opsTest) busy(from string, n int) []net.Conn {
	cs := make([]net.Conn, n)
	for i := range cs {
		cs[i] = ot.dial(from)
		require.NoError(ot.t, send(cs[i], "/hold"))
		<-ot.started
	}
	return cs
}

// admitted checks that a request on a new connection from IP from is
// answered within 10 s: a connection is marked idle just after its answer
// is written, so the room it makes may come a moment after the answer.
func (ot *opsTest) admitted(from string) {
	ot.t.Helper()
	require.Eventually(ot.t, func() bool { return get(ot.dial(from)) == nil }, 10*time.Second, 10*time.Millisecond,
		"a new connection from %s is answered", from)
}

// requireClosed checks that the server closed c.
func requireClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the server closed the connection")
}

// TestOpsConnectionsBounded: the metrics and health endpoints keep at most
// maxOpsConnsPerSource connections of one IP open (maxOpsConns in all). A
// new connection beyond them takes the place of the oldest idle one (the
// IP's own at its limit, anyone's at the total), so a client that keeps
// its IP's connections idle cannot keep a probe from it out; a connection
// in the middle of a request is never closed, and only when every one is
// busy is the new connection closed unanswered. Idle connections and slow
// answers are timed out.
func TestOpsConnectionsBounded(t *testing.T) {
	t.Run("timeouts", func(t *testing.T) {
		ot := startOpsTest(t)
		require.Equal(t, opsIdleTimeout, ot.o.srv.IdleTimeout)
		require.Equal(t, opsWriteTimeout, ot.o.srv.WriteTimeout)
	})
	t.Run("idle makes room", func(t *testing.T) {
		ot := startOpsTest(t)
		held := ot.idle("127.0.0.1", maxOpsConnsPerSource)
		ot.admitted("127.0.0.1")
		// The oldest idle one, held[0] but for a server that had not yet
		// marked it idle after its answer when the new one came.
		closed := 0
		for _, c := range held {
			if get(c) != nil {
				closed++
			}
		}
		require.Equal(t, 1, closed, "one idle connection is closed, the others kept")
	})
	t.Run("busy is kept", func(t *testing.T) {
		ot := startOpsTest(t)
		busy := ot.busy("127.0.0.1", maxOpsConnsPerSource-1)
		idle := ot.idle("127.0.0.1", 1)[0]
		ot.admitted("127.0.0.1")
		requireClosed(t, idle)
		close(ot.release)
		for _, c := range busy {
			require.NoError(t, answer(c), "a connection in the middle of a request is not closed")
		}
	})
	t.Run("all busy refuses", func(t *testing.T) {
		ot := startOpsTest(t)
		busy := ot.busy("127.0.0.1", maxOpsConnsPerSource)
		require.Error(t, get(ot.dial("127.0.0.1")), "a connection beyond %d busy ones of one IP is closed unanswered", maxOpsConnsPerSource)
		require.NoError(t, get(ot.dial("127.0.0.2")), "another IP is admitted")
		close(ot.release)
		for _, c := range busy {
			require.NoError(t, answer(c))
		}
		ot.admitted("127.0.0.1")
	})
	t.Run("total", func(t *testing.T) {
		ot := startOpsTest(t)
		const sources = maxOpsConns / maxOpsConnsPerSource
		var oldest net.Conn
		for i := range sources {
			cs := ot.idle(fmt.Sprintf("127.0.0.%d", 2+i), maxOpsConnsPerSource)
			if i == 0 {
				oldest = cs[0]
			}
		}
		ot.admitted("127.0.0.1")
		requireClosed(t, oldest)
	})
	t.Run("total busy refuses", func(t *testing.T) {
		ot := startOpsTest(t)
		const sources = maxOpsConns / maxOpsConnsPerSource
		for i := range sources {
			ot.busy(fmt.Sprintf("127.0.0.%d", 2+i), maxOpsConnsPerSource)
		}
		require.Error(t, get(ot.dial("127.0.0.1")), "a connection beyond %d busy ones in all is closed unanswered", maxOpsConns)
	})
}
