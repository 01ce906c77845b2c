package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/farmem/farmem/alloc"
	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// openFDs counts the descriptors process pid holds.
func openFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	require.NoError(t, err)
	return len(ents)
}

// probes are the connections a test opens to a daemon before it exhausts
// its descriptors: a daemon that can accept nothing still answers on them.
type probes struct {
	http   *http.Client
	metric string // http://ADDR
	conn   *grpc.ClientConn
	health healthpb.HealthClient
	pool   poolv1.PoolClient
}

func openProbes(t *testing.T, sock, metricsAddr string) *probes {
	t.Helper()
	tr := &http.Transport{MaxConnsPerHost: 1, MaxIdleConnsPerHost: 1}
	t.Cleanup(tr.CloseIdleConnections)
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &probes{http: &http.Client{Transport: tr, Timeout: 10 * time.Second}, metric: "http://" + metricsAddr,
		conn: conn, health: healthpb.NewHealthClient(conn), pool: poolv1.NewPoolClient(conn)}
}

func (p *probes) get(path string) (int, string) {
	resp, err := p.http.Get(p.metric + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (p *probes) healthStatus(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := p.health.Check(ctx, &healthpb.HealthCheckRequest{Service: poolv1.Pool_ServiceDesc.ServiceName})
	if err != nil {
		return err.Error()
	}
	return r.Status.String()
}

// rdmaGossiped is the rdma capacity and free bytes this node gossips.
func (p *probes) rdmaGossiped(ctx context.Context) (capacity, free int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	r, err := p.pool.Nodes(ctx, &poolv1.NodesRequest{})
	if err != nil {
		return 0, 0, err
	}
	for _, n := range r.Nodes {
		for _, ti := range n.Tiers {
			if n.Self && ti.Tier == "rdma" {
				return ti.Capacity, ti.Free, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("no rdma tier gossiped: %v", r.Nodes)
}

// flood dials addr every few milliseconds and keeps every connection open
// until stop, so that the daemon's accept backlog is never empty. Its
// connections come from 200 loopback addresses in turn, so that a limit per
// source does not stop them before the descriptors run out.
type flood struct {
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	conns []net.Conn
}

func startFlood(addr string, limit int) *flood {
	f := &flood{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(f.done)
		for len(f.conns) < limit {
			select {
			case <-f.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			from := net.Dialer{Timeout: time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(2+len(f.conns)%200))}}
			c, err := from.Dial("tcp", addr)
			if err != nil {
				continue // backlog full: the daemon is as exhausted as it gets
			}
			f.mu.Lock()
			f.conns = append(f.conns, c)
			f.mu.Unlock()
		}
	}()
	return f
}

// end stops dialing and closes every connection.
func (f *flood) end() {
	select {
	case <-f.stop:
		return
	default:
	}
	close(f.stop)
	<-f.done
	for _, c := range f.conns {
		c.Close()
	}
}

// TestDescriptorExhaustion runs poold with a descriptor limit a few above
// what it holds once serving, then floods its data plane with connections
// until accept fails with EMFILE: poold keeps running; /readyz (on a
// connection opened before) says 503 naming the listener and the error; the
// gRPC health service says NOT_SERVING; gossip offers no free rdma bytes; a
// local client dialing meanwhile makes the unix socket's accept fail too,
// and poold survives that as well. Once the connections close everything
// serves again by itself: /readyz 200, SERVING, the rdma tier gossiped,
// and a new client allocates on the rdma tier and reads back what it wrote
// through the data plane.
func TestDescriptorExhaustion(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("lowering another process's RLIMIT_NOFILE with prlimit needs root (CAP_SYS_RESOURCE)")
	}
	data, sock := t.TempDir(), filepath.Join(shortDir(t), "p.sock")
	dataAddr, metricsAddr := freeAddr(t, "tcp"), freeAddr(t, "tcp")
	d := startDaemon(t, data, sock, "--export-size", "16MiB", "--data-listen", dataAddr, "--metrics", metricsAddr,
		"--listen", freeAddr(t, "tcp"), "--insecure", "--gossip", freeAddr(t, "gossip"), "--gossip-profile", "local")
	ctx := t.Context()
	p := openProbes(t, sock, metricsAddr)
	require.Eventually(t, func() bool { code, _ := p.get("/readyz"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	require.Equal(t, "SERVING", p.healthStatus(ctx))
	capacity, free, err := p.rdmaGossiped(ctx)
	require.NoError(t, err)
	require.Positive(t, capacity)
	require.Equal(t, capacity, free)

	pid := d.cmd.Process.Pid
	var old unix.Rlimit
	require.NoError(t, unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &old))
	limit := uint64(openFDs(t, pid) + 16)
	require.NoError(t, unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: limit, Max: old.Max}, nil))

	f := startFlood(dataAddr, 3000)
	defer f.end()
	var body string
	require.Eventually(t, func() bool {
		var code int
		code, body = p.get("/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "FAIL listener data-plane: accept failing since")
	}, 20*time.Second, 50*time.Millisecond, "readyz during exhaustion: %s", body)
	require.Contains(t, body, "too many open files")
	require.Eventually(t, func() bool { return p.healthStatus(ctx) == "NOT_SERVING" }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		_, free, err := p.rdmaGossiped(ctx)
		return err == nil && free == 0
	}, 10*time.Second, 50*time.Millisecond, "gossip still offers the rdma tier of a node that cannot accept")

	// A local client now: the unix socket's accept fails as well.
	dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	if c, err := alloc.Dial(dctx, sock); err == nil {
		c.Close() // it got in before the socket ran dry: no harm either
	}
	cancel()
	require.Eventually(t, func() bool {
		_, body = p.get("/readyz")
		return strings.Contains(body, "FAIL listener unix-socket: accept failing since")
	}, 20*time.Second, 50*time.Millisecond, "readyz after a local dial: %s", body)
	requireAlive(t, d.cmd.Process.Pid)

	f.end()
	require.Eventually(t, func() bool {
		var code int
		code, body = p.get("/readyz")
		return code == http.StatusOK
	}, 20*time.Second, 50*time.Millisecond, "readyz after the flood: %s", body)
	require.Eventually(t, func() bool { return p.healthStatus(ctx) == "SERVING" }, 10*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		_, free, err := p.rdmaGossiped(ctx)
		return err == nil && free == capacity
	}, 10*time.Second, 50*time.Millisecond, "gossip offers the rdma tier again")

	serves(t, sock, alloc.TierRDMA)

	// Every accept error counted; the log has far fewer warnings (one per
	// second per listener at most, with the count left out).
	_, metrics := p.get("/metrics")
	errs := sampleValue(t, metrics, `farmem_accept_errors_total{listener="data-plane"}`)
	require.NoError(t, d.cmd.Process.Signal(syscall.SIGTERM))
	require.NoError(t, d.cmd.Wait(), "exit status 0 on SIGTERM: %s", d.log)
	warns := strings.Count(d.log.String(), `msg="accept failed; retrying" listener=data-plane`)
	require.Positive(t, warns)
	require.Greater(t, errs, float64(warns), "accept errors %v, warnings %d", errs, warns)
	require.Contains(t, d.log.String(), `msg="accepting again" listener=data-plane`)
}

// serves checks that a new client of target allocates on tier, writes and
// reads back, and frees.
func serves(t *testing.T, target string, tier alloc.Tier, opts ...alloc.DialOption) {
	t.Helper()
	ctx := t.Context()
	c, err := alloc.Dial(ctx, target, opts...)
	require.NoError(t, err, "dial %s", target)
	defer c.Close()
	seg, err := c.Alloc(ctx, 1<<20, alloc.WithTier(tier))
	require.NoError(t, err)
	require.Equal(t, tier, seg.Tier())
	want := bytes.Repeat([]byte("served again "), 100)
	_, err = seg.WriteAt(want, 4096)
	require.NoError(t, err)
	got := make([]byte, len(want))
	_, err = seg.ReadAt(got, 4096)
	require.NoError(t, err)
	require.Equal(t, want, got)
	require.NoError(t, seg.Free(ctx))
}

// sampleValue is the value of the metric line that starts with series.
func sampleValue(t *testing.T, exposition, series string) float64 {
	t.Helper()
	for line := range strings.Lines(exposition) {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var f float64
			_, err := fmt.Sscan(v, &f)
			require.NoError(t, err)
			return f
		}
	}
	t.Fatalf("no %s in /metrics", series)
	return 0
}
