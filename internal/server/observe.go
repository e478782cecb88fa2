package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/logthrottle"
)

// tracingSetup is the OpenTelemetry tracing of one server; its zero value is tracing off. It is
// handed to what needs it, never installed process-wide: no otel.SetTracerProvider,
// SetTextMapPropagator or SetErrorHandler, so two servers in one process do not share tracing.
type tracingSetup struct {
	tracer     trace.Tracer // nil when off
	provider   *sdktrace.TracerProvider
	propagator propagation.TextMapPropagator
}

// tracingEnabled reports whether the standard OTEL_* variables ask for trace export: an OTLP
// endpoint is set, or OTEL_TRACES_EXPORTER is otlp. OTEL_TRACES_EXPORTER=none and
// OTEL_SDK_DISABLED=true turn it off.
func tracingEnabled(env map[string]string) bool {
	if strings.EqualFold(env["OTEL_SDK_DISABLED"], "true") {
		return false
	}
	switch strings.ToLower(env["OTEL_TRACES_EXPORTER"]) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return env["OTEL_EXPORTER_OTLP_ENDPOINT"] != "" || env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] != ""
}

// tracingProtocol is the OTLP protocol the environment asks for; "" for the default.
func tracingProtocol(env map[string]string) string {
	if p := env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"]; p != "" {
		return p
	}
	return env["OTEL_EXPORTER_OTLP_PROTOCOL"]
}

// validateTracing checks the OTEL_* variables rls reads itself, when they ask for tracing.
func validateTracing(env map[string]string) error {
	if !tracingEnabled(env) {
		return nil
	}
	switch p := tracingProtocol(env); p {
	case "", "http/protobuf", "grpc":
		return nil
	default:
		return fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", p)
	}
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

// setupTracing starts OTLP trace export when the environment asks for it. The exporter reads
// the rest of its settings (endpoint, headers, TLS, sampler) from the standard OTEL_* variables;
// OTEL_EXPORTER_OTLP_PROTOCOL picks grpc or http/protobuf (the default). Export failures are
// logged through warn, the server's throttle of repeated lines.
func setupTracing(ctx context.Context, env []string, log *slog.Logger, warn *logthrottle.Throttle) (tracingSetup, error) {
	vars := envMap(env)
	if !tracingEnabled(vars) {
		return tracingSetup{}, nil
	}
	proto := tracingProtocol(vars)
	var client otlptrace.Client
	switch proto {
	case "", "http/protobuf":
		client = otlptracehttp.NewClient()
	case "grpc":
		client = otlptracegrpc.NewClient()
	default:
		return tracingSetup{}, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", proto)
	}
	raw, err := otlptrace.New(ctx, client)
	if err != nil {
		return tracingSetup{}, fmt.Errorf("tracing: %w", err)
	}
	attrs := resource.Default()
	if vars["OTEL_SERVICE_NAME"] == "" {
		attrs, _ = resource.Merge(attrs, resource.NewSchemaless(semconv.ServiceName("rls")))
	}
	// Export failures (a collector that cannot be reached fails every batch) are logged here,
	// throttled; the exporter hands the SDK no error to pass to otel's process-wide handler.
	exp := loggedExporter{SpanExporter: raw, report: exportErrors(warn)}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(attrs))
	log.Info("tracing on: exporting spans over OTLP", "protocol", cmpString(proto, "http/protobuf"))
	return tracingSetup{
		tracer:   tp.Tracer("github.com/rls-project/rls"),
		provider: tp,
		// Envoy's OpenTelemetry tracer sends W3C traceparent; rls continues that trace.
		propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}, nil
}

// loggedExporter is an exporter whose failures are reported to report instead of returned.
type loggedExporter struct {
	sdktrace.SpanExporter
	report func(error)
}

func (e loggedExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if err := e.SpanExporter.ExportSpans(ctx, spans); err != nil {
		e.report(err)
	}
	return nil
}

// exportErrors reports export errors through warn: the first logged at once, the ones that
// follow within its interval summed up at the end, instead of one line per failed batch.
func exportErrors(warn *logthrottle.Throttle) func(error) {
	return func(err error) { warn.Warn("tracing export failed", "tracing: export failed", "err", err) }
}

func cmpString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// serverOptions instruments the gRPC server with otelgrpc when tracing is on.
func (t tracingSetup) serverOptions() []grpc.ServerOption {
	if t.provider == nil {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.provider), otelgrpc.WithPropagators(t.propagator)))}
}

// shutdown flushes spans not yet exported.
func (t tracingSetup) shutdown() {
	if t.provider == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.provider.Shutdown(ctx)
}

// registerBackendMetrics exposes what a backend reports about itself, when it does.
func registerBackendMetrics(reg prometheus.Registerer, be backend.Backend) {
	if h, ok := be.(backend.Health); ok {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_backend_up",
			Help: "1 while the backend answers (all of it, or part: see rls_backend_degraded), 0 while none of it does (circuit open).",
		}, func() float64 {
			if h.Healthy() {
				return 1
			}
			return 0
		}))
	}
	if d, ok := be.(backend.Degradation); ok {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "rls_backend_degraded",
			Help: "1 while part of the backend is unavailable and the rest answers (a Redis Cluster master down: rls_redis_slots_unavailable), else 0.",
		}, func() float64 {
			if d.Degraded() != "" {
				return 1
			}
			return 0
		}))
	}
	if c, ok := be.(interface{ Collector() prometheus.Collector }); ok {
		reg.MustRegister(c.Collector())
	}
	if m, ok := be.(backend.MemoryStats); ok {
		reg.MustRegister(
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "rls_memory_keys",
				Help: "Keys the memory backend holds.",
			}, func() float64 { return float64(m.Len()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "rls_memory_bytes",
				Help: "Bytes the memory backend's keys take, as counted against --memory-max-bytes.",
			}, func() float64 { return float64(m.Bytes()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{
				Name: "rls_memory_evictions_total",
				Help: "Keys the memory backend forgot while they still held usage, to stay within its bounds: each may over-admit up to its burst. Above 0, raise --memory-max-bytes.",
			}, func() float64 { return float64(m.Evictions()) }),
		)
	}
	if s, ok := be.(backend.SlotStats); ok {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_slots_expired_total",
			Help: "Slots of concurrency limits found expired and dropped: each a release lost, or a request that ran past slot_lifetime. A lower bound: a key with no request after its slots expired is not counted.",
		}, func() float64 { return float64(s.SlotsExpired()) }))
	}
	if c, ok := be.(backend.CacheStats); ok {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "rls_local_cache_hits_total",
			Help: "Decisions answered from the local over-limit cache, without a backend round trip.",
		}, func() float64 { return float64(c.CacheHits()) }))
	}
}
