package server

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/service"
)

// testConfig is the default configuration on free loopback ports.
func testConfig() Config {
	c := DefaultConfig()
	c.GRPC.Addr, c.HTTP.Addr, c.Debug.Addr = "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"
	return c
}

type syncWriter struct{ w io.Writer }

func (s *syncWriter) Write(p []byte) (int, error) { return s.w.Write(p) }

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func grpcHealth(t *testing.T, conn *grpc.ClientConn) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetStatus()
}

func dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestServerShutdownOrder walks a server through its shutdown phases one at a time: after
// beginShutdown health says NOT_SERVING while calls, on old and new connections, are still
// answered; after drain no new call is; close releases the ports.
func TestServerShutdownOrder(t *testing.T) {
	var logs bytes.Buffer
	s, err := New(context.Background(), testConfig(), &syncWriter{w: &logs})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	grpcAddr, httpAddr := s.grpcL.Addr().String(), s.httpL.Addr().String()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if code, _ := httpGet(t, "http://"+httpAddr+"/readyz"); code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("not ready after 10s")
		}
	}
	req := &rlsv3.RateLimitRequest{Domain: "example", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k"}}}}}
	call := func(conn *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, req)
		return err
	}
	old := dial(t, grpcAddr)
	if err := call(old); err != nil {
		t.Fatal(err)
	}
	if st := grpcHealth(t, old); st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before shutdown: %v", st)
	}

	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("run: %v", err)
	}
	s.beginShutdown()
	if st := grpcHealth(t, old); st != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health after beginShutdown: %v, want NOT_SERVING", st)
	}
	if code, body := httpGet(t, "http://"+httpAddr+"/readyz"); code != 503 || !strings.Contains(body, "shutting down") {
		t.Errorf("/readyz after beginShutdown: %d %q", code, body)
	}
	if err := call(old); err != nil {
		t.Errorf("a call on an open connection after beginShutdown: %v", err)
	}
	if err := call(dial(t, grpcAddr)); err != nil {
		t.Errorf("a call on a new connection after beginShutdown: %v", err)
	}

	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	s.drain(dctx)
	if c, err := net.DialTimeout("tcp", grpcAddr, time.Second); err == nil {
		c.Close()
		t.Errorf("the gRPC port still accepts connections after drain")
	}
	s.close()
	for _, addr := range []string{grpcAddr, httpAddr} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Errorf("%s not released after close: %v", addr, err)
			continue
		}
		l.Close()
	}
	if strings.Contains(logs.String(), "did not finish in time") {
		t.Errorf("drain forced calls closed:\n%s", logs.String())
	}
}

// TestNewFailureReleasesPorts: a server that cannot be built whole (its debug port is
// taken) fails naming the flag and leaves nothing bound.
func TestNewFailureReleasesPorts(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	grpcL, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	grpcAddr := grpcL.Addr().String()
	grpcL.Close()
	c := testConfig()
	c.GRPC.Addr, c.Debug.Addr = grpcAddr, busy.Addr().String()
	if _, err := New(context.Background(), c, io.Discard); err == nil || !strings.Contains(err.Error(), "--debug-addr") {
		t.Fatalf("got %v, want an error naming --debug-addr", err)
	}
	l, err := net.Listen("tcp", grpcAddr)
	if err != nil {
		t.Fatalf("the gRPC port is still bound after New failed: %v", err)
	}
	l.Close()
}

// TestNewLeavesProcessState: building a server, tracing on, sets neither the default
// logger nor otel's global tracer provider or propagator.
func TestNewLeavesProcessState(t *testing.T) {
	logger, tp, prop := slog.Default(), otel.GetTracerProvider(), otel.GetTextMapPropagator()
	c := testConfig()
	c.Log.Level = "debug"
	// An endpoint that refuses connections: the exporter is built but never reaches it here.
	c.Env = []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1"}
	s, err := New(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if s.tracing.provider == nil {
		t.Fatal("tracing is off; the test wants it on")
	}
	if slog.Default() != logger {
		t.Error("New replaced slog's default logger")
	}
	if otel.GetTracerProvider() != tp {
		t.Error("New set otel's global tracer provider")
	}
	if otel.GetTextMapPropagator() != prop {
		t.Error("New set otel's global propagator")
	}
}

// healthyBackend is a memory backend that reports health changes pushed by the test, as a
// backend with a store that can become unreachable does.
type healthyBackend struct {
	backend.Backend
	mu      sync.Mutex
	healthy bool
	subs    map[int]func(bool)
	next    int
}

var _ backend.Health = (*healthyBackend)(nil)

func (b *healthyBackend) Healthy() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.healthy
}

func (b *healthyBackend) SubscribeHealth(f func(bool)) func() {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.next
	b.next++
	b.subs[id] = f
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.subs, id)
	}
}

// set changes the health and tells the subscribers, in order, under the lock.
func (b *healthyBackend) set(healthy bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.healthy = healthy
	for _, f := range b.subs {
		f(healthy)
	}
}

func (b *healthyBackend) subscribers() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.subs)
}

func newHealthyBackend(t *testing.T, healthy bool) *healthyBackend {
	t.Helper()
	mem, err := backend.NewMemory(backend.MemoryOptions{MaxKeys: 10})
	if err != nil {
		t.Fatal(err)
	}
	return &healthyBackend{Backend: mem, healthy: healthy, subs: map[int]func(bool){}}
}

// TestReadinessFollowsHealth: /readyz and gRPC health follow each change the backend reports,
// logging each once; with a failure mode that still answers, rls stays ready, degraded.
func TestReadinessFollowsHealth(t *testing.T) {
	type step struct {
		healthy  bool // pushed by the backend
		wantCode int
		wantBody string
		wantGRPC healthpb.HealthCheckResponse_ServingStatus
		wantLog  string
	}
	const serving, notServing = healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	tests := []struct {
		name    string
		failure service.FailureMode
		atStart bool
		steps   []step
	}{
		{"failure mode error", service.FailError, true, []step{
			{false, 503, "backend unavailable and every failure mode is error", notServing, "backend unavailable; answering with the failure mode"},
			{false, 503, "backend unavailable", notServing, ""},
			{true, 200, "ready\n", serving, "backend available again"},
		}},
		{"failure mode allow", service.FailAllow, true, []step{
			{false, 200, "ready, degraded", serving, "backend unavailable; answering with the failure mode"},
			{true, 200, "ready\n", serving, "backend available again"},
		}},
		{"down at start", service.FailError, false, []step{
			{true, 200, "ready\n", serving, "backend available again"},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var logs bytes.Buffer
			log := slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))
			be := newHealthyBackend(t, tc.atStart)
			hs := health.NewServer()
			r := newReadiness(hs, tc.failure, nil, log)
			cancel := r.follow(be)
			r.start()
			if !tc.atStart && !strings.Contains(logs.String(), "backend unavailable at start") {
				t.Errorf("no log of the backend down at start:\n%s", logs.String())
			}
			for i, st := range tc.steps {
				logs.Reset()
				be.set(st.healthy)
				if code, body := readyz(r); code != st.wantCode || !strings.Contains(body, st.wantBody) {
					t.Errorf("step %d (healthy %v): /readyz %d %q, want %d %q", i, st.healthy, code, body, st.wantCode, st.wantBody)
				}
				for _, name := range healthServices {
					resp, err := hs.Check(context.Background(), &healthpb.HealthCheckRequest{Service: name})
					if err != nil || resp.GetStatus() != st.wantGRPC {
						t.Errorf("step %d: gRPC health %q: %v %v, want %v", i, name, resp.GetStatus(), err, st.wantGRPC)
					}
				}
				if got := logs.String(); st.wantLog == "" && got != "" || !strings.Contains(got, st.wantLog) {
					t.Errorf("step %d: logged %q, want %q", i, got, st.wantLog)
				}
			}
			cancel()
			if n := be.subscribers(); n != 0 {
				t.Errorf("%d subscriptions left after cancel", n)
			}
		})
	}
}

// TestReadinessAlwaysHealthyWithoutHealth: a backend that cannot fail (memory) keeps rls ready.
func TestReadinessAlwaysHealthyWithoutHealth(t *testing.T) {
	mem, err := backend.NewMemory(backend.MemoryOptions{MaxKeys: 10})
	if err != nil {
		t.Fatal(err)
	}
	r := newReadiness(health.NewServer(), service.FailError, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	defer r.follow(mem)()
	if code, body := readyz(r); code != 503 || !strings.Contains(body, "starting") {
		t.Errorf("before start: %d %q", code, body)
	}
	r.start()
	if code, body := readyz(r); code != 200 || body != "ready\n" {
		t.Errorf("after start: %d %q", code, body)
	}
}

// readyz serves one GET /readyz from h.
func readyz(h http.Handler) (int, string) {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest("GET", "/readyz", nil))
	return w.Code, w.Body.String()
}

func TestHTTPLimits(t *testing.T) {
	tests := []struct {
		name    string
		set     func(*HTTPLimits)
		want    HTTPLimits
		wantErr string
	}{
		{"defaults", func(*HTTPLimits) {}, HTTPLimits{5 * time.Second, 10 * time.Second, 30 * time.Second, 60 * time.Second, 64 << 10}, ""},
		{"set", func(l *HTTPLimits) {
			*l = HTTPLimits{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 1024}
		},
			HTTPLimits{time.Second, 2 * time.Second, 3 * time.Second, 4 * time.Second, 1024}, ""},
		{"zero read timeout", func(l *HTTPLimits) { l.ReadTimeout = 0 }, HTTPLimits{}, "--http-read-timeout 0s: must be > 0"},
		{"negative idle timeout", func(l *HTTPLimits) { l.IdleTimeout = -time.Second }, HTTPLimits{}, "--http-idle-timeout -1s: must be > 0"},
		{"zero header bytes", func(l *HTTPLimits) { l.MaxHeaderBytes = 0 }, HTTPLimits{}, "--http-max-header-bytes 0: must be > 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.set(&c.HTTP.HTTPLimits)
			err := c.Validate()
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || c.HTTP.HTTPLimits != tc.want {
				t.Fatalf("got %+v, %v; want %+v", c.HTTP.HTTPLimits, err, tc.want)
			}
			s := c.HTTP.server(http.NotFoundHandler())
			if s.ReadHeaderTimeout != tc.want.ReadHeaderTimeout || s.ReadTimeout != tc.want.ReadTimeout ||
				s.WriteTimeout != tc.want.WriteTimeout || s.IdleTimeout != tc.want.IdleTimeout || s.MaxHeaderBytes != tc.want.MaxHeaderBytes {
				t.Errorf("http.Server %+v does not carry %+v", s, tc.want)
			}
			if d := c.HTTP.debugServer(http.NotFoundHandler()); d.WriteTimeout != 0 || d.ReadTimeout != tc.want.ReadTimeout {
				t.Errorf("debug server: write timeout %v (want none, for profiles), read timeout %v", d.WriteTimeout, d.ReadTimeout)
			}
		})
	}
}

// cachingBackend is a healthyBackend with a local cache: it counts purges and reports hits.
type cachingBackend struct {
	*healthyBackend
	mu     sync.Mutex
	purges int
	hits   uint64
}

var (
	_ backend.CachePurger = (*cachingBackend)(nil)
	_ backend.CacheStats  = (*cachingBackend)(nil)
)

func (b *cachingBackend) PurgeCache() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.purges++
}

func (b *cachingBackend) CacheHits() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hits
}

// TestBackendCapabilities: a backend's optional capabilities are used through their named
// interfaces: health and cache hits as metrics, the cache purged on every rule reload.
func TestBackendCapabilities(t *testing.T) {
	be := &cachingBackend{healthyBackend: newHealthyBackend(t, true), hits: 7}
	reg := prometheus.NewRegistry()
	registerBackendMetrics(reg, be)
	gather := func() map[string]float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]float64{}
		for _, mf := range mfs {
			m := mf.GetMetric()[0]
			out[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return out
	}
	if got := gather(); got["rls_backend_up"] != 1 || got["rls_local_cache_hits_total"] != 7 {
		t.Errorf("healthy: %v, want rls_backend_up 1 and rls_local_cache_hits_total 7", got)
	}
	be.set(false)
	if got := gather(); got["rls_backend_up"] != 0 {
		t.Errorf("unhealthy: %v, want rls_backend_up 0", got)
	}

	// The memory backend has neither capability, and reports its own: keys, bytes, evictions,
	// and the slots of concurrency limits it found expired.
	mem, err := backend.NewMemory(backend.MemoryOptions{MaxKeys: 64})
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewRegistry()
	registerBackendMetrics(reg, mem)
	if got := gather(); len(got) != 4 || got["rls_memory_keys"] != 0 || got["rls_memory_evictions_total"] != 0 || got["rls_slots_expired_total"] != 0 {
		t.Errorf("memory backend, empty: metrics %v, want rls_memory_keys, rls_memory_bytes, rls_memory_evictions_total and rls_slots_expired_total, all 0", got)
	}
	// 200 keys holding usage (1 an hour) in a backend of 64: the rest are evicted, and counted.
	l := limit.Limit{Rate: 1, Period: time.Hour, Burst: 1}
	for i := range 200 {
		if _, err := mem.Decide(context.Background(), []backend.Request{{Key: fmt.Sprint("k", i), Limit: l, Cost: 1}}, make([]backend.Decision, 1)); err != nil {
			t.Fatal(err)
		}
	}
	if got := gather(); got["rls_memory_keys"] == 0 || got["rls_memory_keys"] > 64 || got["rls_memory_bytes"] <= 0 || got["rls_memory_evictions_total"] != 200-got["rls_memory_keys"] {
		t.Errorf("memory backend, 200 keys into 64: metrics %v, want keys ≤ 64, the rest evicted", got)
	}

	// A reload purges the cache, once per rule set applied.
	rules, err := LoadRules("", descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	metrics, err := service.NewMetrics(prometheus.NewRegistry(), 0)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := service.New(rules, service.Options{Backend: be, Local: mem, Logger: log, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{log: log, be: be, svc: svc}
	for range 2 {
		if err := s.applyRules(); err != nil {
			t.Fatal(err)
		}
	}
	if be.purges != 2 {
		t.Errorf("2 reloads purged the cache %d times", be.purges)
	}
}

// TestMetricsAddrAndHealthcheck: --metrics-addr serves the metrics at --metrics-path, and
// /healthcheck says what /readyz says, as envoyproxy/ratelimit's probe expects it.
func TestMetricsAddrAndHealthcheck(t *testing.T) {
	c := testConfig()
	c.Metrics.Addr, c.Metrics.Path = "127.0.0.1:0", "/stats/prometheus"
	s, err := New(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.ready.healthcheck(rec, httptest.NewRequest("GET", "/healthcheck", nil))
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), "starting") {
		t.Errorf("/healthcheck before start: %d %q, want 500 starting", rec.Code, rec.Body.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Shutdown(s.Run(ctx)) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := httpGet(t, "http://"+s.httpL.Addr().String()+"/healthcheck")
		if code == 200 && body == "OK" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck: %d %q", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := httpGet(t, "http://"+s.metricsL.Addr().String()+"/stats/prometheus"); code != 200 || !strings.Contains(body, "rls_config_generation") {
		t.Errorf("metrics listener: %d, %d bytes", code, len(body))
	}
	if code, _ := httpGet(t, "http://"+s.metricsL.Addr().String()+"/json"); code != 404 {
		t.Errorf("metrics listener serves /json: %d", code)
	}
}
