package pool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/protobuf/proto"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
	"github.com/farmem/farmem/cxl"
	"github.com/farmem/farmem/internal/errs"
	"github.com/farmem/farmem/internal/fdpass"
	"github.com/farmem/farmem/internal/logsample"
)

// Daemon is a running poold: the pool, its unix socket (gRPC and descriptor
// passing) and the lease reaper. Construct it with New, run it with Serve,
// stop it with Close. It is safe for concurrent use.
type Daemon struct {
	cfg  Config
	log  *slog.Logger
	data dataSecurity // the data plane's TLS, and the CA clients verify homes with
	pool *core
	inv  atomic.Pointer[cxl.Inventory] // as last read: at start, then by each rescan (hotplug.go)
	mux  *mux
	grpc *grpc.Server
	tcp  *grpc.Server // control plane for peers and memctl on Listen; nil without it
	tcpL net.Listener

	remeasuring remeasuring // measurements after device changes (hotplug.go)

	// joined is set once a first join of the cluster answered (or there
	// were no seeds but this node): from then on joinLoop contacts again
	// the seeds that left (membership.go).
	joined atomic.Bool

	metrics   *metrics   // Prometheus instrumentation; see metrics.go
	listeners *listeners // every listener above, for readiness; see accepting.go
	health    *health    // gRPC health service and readiness; see health.go
	ops       *opsHTTP   // /metrics, /healthz, /readyz on Config.Metrics; nil without it

	refusalLog logsample.Sampler[refusalKey] // lines about refused requests (refusal.go)

	lock *os.File // the data directory's lock, held until Close

	stop      chan struct{}
	failOnce  sync.Once
	failErr   atomic.Pointer[error] // why the daemon stopped itself (fail); nil while it serves
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New discovers the host's memory, opens the metadata store, restores the
// segment table and listens on the socket. It does not serve until Serve.
func New(cfg Config, log *slog.Logger) (_ *Daemon, err error) {
	// Absolute paths: status shows them, and they mean the same after a
	// change of working directory.
	cfg.Socket, cfg.DataDir = absPath(cfg.Socket), absPath(cfg.DataDir)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The data directory's lock first: a second daemon on it must hear
	// that, not about a device, port or socket the first one holds.
	lock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.Close()
		}
	}()
	if err := socketInUse(cfg.Socket); err != nil {
		return nil, err
	}
	// The socket before the devices: a socket that cannot be used must not
	// leave segment directories behind.
	l, err := listenUnix(cfg.Socket)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			l.Close()
		}
	}()
	inv, devs, err := discover(cfg, log)
	if err != nil {
		return nil, err
	}
	m := newMetrics()
	ls := newListeners(log, m.reg)
	sec, err := cfg.dataSecurity()
	if err != nil {
		return nil, err
	}
	var dp *dataPlane
	if cfg.ExportSize > 0 && cfg.DataListen != "" {
		if dp, err = newDataPlane(cfg.DataListen, dataPlaneConfig(cfg, log, m), sec, ls); err != nil {
			for _, d := range devs {
				d.Close()
			}
			return nil, err
		}
	}
	p, err := newCore(cfg, log, devs, dp, m)
	if err != nil {
		if dp != nil {
			dp.close()
		}
		return nil, err
	}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	m.reg.MustRegister(newQuotaCollector(p))
	if dp != nil {
		m.reg.MustRegister(newCoherenceCollector(dp.coh))
	}
	ops, err := listenOps(cfg.Metrics, ls, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			ops.close()
		}
	}()
	d := &Daemon{cfg: cfg, log: log, data: sec, pool: p, stop: make(chan struct{}), metrics: m, listeners: ls, health: newHealth(), ops: ops, lock: lock}
	d.inv.Store(inv)
	p.setHMAT(inv)
	d.grpc = grpc.NewServer(append(controlOptions(cfg), grpc.Creds(peerCreds{}))...)
	poolv1.RegisterPoolServer(d.grpc, &service{d: d})
	d.health.register(d.grpc)
	if d.mux, err = newMux(ls.wrap(l, listenerUnix), d.allow, d.serveFD, log); err != nil {
		return nil, err
	}
	if cfg.Listen != "" {
		if d.tcpL, err = listenControl(cfg.Listen, ls, log); err != nil {
			d.mux.shutdown()
			return nil, err
		}
		opts, err := cfg.tcpServerOptions(controlOptions(cfg)...)
		if err != nil {
			d.tcpL.Close()
			d.mux.shutdown()
			return nil, err
		}
		d.tcp = grpc.NewServer(opts...)
		poolv1.RegisterPoolServer(d.tcp, &service{d: d})
		d.health.register(d.tcp)
		if cfg.Insecure {
			log.Warn("control plane on TCP without TLS (--insecure): anyone who reaches it can allocate and free; use it only on a trusted network", "listen", d.tcpL.Addr().String())
		}
		if cfg.DataInsecure && dp != nil {
			log.Warn("data plane without TLS (--data-insecure): credentials, keys and data cross the network readable, and a captured handshake can be replayed; use it only on a trusted network", "data_listen", dp.addr)
		}
	}
	if cfg.Gossip != "" {
		if err := d.startCluster(d.tcpL.Addr().String()); err != nil {
			d.tcpL.Close()
			d.mux.shutdown()
			return nil, err
		}
	}
	d.startOps()
	return d, nil
}

// absPath is p made absolute; p itself if that fails (the daemon then
// reports the path it could not use).
func absPath(p string) string {
	if p == "" {
		return p
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// sessionProbe makes the control plane ping a connection that has been
// silent for a quarter of the lease TTL (at least 1s) and close it when the
// ping is not answered within as long again. A client that is partitioned
// or paused never closes its session stream, and its lease must not outlive
// it: closing the connection ends its sessions, and its lease then runs out
// one TTL later, as after a clean disconnect.
func sessionProbe(ttl time.Duration) keepalive.ServerParameters {
	d := max(ttl/4, time.Second)
	return keepalive.ServerParameters{Time: d, Timeout: d}
}

// maxStreamsPerConn bounds the calls one control-plane connection has
// open at once (HTTP/2 MaxConcurrentStreams), so that one connection
// cannot hold goroutines and buffers by the thousand. A client holds one
// session stream and its calls; one past the bound waits for a call to
// end (grpc-go queues it) rather than fail.
const maxStreamsPerConn = 256

// controlOptions are the options both gRPC servers (the unix socket and
// Config.Listen) share.
func controlOptions(cfg Config) []grpc.ServerOption {
	return append([]grpc.ServerOption{
		grpc.ConnectionTimeout(handshakeTimeout),
		grpc.MaxConcurrentStreams(maxStreamsPerConn),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(sessionProbe(cfg.LeaseTTL)),
	}, cfg.sim.grpc...)
}

// untilClosed returns a context derived from parent that also ends when
// stop is closed (the daemon, or its peer sessions, stopping). The caller
// must call cancel.
func untilClosed(parent context.Context, stop <-chan struct{}) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(parent)
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Start is New followed by Serve in the background: the daemon serves by
// the time it returns. Close stops it.
func Start(cfg Config, log *slog.Logger) (*Daemon, error) {
	d, err := New(cfg, log)
	if err != nil {
		return nil, err
	}
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if err := d.Serve(); err != nil {
			d.log.Error("serve", "err", err)
		}
	}()
	return d, nil
}

// Serve answers clients until Close. It returns nil after Close.
func (d *Daemon) Serve() error {
	d.wg.Add(2)
	go d.every(min(d.cfg.LeaseTTL/4, time.Second), d.pool.reap)
	// The health service is NOT_SERVING while a listener fails to accept.
	go d.every(listenerCheck, func() { d.health.degrade(d.listeners.anyFailing()) })
	if dp := d.pool.data(); dp != nil {
		dp.serve()
	}
	d.pool.resumeMoves()
	d.startRebuilds()
	d.startRebalance()
	if d.tcp != nil {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := d.tcp.Serve(d.tcpL); err != nil {
				d.log.Error("control plane on TCP stopped", "err", err)
			}
		}()
	}
	var tiers []any
	for _, t := range d.pool.tiers() {
		tiers = append(tiers, tierName(t.Tier), fmt.Sprintf("%s emulated=%v capacity=%d", t.Kind, t.Emulated, t.Capacity))
	}
	d.log.Info("poold serving", append([]any{"node", d.cfg.Node, "socket", d.cfg.Socket, "data-dir", d.cfg.DataDir, "segments", d.pool.segmentCount()}, tiers...)...)
	d.health.serve()
	d.pool.resumeEvacuation()
	if d.cfg.Hotplug {
		d.followDevices()
	}
	if d.cfg.MeasureTiers {
		first := make(chan struct{})
		d.pool.mu.Lock()
		d.pool.firstMeasure = first
		d.pool.mu.Unlock()
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			defer close(first)
			ctx, cancel := untilClosed(context.Background(), d.stop)
			defer cancel()
			if err := d.pool.measureTiers(ctx); err != nil && ctx.Err() == nil {
				d.log.Warn("measure tiers", "err", err)
			}
		}()
		if d.pool.gossip() != nil && d.cfg.MeasurePeersEvery > 0 {
			d.wg.Add(1)
			go func() {
				defer d.wg.Done()
				d.remeasurePeers()
			}()
		}
	}
	err := d.grpc.Serve(grpcListener{d.mux})
	if failed := d.failErr.Load(); failed != nil {
		return *failed
	}
	select {
	case <-d.stop:
		return nil
	default:
		return err
	}
}

// fail stops serving because the daemon cannot run as configured (its
// node name is taken in the cluster): Serve returns err, and Close then
// shuts gossip down without a leave, which would speak for the name's
// rightful holder too.
func (d *Daemon) fail(err error) {
	d.failOnce.Do(func() {
		d.log.Error("stopping", "err", err)
		d.failErr.Store(&err)
		d.grpc.Stop()
	})
}

// Config returns the configuration the daemon runs with.
func (d *Daemon) Config() Config { return d.cfg }

// Inventory returns what discovery found: at start, then at the last
// rescan after the kernel's device events. The caller must not change it.
func (d *Daemon) Inventory() *cxl.Inventory { return d.inv.Load() }

// allow checks a local peer against the allow list: the daemon's own uid and root.
func (d *Daemon) allow(p peerInfo) error { return d.cfg.allowLocal(p) }

// serveFD answers descriptor requests on one connection until it closes.
func (d *Daemon) serveFD(c *net.UnixConn, peer peerInfo) {
	defer c.Close()
	// Close the connection at shutdown; the watcher ends with the
	// connection, not with the daemon (one per client connection would
	// pile up otherwise).
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-d.stop:
			c.Close()
		case <-done:
		}
	}()
	for {
		req, err := fdpass.ReadRequest(c)
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				d.log.Warn("descriptor request refused; closing connection", "pid", peer.PID, "err", err)
			}
			return
		}
		if err := d.answerFD(c, peer, req); err != nil {
			return
		}
	}
}

func (d *Daemon) answerFD(c *net.UnixConn, peer peerInfo, req fdpass.Request) error {
	cl, err := d.callerOf(req.Session, localCaller(peer))
	if err == nil && cl.client == nil {
		err = fmt.Errorf("%w: descriptor requests need a session", errs.ErrAccessDenied)
	}
	if err != nil {
		return fdpass.WriteResponse(c, err, nil, 0, 0, nil)
	}
	id := req.Segment
	var body []byte
	switch req.Op {
	case fdpass.OpFree:
		return fdpass.WriteResponse(c, d.free(cl, req.Segment, ""), nil, 0, 0, nil)
	case fdpass.OpRelease:
		d.pool.Unmapped(cl, req.Segment)
		return fdpass.WriteResponse(c, nil, nil, 0, 0, nil)
	case fdpass.OpAlloc:
		var ar poolv1.AllocRequest
		if err := proto.Unmarshal(req.Body, &ar); err != nil {
			return fdpass.WriteResponse(c, fmt.Errorf("%w: alloc request: %v", errs.ErrInvalid, err), nil, 0, 0, nil)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		seg, err := d.alloc(ctx, cl, &ar)
		cancel()
		if err == nil {
			body, err = proto.Marshal(seg)
		}
		if err != nil {
			return fdpass.WriteResponse(c, err, nil, 0, 0, nil)
		}
		if seg.Tier == poolv1.Tier_TIER_RDMA {
			return fdpass.WriteResponse(c, nil, nil, 0, 0, body) // reached through the data plane
		}
		id = seg.Id
	}
	b, err := d.pool.Backing(cl, id)
	if err != nil {
		d.descriptorRefused(cl, id, err)
		if req.Op == fdpass.OpAlloc {
			// The client never got it: do not leave it behind.
			if ferr := d.pool.Free(cl, id, ""); ferr != nil {
				d.log.Error("free a segment whose descriptor could not be sent", "segment", id, "err", ferr)
			}
		}
		return fdpass.WriteResponse(c, err, nil, 0, 0, nil)
	}
	defer b.File.Close()
	return fdpass.WriteResponse(c, nil, b.File, b.Offset, b.Length, body)
}

// every calls fn each period until the daemon stops; a goroutine of d.wg.
func (d *Daemon) every(period time.Duration, fn func()) {
	defer d.wg.Done()
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-d.stop:
			return
		case <-t.C:
			fn()
		}
	}
}

// Close stops serving, waits for calls in flight (up to a few seconds),
// and closes the store and devices. It is idempotent.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		d.health.shutdown()
		if cl := d.pool.gossip(); cl != nil && d.failErr.Load() == nil {
			if err := cl.Leave(2 * time.Second); err != nil {
				d.log.Warn("leave the cluster", "err", err)
			}
		}
		close(d.stop)
		if d.tcp != nil {
			d.tcp.Stop()
			d.tcpL.Close()
		}
		done := make(chan struct{})
		go func() {
			d.grpc.GracefulStop()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			d.grpc.Stop()
			<-done
		}
		d.mux.shutdown()
		d.mux.wg.Wait()
		d.wg.Wait()
		var clErr error
		if cl := d.pool.gossip(); cl != nil {
			clErr = cl.Shutdown()
		}
		d.closeErr = errors.Join(d.ops.close(), d.pool.close(), clErr, d.lock.Close())
	})
	return d.closeErr
}

// ListenAddr is the TCP address of the control plane ("" without Listen).
func (d *Daemon) ListenAddr() string {
	if d.tcpL == nil {
		return ""
	}
	return d.tcpL.Addr().String()
}
