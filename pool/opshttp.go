package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/farmem/farmem/internal/listener"
)

// opsHTTP is the HTTP server on Config.Metrics that operators' tools
// scrape and probe: /metrics (Prometheus), /healthz and /readyz. A nil
// *opsHTTP (metrics off) does nothing. Safe for concurrent use.
type opsHTTP struct {
	l    net.Listener
	srv  *http.Server
	done chan struct{} // closed when Serve returns; nil until serve
}

// Bounds of the metrics and health endpoints' connections: at most
// maxOpsConnsPerSource open from one IP (maxOpsConns in all). A new
// connection beyond either limit takes the place of the oldest idle one
// (the IP's own at its limit, anyone's at the total) and is closed at
// once only when all those are in the middle of a request, so a tenant on
// the host that keeps its 16 connections open and idle cannot keep the
// local health probes and scrapes out (listener.Conns). A connection idle
// between requests for opsIdleTimeout is closed, and an answer must be
// written within opsWriteTimeout. A scraper or probe keeps one or two
// connections, so these leave room for many while a host that opens them
// by the hundred cannot take the descriptors the daemon's other listeners
// need.
const (
	maxOpsConns          = 64
	maxOpsConnsPerSource = 16
	opsIdleTimeout       = 30 * time.Second
	opsWriteTimeout      = 30 * time.Second
)

// listenOps binds the metrics address; "" means no server (nil, nil).
func listenOps(addr string, ls *listeners, log *slog.Logger) (*opsHTTP, error) {
	if addr == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics on %s: %w (choose another address with --metrics, or leave it empty for none)", addr, err)
	}
	h, err := listener.NewConns(ls.wrap(l, listenerMetrics), listener.Limits{
		Name: listenerMetrics, Logger: log, Total: maxOpsConns, PerSource: maxOpsConnsPerSource,
	})
	if err != nil {
		l.Close()
		return nil, err
	}
	return &opsHTTP{l: h}, nil
}

// addr is the bound address ("" when off).
func (o *opsHTTP) addr() string {
	if o == nil {
		return ""
	}
	return o.l.Addr().String()
}

// serve answers requests with h in the background until close.
func (o *opsHTTP) serve(h http.Handler, log *slog.Logger) {
	if o == nil {
		return
	}
	o.srv = &http.Server{
		Handler: h, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: opsIdleTimeout, WriteTimeout: opsWriteTimeout,
		// A connection is busy from a request read until its answer is
		// written; before its first request and between requests it may
		// be closed to make room (listenOps).
		ConnState: func(c net.Conn, s http.ConnState) { listener.SetIdle(c, s == http.StateNew || s == http.StateIdle) },
	}
	o.done = make(chan struct{})
	go func() {
		defer close(o.done)
		if err := o.srv.Serve(o.l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("metrics and health endpoints stopped", "addr", o.addr(), "err", err)
		}
	}()
}

// close stops the server and its connections and waits for it.
func (o *opsHTTP) close() error {
	if o == nil {
		return nil
	}
	if o.srv == nil {
		return o.l.Close()
	}
	err := o.srv.Close()
	<-o.done
	return err
}

// startOps serves metrics and health on Config.Metrics, once New has built
// everything they read.
func (d *Daemon) startOps() {
	d.metrics.watch(d.pool)
	if d.ops == nil {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(d.metrics.reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(d.log.Handler(), slog.LevelError), Registry: d.metrics.reg,
	}))
	mux.HandleFunc("/healthz", d.serveHealthz)
	mux.HandleFunc("/readyz", d.serveReadyz)
	d.ops.serve(mux, d.log)
	d.log.Info("metrics and health endpoints", "addr", d.ops.addr(), "paths", "/metrics /healthz /readyz")
}

// MetricsAddr is the bound address of the metrics and health endpoints
// ("" without Config.Metrics).
func (d *Daemon) MetricsAddr() string { return d.ops.addr() }
