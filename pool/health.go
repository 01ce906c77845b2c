package pool

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	poolv1 "github.com/farmem/farmem/api/pool/v1"
)

// health is what the daemon tells probes: the gRPC health service
// (grpc.health.v1) on both control-plane servers, and the answers of the
// HTTP /healthz and /readyz endpoints. The overall status ("") and the
// farmem.pool.v1.Pool service are NOT_SERVING until Serve runs, while a
// listener fails to accept (degrade), and from the moment Close begins.
// Safe for concurrent use.
type health struct {
	srv     *grpchealth.Server
	serving atomic.Bool

	mu       sync.Mutex
	degraded bool // a listener fails to accept
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
	h.mu.Lock()
	defer h.mu.Unlock()
	h.serving.Store(true)
	h.publishLocked()
}

// degrade marks the daemon NOT_SERVING while failing holds, SERVING again
// (if it serves) when it no longer does.
func (h *health) degrade(failing bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.degraded == failing {
		return
	}
	h.degraded = failing
	h.publishLocked()
}

func (h *health) publishLocked() {
	st := healthpb.HealthCheckResponse_SERVING
	if !h.serving.Load() || h.degraded {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	for _, s := range healthServices {
		h.srv.SetServingStatus(s, st)
	}
}

// shutdown marks the daemon NOT_SERVING for good: watchers are told, and a
// later serve cannot undo it.
func (h *health) shutdown() {
	h.serving.Store(false)
	h.srv.Shutdown()
}

// readiness checks what a client needs: the daemon serving its socket, the
// metadata store open and committing with its reserve for frees in place,
// the data plane up, every listener accepting (not backing off after EMFILE
// and the like). It returns one line per check.
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
	closed := d.pool.isClosed()
	switch {
	case closed:
		check("store", false, "", "metadata store closed")
	default:
		err := d.pool.storeHealth()
		check("store", err == nil, "metadata store open in "+d.cfg.DataDir, fmt.Sprint(err))
	}
	switch dp := d.pool.data(); {
	case dp == nil:
		check("data-plane", true, "disabled (no rdma tier served by this node)", "")
	default:
		check("data-plane", serving && !closed, "serving on "+dp.addr, "not serving")
	}
	for _, s := range d.listeners.statuses() {
		check("listener "+s.Name, !s.Failing, "accepting on "+s.Addr, s.String())
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
