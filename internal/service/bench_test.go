package service

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

// BenchmarkShouldRateLimit measures one decision of a two-descriptor request end to end inside
// the service (no gRPC), bare, with metrics, with metrics and tracing, and bare with the new-key
// gate (--max-new-keys-per-caller; the request's keys are seen after the first, as a steady
// caller's are).
func BenchmarkShouldRateLimit(b *testing.B) {
	rs, err := descriptors.Parse(map[string][]byte{"b.yaml": []byte(`
domain: bench
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 1000000000, burst: 1000000000}
  - key: remote_address
    rate_limit: {unit: day, requests_per_unit: 1000000000, burst: 1000000000}
`)})
	if err != nil {
		b.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k1"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}},
	}}
	variants := []struct {
		name    string
		metrics bool
		tracing bool
		newKeys bool
	}{{"bare", false, false, false}, {"metrics", true, false, false}, {"metrics+tracing", true, true, false}, {"bare+newkeys", false, false, true}}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			m, _ := backend.NewMemory(backend.MemoryOptions{})
			opts := Options{Backend: m}
			if v.metrics {
				opts.Metrics, err = NewMetrics(prometheus.NewRegistry(), 0.8)
				if err != nil {
					b.Fatal(err)
				}
			}
			if v.tracing {
				// Spans are recorded and handed to an in-memory exporter batcher, as with OTLP.
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter(), sdktrace.WithBatchTimeout(time.Hour)))
				defer tp.Shutdown(context.Background())
				opts.Tracer = tp.Tracer("bench")
			}
			if v.newKeys {
				opts.MaxNewKeysPerCaller = 200
			}
			svc, err := New(rs, opts)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
