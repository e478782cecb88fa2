package main

import (
	"io"
	"log/slog"
	"net/http"
	"sync"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/service"
)

// healthServices are the names gRPC health reports on.
var healthServices = []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName}

// readiness is what /readyz and gRPC health report. While the backend is unavailable rls is
// ready only if its failure mode still answers (allow, deny or local): with failure mode error
// every answer would be UNAVAILABLE, and saying so lets load balancers and Envoy's health checks
// act on it. It follows the backend's health as the backend reports its changes
// (backend.Health); a backend without Health is always available.
type readiness struct {
	hs      *health.Server
	failure service.FailureMode
	log     *slog.Logger

	mu       sync.Mutex
	started  bool
	stopping bool
	healthy  bool
	heard    bool // a change arrived from the backend: newer than any seed
}

func newReadiness(hs *health.Server, failure service.FailureMode, log *slog.Logger) *readiness {
	// Until start, nothing is SERVING (the health server reports "" SERVING by default).
	for _, name := range healthServices {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return &readiness{hs: hs, failure: failure, log: log, healthy: true}
}

// follow makes r follow be's health until cancel is called. It subscribes before reading the
// current health, so no change falls between the two.
func (r *readiness) follow(be backend.Backend) (cancel func()) {
	h, ok := be.(backend.Health)
	if !ok {
		return func() {}
	}
	cancel = h.SubscribeHealth(r.set)
	healthy := h.Healthy()
	r.mu.Lock()
	if !r.heard {
		r.healthy = healthy
	}
	r.mu.Unlock()
	return cancel
}

// start marks start-up complete.
func (r *readiness) start() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started = true
	if !r.healthy {
		r.log.Warn("backend unavailable at start", "failure_mode", r.failure.String())
	}
	r.publishLocked()
}

// set records a change of the backend's health, logging it once.
func (r *readiness) set(healthy bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.heard = true
	if healthy == r.healthy || r.stopping {
		return
	}
	r.healthy = healthy
	if !r.started {
		return // start reports it
	}
	if healthy {
		r.log.Info("backend available again; deciding with it")
	} else {
		r.log.Warn("backend unavailable; answering with the failure mode", "failure_mode", r.failure.String())
	}
	r.publishLocked()
}

// stop reports NOT_SERVING from now on (shutdown).
func (r *readiness) stop() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stopping = true
	r.hs.Shutdown()
}

func (r *readiness) readyLocked() bool {
	return r.started && !r.stopping && (r.healthy || r.failure != service.FailError)
}

func (r *readiness) publishLocked() {
	if r.stopping {
		return
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if r.readyLocked() {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range healthServices {
		r.hs.SetServingStatus(name, st)
	}
}

// ServeHTTP serves /readyz: 200 when ready (saying "degraded" while the failure mode answers),
// 503 otherwise, with the reason.
func (r *readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	ready, started, stopping, healthy := r.readyLocked(), r.started, r.stopping, r.healthy
	r.mu.Unlock()
	switch {
	case !started:
		http.Error(w, "not ready: starting", http.StatusServiceUnavailable)
	case stopping:
		http.Error(w, "not ready: shutting down", http.StatusServiceUnavailable)
	case !ready:
		http.Error(w, "not ready: backend unavailable and failure mode is error", http.StatusServiceUnavailable)
	case !healthy:
		io.WriteString(w, "ready, degraded: backend unavailable; answering with failure mode "+r.failure.String()+"\n")
	default:
		io.WriteString(w, "ready\n")
	}
}
