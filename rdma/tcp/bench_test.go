package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// The benchmarks compare the transport with raw Go TCP on 127.0.0.1 doing
// the same amount of network work, measured in the same run:
//
//	go test -run '^$' -bench . -benchtime 2s ./rdma/tcp
//
// The raw server answers every 80-byte request (the size of our request
// header) with a payload of the requested size, batching its writes the way
// a careful hand-written server would (flush when no request is buffered).

// rawServer is the baseline: no keys, no ids, no checks.
type rawServer struct {
	l    net.Listener
	wg   sync.WaitGroup
	data []byte
	mu   sync.Mutex
	cs   []net.Conn
}

func startRaw(tb testing.TB, size int) *rawServer {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	rs := &rawServer{l: l, data: make([]byte, size)}
	rs.wg.Add(1)
	go func() {
		defer rs.wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			rs.mu.Lock()
			rs.cs = append(rs.cs, c)
			rs.mu.Unlock()
			rs.wg.Add(1)
			go rs.serve(c)
		}
	}()
	tb.Cleanup(func() {
		l.Close()
		rs.mu.Lock()
		for _, c := range rs.cs {
			c.Close()
		}
		rs.mu.Unlock()
		rs.wg.Wait()
	})
	return rs
}

// serve answers each request (u32 length at offset 0, u32 count at 4) with
// count payloads of length bytes.
func (rs *rawServer) serve(c net.Conn) {
	defer rs.wg.Done()
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	bw := bufio.NewWriterSize(c, 256<<10)
	var req [reqHeaderSize]byte
	for {
		if br.Buffered() < len(req) {
			if bw.Flush() != nil {
				return
			}
		}
		if _, err := io.ReadFull(br, req[:]); err != nil {
			return
		}
		n := int(binary.LittleEndian.Uint32(req[0:]))
		count := max(int(binary.LittleEndian.Uint32(req[4:])), 1)
		for range count {
			if _, err := bw.Write(rs.data[:n]); err != nil {
				return
			}
		}
	}
}

func rawDial(tb testing.TB, rs *rawServer) net.Conn {
	tb.Helper()
	c, err := net.Dial("tcp", rs.l.Addr().String())
	require.NoError(tb, err)
	tb.Cleanup(func() { c.Close() })
	return c
}

func rawRequest(n, count int) []byte {
	req := make([]byte, reqHeaderSize)
	binary.LittleEndian.PutUint32(req[0:], uint32(n))
	binary.LittleEndian.PutUint32(req[4:], uint32(count))
	return req
}

// rawLatencies does n request/response round trips of size bytes.
func rawLatencies(tb testing.TB, c net.Conn, size, n int) []time.Duration {
	req := rawRequest(size, 1)
	buf := make([]byte, size)
	lat := make([]time.Duration, n)
	for i := range n {
		t0 := time.Now()
		if _, err := c.Write(req); err != nil {
			tb.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			tb.Fatal(err)
		}
		lat[i] = time.Since(t0)
	}
	return lat
}

// rawPipelined does n requests of size bytes with depth outstanding on one
// connection and returns the elapsed time.
func rawPipelined(tb testing.TB, c net.Conn, size, depth, n int) time.Duration {
	req := rawRequest(size, 1)
	window := make(chan struct{}, depth)
	t0 := time.Now()
	var werr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		bw := bufio.NewWriterSize(c, 16<<10)
		for range n {
			select {
			case window <- struct{}{}:
			default:
				// About to wait for responses: send what is batched.
				if werr = bw.Flush(); werr != nil {
					return
				}
				window <- struct{}{}
			}
			if _, werr = bw.Write(req); werr != nil {
				return
			}
		}
		werr = bw.Flush()
	}()
	br := bufio.NewReaderSize(c, 64<<10)
	buf := make([]byte, size)
	for range n {
		if _, err := io.ReadFull(br, buf); err != nil {
			tb.Fatal(err)
		}
		<-window
	}
	d := time.Since(t0)
	wg.Wait()
	require.NoError(tb, werr)
	return d
}

// rawStream receives n payloads of size bytes streamed back to back.
func rawStream(tb testing.TB, c net.Conn, size, n int) time.Duration {
	buf := make([]byte, size)
	t0 := time.Now()
	if _, err := c.Write(rawRequest(size, n)); err != nil {
		tb.Fatal(err)
	}
	for range n {
		if _, err := io.ReadFull(c, buf); err != nil {
			tb.Fatal(err)
		}
	}
	return time.Since(t0)
}

func p50(lat []time.Duration) time.Duration {
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[len(s)/2]
}

func benchSetup(b *testing.B, size int, opts ...Option) (*Client, rdma.Region, *rawServer) {
	b.Helper()
	s := startServer(b, ServerConfig{})
	_, r := s.export(b, 1, 64<<20)
	c := dial(b, s.addr, opts...)
	rs := startRaw(b, size)
	// Warm both paths up.
	buf := make([]byte, size)
	for range 100 {
		require.NoError(b, c.Read(context.Background(), r, 0, buf))
	}
	rawLatencies(b, rawDial(b, rs), size, 100)
	return c, r, rs
}

// BenchmarkRead4KLatency: one 4 KiB remote read at a time vs one raw TCP
// 4 KiB request/response at a time. Target: p50 ratio ≤ 1.25.
func BenchmarkRead4KLatency(b *testing.B) {
	const size = 4 << 10
	c, r, rs := benchSetup(b, size)
	rc := rawDial(b, rs)
	ctx := context.Background()
	buf := make([]byte, size)
	n := max(b.N, 1000)

	b.StopTimer()
	raw := p50(rawLatencies(b, rc, size, n))
	lat := make([]time.Duration, 0, n)
	b.ReportAllocs()
	b.ResetTimer()
	b.StartTimer()
	for range b.N {
		t0 := time.Now()
		if err := c.Read(ctx, r, 0, buf); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	ours := p50(lat)
	ratio := float64(ours) / float64(raw)
	b.ReportMetric(float64(ours.Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(raw.Nanoseconds()), "raw-p50-ns")
	b.ReportMetric(ratio, "ratio")
	b.Logf("4 KiB read latency: p50 %v, raw TCP p50 %v, ratio %.3f (target ≤ 1.25), n=%d", ours, raw, ratio, b.N)
}

// BenchmarkRead4KDepth16: 4 KiB reads from 16 goroutines (16 in flight) vs a
// raw TCP connection pipelining 16 requests for 4 KiB. Target: ratio ≥ 0.8;
// also reports reads/s (target ≥ 80k/s).
func BenchmarkRead4KDepth16(b *testing.B) {
	const (
		size  = 4 << 10
		depth = 16
	)
	c, r, rs := benchSetup(b, size)
	rc := rawDial(b, rs)
	n := max(b.N, 10_000)

	b.StopTimer()
	rawD := rawPipelined(b, rc, size, depth, n)
	rawRate := float64(n) / rawD.Seconds()

	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, depth)
	b.ReportAllocs()
	b.ResetTimer()
	b.StartTimer()
	t0 := time.Now()
	for range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, size)
			ctx := context.Background()
			for next.Add(1) <= int64(b.N) {
				if err := c.Read(ctx, r, 0, buf); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	rate := float64(b.N) / d.Seconds()
	ratio := rate / rawRate
	b.ReportMetric(rate, "reads/s")
	b.ReportMetric(rawRate, "raw-reads/s")
	b.ReportMetric(ratio, "ratio")
	b.Logf("4 KiB reads at depth 16: %.0f reads/s, raw TCP pipelined %.0f/s, ratio %.3f (target ≥ 0.8; reads/s target ≥ 80000), n=%d", rate, rawRate, ratio, b.N)
}

// BenchmarkRead1M: 1 MiB reads, 4 in flight, vs raw TCP streaming 1 MiB
// payloads back to back on one connection. Target: ratio ≥ 0.8.
func BenchmarkRead1M(b *testing.B) {
	const (
		size  = 1 << 20
		depth = 4
	)
	c, r, rs := benchSetup(b, size)
	rc := rawDial(b, rs)
	n := max(b.N, 200)

	b.StopTimer()
	rawD := rawStream(b, rc, size, n)
	rawBW := float64(n) * size / rawD.Seconds()

	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, depth)
	b.SetBytes(size)
	b.ReportAllocs()
	b.ResetTimer()
	b.StartTimer()
	t0 := time.Now()
	for i := range depth {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, size)
			ctx := context.Background()
			for next.Add(1) <= int64(b.N) {
				if err := c.Read(ctx, r, int64(i)*size, buf); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	d := time.Since(t0)
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	bw := float64(b.N) * size / d.Seconds()
	ratio := bw / rawBW
	b.ReportMetric(bw/(1<<20), "MiB/s")
	b.ReportMetric(rawBW/(1<<20), "raw-MiB/s")
	b.ReportMetric(ratio, "ratio")
	b.Logf("1 MiB reads (%d in flight): %.0f MiB/s, raw TCP streaming %.0f MiB/s, ratio %.3f (target ≥ 0.8), n=%d", depth, bw/(1<<20), rawBW/(1<<20), ratio, b.N)
}
