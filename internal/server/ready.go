package server

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
// "ratelimit" is the name envoyproxy/ratelimit reports on, which its users' probes may ask for.
var healthServices = []string{"", rlsv3.RateLimitService_ServiceDesc.ServiceName, "ratelimit"}

// readiness is what /readyz and gRPC health report. While the backend is unavailable rls is
// ready only if a failure mode still answers: the default one (--failure-mode) or that of some
// rule in force (failure_mode allow, deny or local). When every failure mode is error every
// answer would be UNAVAILABLE, and saying so lets load balancers and Envoy's health checks act
// on it; when a rule answers, taking the process out of its Service would leave Envoy no rls at
// all, and that rule's failure mode would never run. It follows the backend's health as the backend reports its changes
// (backend.Health); a backend without Health is always available.
type readiness struct {
	hs      *health.Server
	failure service.FailureMode
	// answers says whether some failure mode answers without the backend (see readiness); nil:
	// whether failure does.
	answers func() bool
	log     *slog.Logger

	mu       sync.Mutex
	started  bool
	stopping bool
	healthy  bool
	heard    bool // a change arrived from the backend: newer than any seed
	// waitRules: not ready until rules are loaded (rules from xDS, not there yet).
	waitRules bool
	// degraded says what part of the backend is unavailable while the rest answers.
	degraded func() string
}

func newReadiness(hs *health.Server, failure service.FailureMode, answers func() bool, log *slog.Logger) *readiness {
	// Until start, nothing is SERVING (the health server reports "" SERVING by default).
	for _, name := range healthServices {
		hs.SetServingStatus(name, healthpb.HealthCheckResponse_NOT_SERVING)
	}
	return &readiness{hs: hs, failure: failure, answers: answers, log: log, healthy: true}
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
	if d, ok := be.(backend.Degradation); ok {
		r.degraded = d.Degraded
	}
	r.mu.Unlock()
	return cancel
}

// needRules makes readiness wait for rulesLoaded when need is true.
func (r *readiness) needRules(need bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waitRules = need
}

// rulesLoaded records that rules are loaded: the first ones, or new ones whose failure modes
// may answer differently without the backend.
func (r *readiness) rulesLoaded() {
	r.mu.Lock()
	defer r.mu.Unlock()
	first := r.waitRules
	r.waitRules = false
	if !r.started {
		return
	}
	if first {
		r.log.Info("rules loaded: ready")
	}
	r.publishLocked()
}

// failureAnswers says whether some failure mode answers without the backend.
func (r *readiness) failureAnswers() bool {
	if r.answers != nil {
		return r.answers()
	}
	return r.failure != service.FailError
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
	return r.started && !r.stopping && !r.waitRules && (r.healthy || r.failureAnswers())
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

// state says whether rls is ready and, in words, why or why not.
func (r *readiness) state() (ready bool, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.started:
		return false, "not ready: starting"
	case r.stopping:
		return false, "not ready: shutting down"
	case r.waitRules:
		return false, "not ready: no rules loaded yet"
	case !r.readyLocked():
		return false, "not ready: backend unavailable and every failure mode is error"
	case !r.healthy:
		return true, "ready, degraded: backend unavailable; answering with the failure modes (default " + r.failure.String() + ")"
	}
	if r.degraded != nil {
		if part := r.degraded(); part != "" {
			return true, "ready, degraded: " + part + "; their decisions get failure mode " + r.failure.String()
		}
	}
	return true, "ready"
}

// ServeHTTP serves /readyz: 200 when ready (saying "degraded" while the failure mode answers),
// 503 otherwise, with the reason.
func (r *readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	ready, why := r.state()
	if !ready {
		http.Error(w, why, http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, why+"\n")
}

// healthcheck serves envoyproxy/ratelimit's /healthcheck: 200 "OK" when ready, else 500 with
// the reason.
func (r *readiness) healthcheck(w http.ResponseWriter, _ *http.Request) {
	ready, why := r.state()
	if !ready {
		http.Error(w, why, http.StatusInternalServerError)
		return
	}
	io.WriteString(w, "OK")
}
