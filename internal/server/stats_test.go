package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/rlstest"
	"github.com/rls-project/rls/internal/service"
	"github.com/rls-project/rls/internal/statsd"
)

// blackHoles are endpoints that take what is sent and never answer: a UDP socket never read
// (its buffer fills, then datagrams are dropped) and a TCP listener whose connections are
// accepted and never read (an OTLP exporter's handshake or request waits for its timeout).
type blackHoles struct {
	udp   net.PacketConn
	tcp   net.Listener
	mu    sync.Mutex
	conns []net.Conn
	done  chan struct{}
}

func newBlackHoles(tb testing.TB) *blackHoles {
	tb.Helper()
	u, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	h := &blackHoles{udp: u, tcp: l, done: make(chan struct{})}
	go func() {
		defer close(h.done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h.mu.Lock()
			h.conns = append(h.conns, c)
			h.mu.Unlock()
		}
	}()
	return h
}

func (h *blackHoles) close() {
	h.udp.Close()
	h.tcp.Close()
	<-h.done
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.conns {
		c.Close()
	}
}

// downUDP is a loopback UDP address nothing listens at: a statsd server that is down.
func downUDP(tb testing.TB) string {
	tb.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().String()
}

// sinkVariant is one way of sending envoyproxy/ratelimit's counters and OTLP metrics.
type sinkVariant struct {
	name      string
	statsd    func(h *blackHoles, tb testing.TB) string // the statsd address; nil: no statsd
	dog       bool
	otlp      string // "grpc" or "http/protobuf" to the black-holed TCP listener; "": none
	promNames bool
}

var sinkVariants = []sinkVariant{
	{name: "off"},
	{name: "statsd-down", statsd: func(_ *blackHoles, tb testing.TB) string { return downUDP(tb) }},
	{name: "statsd-blackholed", statsd: func(h *blackHoles, _ testing.TB) string { return h.udp.LocalAddr().String() }},
	{name: "dogstatsd-blackholed", dog: true, statsd: func(h *blackHoles, _ testing.TB) string { return h.udp.LocalAddr().String() }},
	{name: "otlp-grpc-blackholed", otlp: "grpc"},
	{name: "otlp-http-blackholed", otlp: "http/protobuf"},
	{name: "all-blackholed", dog: true, otlp: "grpc", promNames: true,
		statsd: func(h *blackHoles, _ testing.TB) string { return h.udp.LocalAddr().String() }},
}

// sinkService builds the decision service with v's sinks, flushing and exporting every interval
// (an export given up after 50 ms), and returns it with a function that stops the sinks.
func sinkService(tb testing.TB, v sinkVariant, h *blackHoles, interval time.Duration) (*service.Service, func()) {
	tb.Helper()
	rs, err := descriptors.Parse(map[string][]byte{"b.yaml": []byte(`
domain: bench
descriptors:
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 1000000000, burst: 1000000000}
  - key: user
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 1000000000, burst: 1000000000}
`)})
	if err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	warn := logthrottle.New(log, time.Minute)
	reg := prometheus.NewRegistry()
	metrics, err := service.NewMetrics(reg, 0.8)
	if err != nil {
		tb.Fatal(err)
	}
	st := statsSetup{gatherer: reg, flushTimeout: 100 * time.Millisecond}
	if v.statsd != nil || v.promNames {
		st.store = statsd.NewStore(0, 0)
	}
	if v.promNames {
		own := prometheus.NewRegistry()
		own.MustRegister(statsd.NewCollector(st.store, reg))
		st.gatherer = prometheus.Gatherers{reg, own}
	}
	if v.statsd != nil {
		st.sink, err = statsd.NewSink(statsd.Config{Addr: v.statsd(h, tb), Interval: interval, DogStatsD: v.dog,
			Tags: []statsd.Tag{{Name: "env", Value: "bench"}}}, st.store, reg, log)
		if err != nil {
			tb.Fatal(err)
		}
		st.sink.Start()
	}
	if v.otlp != "" {
		endpoint := "http://" + h.tcp.Addr().String()
		if v.otlp != "grpc" {
			endpoint += "/v1/metrics"
		}
		env := []string{"OTEL_METRICS_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=" + v.otlp,
			"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT=" + endpoint, "OTEL_METRIC_EXPORT_INTERVAL=" + strconv.FormatInt(interval.Milliseconds(), 10), "OTEL_METRIC_EXPORT_TIMEOUT=50"}
		for _, kv := range env {
			k, val, _ := strings.Cut(kv, "=")
			tb.Setenv(k, val) // the SDK reads the process environment
		}
		if st.meters, err = setupMetricExport(context.Background(), env, st.gatherer, log, warn); err != nil {
			tb.Fatal(err)
		}
	}
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	svc, err := service.New(rs, service.Options{Backend: m, Metrics: metrics, Stats: st.serviceStats(), Logger: log})
	if err != nil {
		tb.Fatal(err)
	}
	return svc, func() { st.stop(); warn.Close(); m.Close() }
}

var sinkRequest = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
	{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k1"}}},
	{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "alice"}}},
}}

// BenchmarkDecisionWithSinks measures one decision of a two-descriptor request (one of them a
// detailed_metric rule) inside the service, with rls's metrics on, in one run: without
// envoyproxy/ratelimit's counters and OTLP export, and with them sent every 100 ms to a statsd
// server that is down, to black holes (statsd, DogStatsD, OTLP over gRPC and HTTP), and all at
// once. The sinks run on their own goroutines: what a decision pays is the counters' map read
// and atomic adds. cpu-ns/op is the process's CPU time per decision, the sinks' goroutines
// included: on a machine shared with other work it varies less than ns/op.
func BenchmarkDecisionWithSinks(b *testing.B) {
	h := newBlackHoles(b)
	defer h.close()
	for _, v := range sinkVariants {
		b.Run(v.name, func(b *testing.B) {
			svc, stop := sinkService(b, v, h, 100*time.Millisecond)
			defer stop()
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			cpu := rlstest.ProcessCPU(b)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := svc.ShouldRateLimit(ctx, sinkRequest); err != nil {
						b.Fatal(err)
					}
				}
			})
			rlstest.ReportCPU(b, cpu)
		})
	}
}

// TestSinksDownLeakNothing decides under every variant of sinkVariants for a while, the sinks
// flushing and exporting every 10 ms to endpoints that are down or never answer: the heap does
// not grow from one half of the run to the other, and stopping the sinks leaves no goroutine.
func TestSinksDownLeakNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	h := newBlackHoles(t)
	defer h.close()
	for _, v := range sinkVariants[1:] {
		t.Run(v.name, func(t *testing.T) {
			svc, stop := sinkService(t, v, h, 10*time.Millisecond)
			ctx := context.Background()
			heap := func() uint64 {
				runtime.GC()
				var ms runtime.MemStats
				runtime.ReadMemStats(&ms)
				return ms.HeapAlloc
			}
			decide := func(n int) {
				for range n {
					if _, err := svc.ShouldRateLimit(ctx, sinkRequest); err != nil {
						t.Fatal(err)
					}
				}
				time.Sleep(150 * time.Millisecond) // flushes and exports, failing
			}
			decide(2000)
			mid := heap()
			decide(2000)
			decide(2000)
			end := heap()
			if end > mid+2<<20 {
				t.Errorf("heap grew from %d to %d bytes while the sinks failed", mid, end)
			}
			stop()
		})
	}
}
