package integration

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	collectormetrics "go.opentelemetry.io/proto/otlp/collector/metrics/v1"
	metricspb "go.opentelemetry.io/proto/otlp/metrics/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an OTLP metrics receiver on the official service definitions: over gRPC
// (MetricsService/Export) or HTTP (POST /v1/metrics, protobuf). It keeps the last value of every
// counter data point it was sent, by metric name and attributes.
type otlpReceiver struct {
	collectormetrics.UnimplementedMetricsServiceServer
	mu      sync.Mutex
	sums    map[string]float64 // `name{k="v",...}` → value
	exports int
}

func (r *otlpReceiver) Export(_ context.Context, req *collectormetrics.ExportMetricsServiceRequest) (*collectormetrics.ExportMetricsServiceResponse, error) {
	r.record(req)
	return &collectormetrics.ExportMetricsServiceResponse{}, nil
}

func (r *otlpReceiver) record(req *collectormetrics.ExportMetricsServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exports++
	for _, rm := range req.GetResourceMetrics() {
		for _, sm := range rm.GetScopeMetrics() {
			for _, m := range sm.GetMetrics() {
				sum := m.GetSum()
				if sum == nil || !sum.GetIsMonotonic() || sum.GetAggregationTemporality() != metricspb.AggregationTemporality_AGGREGATION_TEMPORALITY_CUMULATIVE {
					continue
				}
				for _, dp := range sum.GetDataPoints() {
					var attrs []string
					for _, kv := range dp.GetAttributes() {
						attrs = append(attrs, fmt.Sprintf("%s=%q", kv.GetKey(), kv.GetValue().GetStringValue()))
					}
					sort.Strings(attrs)
					v := dp.GetAsDouble()
					if _, ok := dp.GetValue().(*metricspb.NumberDataPoint_AsInt); ok {
						v = float64(dp.GetAsInt())
					}
					r.sums[m.GetName()+"{"+strings.Join(attrs, ",")+"}"] = v
				}
			}
		}
	}
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	b, err := io.ReadAll(req.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var m collectormetrics.ExportMetricsServiceRequest
	if err := proto.Unmarshal(b, &m); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.record(&m)
	out, _ := proto.Marshal(&collectormetrics.ExportMetricsServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.Write(out)
}

// startOTLPReceiver serves a receiver over protocol (grpc or http/protobuf) on loopback and
// returns it with the OTEL_EXPORTER_OTLP_METRICS_ENDPOINT that reaches it.
func startOTLPReceiver(t *testing.T, protocol string) (*otlpReceiver, string) {
	t.Helper()
	r := &otlpReceiver{sums: map[string]float64{}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if protocol == "grpc" {
		s := grpc.NewServer()
		collectormetrics.RegisterMetricsServiceServer(s, r)
		go s.Serve(l)
		t.Cleanup(s.Stop)
		return r, "http://" + l.Addr().String()
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/metrics", r)
	s := &http.Server{Handler: mux}
	go s.Serve(l)
	t.Cleanup(func() { s.Close() })
	return r, "http://" + l.Addr().String() + "/v1/metrics"
}

// TestOTLPMetrics runs rls with OTEL_METRICS_EXPORTER=otlp against a real OTLP receiver, over
// gRPC and over HTTP: after a known load the receiver holds the instruments of /metrics with
// their values, rls's own and, with --ratelimit-metrics, envoyproxy/ratelimit's.
func TestOTLPMetrics(t *testing.T) {
	for _, protocol := range []string{"grpc", "http/protobuf"} {
		t.Run(strings.ReplaceAll(protocol, "/", "_"), func(t *testing.T) {
			recv, endpoint := startOTLPReceiver(t, protocol)
			p := startRLS(t, []string{"OTEL_METRICS_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=" + protocol,
				"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=" + endpoint, "OTEL_METRIC_EXPORT_INTERVAL=100"},
				"--config", writeRules(t, map[string]string{"shop.yaml": ratelimitMetricsRules}), "--ratelimit-metrics")
			ratelimitLoad(t, p.client(t))
			want := map[string]float64{
				`rls_decisions_total{domain="shop",outcome="over_limit",rule="api_key=k1"}`:                                                                            3,
				`rls_decisions_total{domain="shop",outcome="near_limit",rule="api_key=k1"}`:                                                                            3,
				`rls_decisions_total{domain="shop",outcome="ok",rule="api_key=k1"}`:                                                                                    7,
				`rls_decisions_total{domain="shop",outcome="shadow_mode",rule="bot"}`:                                                                                  1,
				`rls_hits_total{domain="shop",rule="path=checkout/method"}`:                                                                                            6,
				`ratelimit_service_rate_limit_total_hits{domain="shop",key1="api_key_k1"}`:                                                                             13,
				`ratelimit_service_rate_limit_over_limit{domain="shop",key1="path_checkout",key2="method"}`:                                                            1,
				`ratelimit_service_rate_limit_shadow_mode{domain="shop",key1="bot"}`:                                                                                   1,
				`grpc_server_handled_total{grpc_code="OK",grpc_method="ShouldRateLimit",grpc_service="envoy.service.ratelimit.v3.RateLimitService",grpc_type="unary"}`: 22,
			}
			deadline := time.Now().Add(15 * time.Second)
			for {
				recv.mu.Lock()
				var diff, have []string
				for k, v := range want {
					if got, ok := recv.sums[k]; !ok || got != v {
						diff = append(diff, fmt.Sprintf("%s = %v (received: %v), want %v", k, got, ok, v))
					}
				}
				for k, v := range recv.sums {
					if strings.Contains(k, "shop") || strings.Contains(k, "ShouldRateLimit") {
						have = append(have, fmt.Sprintf("%s %v", k, v))
					}
				}
				exports := recv.exports
				recv.mu.Unlock()
				if len(diff) == 0 {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("after %d exports:\n%s\nreceived:\n%s", exports, strings.Join(diff, "\n"), strings.Join(have, "\n"))
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
}
