package tcp

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// tcpPair returns both ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err != nil {
			c = nil
		}
		acc <- c
	}()
	a, err = net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	b = <-acc
	require.NotNil(t, b)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// busy returns a busyReader of c that always wants to spin and never
// takes a slow poll for preemption (the tests' machine may be loaded).
func busy(t *testing.T, c net.Conn, spin time.Duration) *busyReader {
	t.Helper()
	r, ok := newBusyReader(c, spin, func() int { return spinRead }).(*busyReader)
	require.True(t, ok, "a TCP connection gets a busyReader")
	r.gap = time.Hour
	return r
}

// backOf is r's backoff for the waits of class, as its Read sees it.
func backOf(r *busyReader, class int) *backoff {
	r.class = class
	return r.classBackoff()
}

// later writes s to c after d: a peer's answer that comes while the
// reader waits. The channel gets the number of spinners at that moment, so
// a test sees whether the reader was polling or parked.
func later(c net.Conn, d time.Duration, s string) <-chan int32 {
	at := make(chan int32, 1)
	go func() {
		time.Sleep(d)
		at <- spinners.Load()
		c.Write([]byte(s))
	}()
	return at
}

// readString reads once from r.
func readString(t *testing.T, r io.Reader) string {
	t.Helper()
	buf := make([]byte, 16)
	n, err := r.Read(buf)
	require.NoError(t, err)
	return string(buf[:n])
}

func TestBusyReaderOnlyWhereItCan(t *testing.T) {
	a, b := tcpPair(t)
	for _, spin := range []time.Duration{0, -1} {
		// Off: it reads (with raw system calls) without asking want, and
		// parks until the data comes.
		want := func() int { t.Errorf("spin %v: want asked, as if it could poll", spin); return spinRead }
		r, ok := newBusyReader(a, spin, want).(*busyReader)
		require.True(t, ok, "spin %v: a raw reader", spin)
		go func() {
			time.Sleep(10 * time.Millisecond)
			b.Write([]byte("off"))
		}()
		require.Equal(t, "off", readString(t, r), "spin %v", spin)
	}
	p, q := net.Pipe()
	defer p.Close()
	defer q.Close()
	require.Equal(t, p, newBusyReader(p, time.Millisecond, nil), "not TCP: the connection itself")
}

func TestBusyReaderFindsDataWhileSpinning(t *testing.T) {
	a, b := tcpPair(t)
	r := busy(t, a, 10*time.Second)
	at := later(b, 2*time.Millisecond, "hello")
	require.Equal(t, "hello", readString(t, r))
	require.Equal(t, int32(1), <-at, "the reader was polling when the answer came")
	require.Zero(t, backOf(r, spinRead).miss, "the data came within the spin")
	require.Zero(t, backOf(r, spinRead).skip)
	require.Zero(t, spinners.Load(), "the spinner slot is given back")
}

func TestBusyReaderBacksOffAfterMisses(t *testing.T) {
	a, b := tcpPair(t)
	r := busy(t, a, 20*time.Microsecond)
	for k := 1; k <= 3; k++ {
		want := string(rune('0' + k))
		// The reads that skip spinning come first: they find nothing
		// buffered and park, as net.Conn.Read does.
		for backOf(r, spinRead).skip > 0 {
			later(b, 20*time.Millisecond, want)
			require.Equal(t, want, readString(t, r))
		}
		later(b, 20*time.Millisecond, want)
		require.Equal(t, want, readString(t, r))
		require.Equal(t, k, backOf(r, spinRead).miss, "spin %d found nothing", k)
		require.Equal(t, 1<<k, backOf(r, spinRead).skip)
	}
	require.Zero(t, spinners.Load())
	// A hit resets the backoff.
	backOf(r, spinRead).skip, r.spin = 0, 10*time.Second
	later(b, time.Millisecond, "y")
	require.Equal(t, "y", readString(t, r))
	require.Zero(t, backOf(r, spinRead).miss)
}

// TestBusyReaderBacksOffPerClass: the answers of one class of waits
// coming late (writes that a home forwards before it answers) do not stop
// the reader from polling for the other (reads, whose answers come within
// the spin).
func TestBusyReaderBacksOffPerClass(t *testing.T) {
	a, b := tcpPair(t)
	r := busy(t, a, 20*time.Microsecond)
	class := spinOther
	r.want = func() int { return class }
	later(b, 20*time.Millisecond, "w") // a late answer: a miss
	require.Equal(t, "w", readString(t, r))
	require.Equal(t, 1, backOf(r, spinOther).miss)
	require.Equal(t, 2, backOf(r, spinOther).skip)
	class = spinRead
	r.spin = 10 * time.Second
	at := later(b, 2*time.Millisecond, "r")
	require.Equal(t, "r", readString(t, r))
	require.Equal(t, int32(1), <-at, "the read polled, the writes' misses notwithstanding")
	require.Zero(t, backOf(r, spinRead).miss)
	require.Equal(t, backoff{skip: 2, miss: 1}, *backOf(r, spinOther), "a read's hit leaves the other class's backoff")
	require.Zero(t, spinners.Load())
}

func TestBusyReaderPreemptedBacksOffMost(t *testing.T) {
	a, b := tcpPair(t)
	r := busy(t, a, 10*time.Second)
	class := spinOther
	r.want = func() int { return class }
	r.gap = 0 // every pause between polls looks like a preemption
	later(b, 20*time.Millisecond, "z")
	require.Equal(t, "z", readString(t, r))
	most := backoff{miss: maxMiss, skip: 1 << maxMiss}
	require.Equal(t, most, *backOf(r, spinOther))
	require.Equal(t, most, *backOf(r, spinRead), "the cores are busy, whatever a wait is for")
	require.Zero(t, spinners.Load())
	// The next read does not poll.
	class, r.gap = spinRead, time.Hour
	at := later(b, 2*time.Millisecond, "r")
	require.Equal(t, "r", readString(t, r))
	require.Equal(t, int32(0), <-at, "a read after a descheduled poll parks")
}

func TestBusyReaderHonoursTheSpinnerLimit(t *testing.T) {
	a, b := tcpPair(t)
	r := busy(t, a, 10*time.Second)
	spinners.Store(maxSpinners())
	defer spinners.Store(0)
	at := later(b, 5*time.Millisecond, "q")
	require.Equal(t, "q", readString(t, r))
	require.Equal(t, maxSpinners(), <-at, "no slot: the reader parked instead of polling")
	require.Zero(t, backOf(r, spinRead).miss, "parking for want of a slot is no miss")
	require.Equal(t, maxSpinners(), spinners.Load())
}

func TestBusyReaderErrorsAreNetConns(t *testing.T) {
	a, b := tcpPair(t)
	r := busy(t, a, time.Millisecond)
	buf := make([]byte, 4)

	require.NoError(t, a.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
	_, err := r.Read(buf)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.NoError(t, a.SetReadDeadline(time.Time{}))

	n, err := r.Read(nil)
	require.NoError(t, err)
	require.Zero(t, n)

	require.NoError(t, b.Close())
	_, err = r.Read(buf)
	require.ErrorIs(t, err, io.EOF)

	require.NoError(t, a.Close())
	_, err = r.Read(buf)
	require.True(t, errors.Is(err, net.ErrClosed), "read after Close: %v", err)
	require.Zero(t, spinners.Load())
}

// TestBusyPollEngagesOnlyForLoneOps: a client's connection turns busy
// polling on after a run of lone requests, a leading caller polling in its
// op's class (a READ's, or the others'); a batch of several ops turns it
// off again; the class is cleared before the next reader (readLoop) reads.
func TestBusyPollEngagesOnlyForLoneOps(t *testing.T) {
	s := startServer(t, ServerConfig{})
	_, r := s.export(t, 1, 1<<20)
	c := dial(t, s.addr, WithConns(1))
	ctx := context.Background()
	buf := make([]byte, 64)
	cc := c.conns[0]
	var mu sync.Mutex
	var asked []int
	<-cc.rdToken
	br, ok := cc.rd.src.(*busyReader)
	require.True(t, ok, "a plain TCP connection is read by a busyReader")
	want := br.want
	br.want = func() int {
		k := want()
		mu.Lock()
		asked = append(asked, k)
		mu.Unlock()
		return k
	}
	cc.rdToken <- struct{}{}
	only := func(what string, class int) {
		t.Helper()
		mu.Lock()
		got := asked
		asked = nil
		mu.Unlock()
		require.NotEmpty(t, got, what)
		for _, k := range got {
			require.Equal(t, class, k, "%s: classes asked %v", what, got)
		}
		<-cc.rdToken
		require.Equal(t, noSpin, cc.spin, "%s: the class is left for the next reader", what)
		cc.rdToken <- struct{}{}
	}
	for range loneRun { // the run after which lone ops poll
		require.NoError(t, c.Read(ctx, r, 0, buf))
	}
	<-cc.rdToken // lone and spin are the token holder's
	require.True(t, cc.lone.long(), "a run of lone ops")
	cc.rdToken <- struct{}{}
	mu.Lock()
	asked = nil
	mu.Unlock()
	require.NoError(t, c.Read(ctx, r, 0, buf))
	only("a lone READ", spinRead)
	require.NoError(t, c.Write(ctx, r, 0, buf))
	only("a lone WRITE", spinOther)
	_, err := c.FetchAdd64(ctx, r, 0, 1)
	require.NoError(t, err)
	only("a lone FADD", spinOther)
	ops := make([]*rdma.Op, 8)
	for i := range ops {
		ops[i] = &rdma.Op{Kind: rdma.OpRead, Region: r, Offset: int64(i) * 64, Buf: make([]byte, 64)}
	}
	require.NoError(t, c.Do(ctx, ops...))
	only("a batch of 8", noSpin)
	<-cc.rdToken
	require.False(t, cc.lone.long(), "ops sent together are not alone")
	cc.rdToken <- struct{}{}
}

// TestBusyPollServerRun: a server connection counts the run of flushes that
// carried one response each.
func TestBusyPollServerRun(t *testing.T) {
	s := startServer(t, ServerConfig{})
	_, r := s.export(t, 1, 1<<20)
	c, err := Dial(context.Background(), s.addr, WithConns(1))
	require.NoError(t, err)
	buf := make([]byte, 64)
	for range 2 * loneRun {
		require.NoError(t, c.Read(context.Background(), r, 0, buf))
	}
	s.mu.Lock()
	require.Len(t, s.conns, 1)
	var sc *srvConn
	for sc = range s.conns {
	}
	s.mu.Unlock()
	// Its goroutine owns lone: once the client is gone it drops the
	// connection under s.mu, after its last flush.
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns) == 0
	}, 10*time.Second, time.Millisecond)
	require.True(t, sc.lone.long(), "a run of single-response flushes")
	require.Nil(t, s.lastFlush.Load(), "a dropped connection is not kept alive")
}
