package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rls-project/rls/internal/service"
)

// readiness is what /readyz and gRPC health report. While the backend is unavailable rls is
// ready only if its failure mode still answers (allow, deny or local): with failure mode error
// every answer would be UNAVAILABLE, and saying so lets load balancers and Envoy's health checks
// act on it.
type readiness struct {
	hs      *health.Server
	failure service.FailureMode
	log     *slog.Logger

	mu       sync.Mutex
	started  bool
	stopping bool
	healthy  bool
}

func newReadiness(hs *health.Server, failure service.FailureMode, log *slog.Logger) *readiness {
	// Until start, nothing is SERVING (the health server reports "" SERVING by default).
	for _, name := range healthServices {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return &readiness{hs: hs, failure: failure, log: log}
}

// start marks start-up complete with the backend's current health.
func (r *readiness) start(healthy bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started, r.healthy = true, healthy
	if !healthy {
		r.log.Warn("backend unavailable at start", "failure_mode", r.failure.String())
	}
	r.publishLocked()
}

// watch polls the backend's health until ctx ends, logging each change once.
func (r *readiness) watch(ctx context.Context, healthy func() bool, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h := healthy()
		r.mu.Lock()
		if h != r.healthy && !r.stopping {
			r.healthy = h
			if h {
				r.log.Info("backend available again; deciding with it")
			} else {
				r.log.Warn("backend unavailable; answering with the failure mode", "failure_mode", r.failure.String())
			}
			r.publishLocked()
		}
		r.mu.Unlock()
	}
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
