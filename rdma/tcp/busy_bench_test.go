package tcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/farmem/farmem/rdma"
)

// BenchmarkReadWhileBusy: how late a client learns of its response when
// every P has runnable goroutines. Rounds alternate between no load and
// 4×GOMAXPROCS goroutines that run short CPU-bound work and never wait on
// the network (as a cache's hot Gets do); it reports a 1 KiB Read's p50
// in each and their ratio busy/idle. In "yield" the load yields after
// each piece of work, in "mutex" it takes turns on a few contended
// mutexes. The server runs in a child process (this test binary again),
// as a pool daemon on the same host does ("child"), or in the
// benchmark's process, as an embedded pool ("inproc"), where its
// goroutines wait for requests in the same busy scheduler.
//
//	go test -run '^$' -bench BenchmarkReadWhileBusy -benchtime 400x ./rdma/tcp
func BenchmarkReadWhileBusy(b *testing.B) {
	addr, r := childServer(b)
	s := startServer(b, ServerConfig{})
	_, rin := s.export(b, 1, 1<<20)
	ctx := context.Background()
	buf := make([]byte, 1024)
	for _, bc := range []struct {
		server, style string
	}{{"child", "yield"}, {"child", "mutex"}, {"inproc", "yield"}, {"inproc", "mutex"}} {
		b.Run(bc.server+"/"+bc.style, func(b *testing.B) {
			at, reg := addr, r
			if bc.server == "inproc" {
				at, reg = s.addr, rin
			}
			cl := dial(b, at)
			read := func(n int) []time.Duration {
				lat := make([]time.Duration, 0, n)
				for range n {
					start := time.Now()
					require.NoError(b, cl.Read(ctx, reg, 0, buf))
					lat = append(lat, time.Since(start))
					time.Sleep(50 * time.Microsecond) // not back to back
				}
				return lat
			}
			var idle, busy []time.Duration
			const nround = 8
			per := b.N/nround + 1
			for range nround {
				idle = append(idle, read(per)...)
				stop := load(bc.style, 4*runtime.GOMAXPROCS(0))
				busy = append(busy, read(per)...)
				stop()
			}
			b.ReportMetric(float64(p50(idle))/1e3, "idle-p50-µs")
			b.ReportMetric(float64(p50(busy))/1e3, "busy-p50-µs")
			b.ReportMetric(float64(p50(busy))/float64(p50(idle)), "busy/idle")
		})
	}
}

var loadSink atomic.Uint64

// load starts n goroutines of CPU-bound work in the given style and
// returns a function that stops them.
func load(style string, n int) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	mus := make([]sync.Mutex, 4)
	for i := range n {
		wg.Go(func() {
			x := uint64(i) + 1
			for !done.Load() {
				mu := &mus[i%len(mus)]
				if style == "mutex" {
					mu.Lock()
				}
				for range 300 { // about a microsecond
					x ^= x << 13
					x ^= x >> 7
					x ^= x << 17
				}
				if style == "mutex" {
					mu.Unlock()
				} else {
					runtime.Gosched()
				}
			}
			loadSink.Add(x) // keeps the work from being optimised away
		})
	}
	return func() {
		done.Store(true)
		wg.Wait()
	}
}

// benchServeEnv makes the test binary serve benchKey's segment instead of
// running tests (see childServer).
const benchServeEnv = "FARMEM_TCP_BENCH_SERVE"

var benchKey = rdma.Key{1, 2, 3}

// childServer starts this test binary as a server of a 1 MiB segment in a
// child process and returns its address and the segment's region.
func childServer(tb testing.TB) (string, rdma.Region) {
	tb.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), benchServeEnv+"=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(tb, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(tb, err)
	require.NoError(tb, cmd.Start())
	tb.Cleanup(func() {
		stdin.Close()
		require.NoError(tb, cmd.Wait())
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(tb, err)
	return addr[:len(addr)-1], rdma.Region{Segment: 1, Key: benchKey, Epoch: 1}
}

// serveForBench serves benchKey's segment on 127.0.0.1, prints its address
// and returns when stdin closes: the child process of childServer.
func serveForBench() error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	s := NewServer(ServerConfig{Logger: quietLogger()})
	if err := s.ExportKey(1, make([]byte, 1<<20), 1, benchKey); err != nil {
		return err
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(l) }()
	fmt.Println(l.Addr())
	io.Copy(io.Discard, os.Stdin)
	return errors.Join(s.Close(), <-served)
}
