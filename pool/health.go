package pool

import (
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// health is what the daemon tells probes: the gRPC health service
// (grpc.health.v1) on both control-plane servers, and the answers of the
// HTTP /healthz and /readyz endpoints. The overall status ("") and the
// farmem.pool.v1.Pool service are NOT_SERVING until Serve runs and again
// from the moment Close begins. Safe for concurrent use.
type health struct {
	srv     *grpchealth.Server
	serving atomic.Bool
}

// healthServices are the service names whose status the health service reports.
var healthServices = []string{"", poolv1.Pool_ServiceDesc.ServiceName}

func newHealth() *health {
	h := &health{srv: grpchealth.NewServer()}
	for _, s := range healthServices {
		h.srv.SetServingStatus(s, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return h
}

// register adds the health service to a gRPC server (nil: none).
func (h *health) register(s *grpc.Server) {
	if s != nil {
		healthpb.RegisterHealthServer(s, h.srv)
	}
}

// serve marks the daemon serving.
func (h *health) serve() {
	h.serving.Store(true)
	for _, s := range healthServices {
		h.srv.SetServingStatus(s, healthpb.HealthCheckResponse_SERVING)
	}
}

// shutdown marks the daemon NOT_SERVING for good: watchers are told, and a
// later serve cannot undo it.
func (h *health) shutdown() {
	h.serving.Store(false)
	h.srv.Shutdown()
}

// readiness checks what a client needs: the daemon serving its socket, the
// metadata store open, the data plane up. It returns one line per check.
func (d *Daemon) readiness() (ready bool, report []string) {
	ready = true
	check := func(name string, ok bool, okText, failText string) {
		if ok {
			report = append(report, fmt.Sprintf("ok   %s: %s", name, okText))
			return
		}
		ready = false
		report = append(report, fmt.Sprintf("FAIL %s: %s", name, failText))
	}
	serving := d.health.serving.Load()
	check("serving", serving, "control plane on "+d.cfg.Socket, "not serving: starting or shutting down")
	d.pool.mu.Lock()
	closed := d.pool.closed
	d.pool.mu.Unlock()
	check("store", !closed, "metadata store open in "+d.cfg.DataDir, "metadata store closed")
	switch {
	case d.pool.dp == nil:
		check("data-plane", true, "disabled (no rdma tier served by this node)", "")
	default:
		check("data-plane", serving && !closed, "serving on "+d.pool.dp.addr, "not serving")
	}
	return ready, report
}

// serveHealthz answers liveness: the process runs and answers HTTP.
func (d *Daemon) serveHealthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// serveReadyz answers readiness: 200 when every check passes, else 503;
// the body lists the checks.
func (d *Daemon) serveReadyz(w http.ResponseWriter, _ *http.Request) {
	ready, report := d.readiness()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ready {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	fmt.Fprintln(w, strings.Join(report, "\n"))
}
