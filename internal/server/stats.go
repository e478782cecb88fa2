package server

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promexporter "go.opentelemetry.io/contrib/bridges/prometheus"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetricgrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlpmetric/otlpmetrichttp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/service"
	"github.com/rls-project/rls/internal/statsd"
)

// StatsConfig is envoyproxy/ratelimit's counters: sent to statsd, served to Prometheus.
type StatsConfig struct {
	StatsdAddr     string        // --statsd-addr: host:port; "": no statsd
	FlushInterval  time.Duration // --statsd-flush-interval
	DogStatsD      bool          // --statsd-dogstatsd
	Tags           string        // --statsd-tags: name:value,...
	Mogrifiers     string        // --statsd-mogrifiers: JSON
	RatelimitNames bool          // --ratelimit-metrics: serve them on /metrics and --metrics-addr
}

// on says whether the counters are kept at all.
func (c StatsConfig) on() bool { return c.StatsdAddr != "" || c.RatelimitNames }

func (c StatsConfig) validate() error {
	if c.StatsdAddr == "" {
		return nil
	}
	if h, p, err := net.SplitHostPort(c.StatsdAddr); err != nil || p == "" || h == "" {
		return fmt.Errorf("--statsd-addr %q: want host:port", c.StatsdAddr)
	}
	if c.FlushInterval <= 0 {
		return fmt.Errorf("--statsd-flush-interval %v: must be > 0", c.FlushInterval)
	}
	if _, err := statsd.ParseTags(c.Tags); err != nil {
		return fmt.Errorf("--statsd-tags: %w", err)
	}
	if _, err := statsd.ParseMogrifiers(c.Mogrifiers); err != nil {
		return fmt.Errorf("--statsd-mogrifiers: %w", err)
	}
	return nil
}

// statsSetup is one server's envoyproxy/ratelimit counters and OTLP metric export; its zero value
// is all of it off.
type statsSetup struct {
	store    *statsd.Store
	sink     *statsd.Sink
	gatherer prometheus.Gatherer // what /metrics, --metrics-addr and OTLP serve
	meters   *sdkmetric.MeterProvider
	// flushTimeout bounds the last OTLP export at stop (0: 5s, as tracing's).
	flushTimeout time.Duration
}

// buildStats keeps envoyproxy/ratelimit's counters when a statsd address or its Prometheus names
// ask for them, starts sending them to statsd, and starts OTLP metric export when the
// environment asks for it.
func (s *Server) buildStats(ctx context.Context) error {
	c := s.cfg.Stats
	s.statsd.gatherer = s.reg
	if c.on() {
		s.statsd.store = statsd.NewStore(s.cfg.DetailedMetricValues, 0)
	}
	if c.RatelimitNames {
		own := prometheus.NewRegistry()
		own.MustRegister(statsd.NewCollector(s.statsd.store, s.reg))
		s.statsd.gatherer = prometheus.Gatherers{s.reg, own}
	}
	if c.StatsdAddr != "" {
		tags, _ := statsd.ParseTags(c.Tags) // checked by Validate
		mogs, _ := statsd.ParseMogrifiers(c.Mogrifiers)
		sink, err := statsd.NewSink(statsd.Config{Addr: c.StatsdAddr, Interval: c.FlushInterval, DogStatsD: c.DogStatsD,
			Tags: tags, Mogrifiers: mogs}, s.statsd.store, s.reg, s.log)
		if err != nil {
			return fmt.Errorf("--statsd-addr: %w", err)
		}
		s.statsd.sink = sink
		sink.Start()
		kind := "statsd"
		if c.DogStatsD {
			kind = "dogstatsd"
		}
		s.log.Info("sending envoyproxy/ratelimit's counters over UDP", "protocol", kind, "addr", c.StatsdAddr, "interval", c.FlushInterval)
	}
	var err error
	s.statsd.meters, err = setupMetricExport(ctx, s.cfg.Env, s.statsd.gatherer, s.log, s.warn)
	return err
}

// serviceStats is what the service tells each decision; nil when the counters are off.
func (st *statsSetup) serviceStats() service.Stats {
	if st.store == nil {
		return nil
	}
	return st.store
}

// stop sends what the counters have left and flushes the last metrics over OTLP.
func (st *statsSetup) stop() {
	if st.sink != nil {
		st.sink.Stop()
	}
	if st.meters != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cmp.Or(st.flushTimeout, 5*time.Second))
		defer cancel()
		_ = st.meters.Shutdown(ctx)
	}
}

// metricsExportEnabled reports whether the standard OTEL_* variables ask for metric export:
// OTEL_METRICS_EXPORTER is otlp, or OTEL_EXPORTER_OTLP_METRICS_ENDPOINT is set. Unlike traces,
// OTEL_EXPORTER_OTLP_ENDPOINT alone does not: a collector that takes rls's spans is not sent its
// metrics unasked. OTEL_METRICS_EXPORTER=none and OTEL_SDK_DISABLED=true turn it off.
func metricsExportEnabled(env map[string]string) bool {
	if strings.EqualFold(env["OTEL_SDK_DISABLED"], "true") {
		return false
	}
	switch strings.ToLower(env["OTEL_METRICS_EXPORTER"]) {
	case "none":
		return false
	case "otlp":
		return true
	}
	return env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] != ""
}

// metricsProtocol is the OTLP protocol the environment asks for metrics; "" for the default.
func metricsProtocol(env map[string]string) string {
	if p := env["OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"]; p != "" {
		return p
	}
	return env["OTEL_EXPORTER_OTLP_PROTOCOL"]
}

// validateMetricExport checks the OTEL_* variables rls reads itself, when they ask for metrics.
func validateMetricExport(env map[string]string) error {
	if !metricsExportEnabled(env) {
		return nil
	}
	switch p := metricsProtocol(env); p {
	case "", "http/protobuf", "grpc":
	default:
		return fmt.Errorf("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL (or OTEL_EXPORTER_OTLP_PROTOCOL) %q: want grpc or http/protobuf", p)
	}
	if v := env["OTEL_METRICS_EXPORTER"]; v != "" && !strings.EqualFold(v, "otlp") && !strings.EqualFold(v, "none") {
		return fmt.Errorf("OTEL_METRICS_EXPORTER %q: want otlp or none", v)
	}
	return nil
}

// setupMetricExport starts exporting every metric g gathers (those of /metrics) over OTLP when
// the environment asks for it, through the OpenTelemetry SDK's periodic reader and its bridge
// from Prometheus: endpoint, headers, TLS, timeout and interval (OTEL_METRIC_EXPORT_INTERVAL,
// default 60s) come from the standard OTEL_* variables. Export runs on the reader's goroutine;
// its failures are logged through warn.
func setupMetricExport(ctx context.Context, env []string, g prometheus.Gatherer, log *slog.Logger, warn *logthrottle.Throttle) (*sdkmetric.MeterProvider, error) {
	vars := envMap(env)
	if !metricsExportEnabled(vars) {
		return nil, nil
	}
	proto := metricsProtocol(vars)
	var exp sdkmetric.Exporter
	var err error
	switch proto {
	case "", "http/protobuf":
		exp, err = otlpmetrichttp.New(ctx)
	case "grpc":
		exp, err = otlpmetricgrpc.New(ctx)
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL %q: want grpc or http/protobuf", proto)
	}
	if err != nil {
		return nil, fmt.Errorf("metrics export: %w", err)
	}
	attrs := resource.Default()
	if vars["OTEL_SERVICE_NAME"] == "" {
		attrs, _ = resource.Merge(attrs, resource.NewSchemaless(semconv.ServiceName("rls")))
	}
	reader := sdkmetric.NewPeriodicReader(loggedMetricExporter{Exporter: exp, warn: warn},
		sdkmetric.WithProducer(promexporter.NewMetricProducer(promexporter.WithGatherer(g))))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader), sdkmetric.WithResource(attrs))
	log.Info("metrics export on: sending the metrics of /metrics over OTLP", "protocol", cmpString(proto, "http/protobuf"))
	return mp, nil
}

// loggedMetricExporter reports export failures through warn, throttled, instead of to otel's
// process-wide error handler.
type loggedMetricExporter struct {
	sdkmetric.Exporter
	warn *logthrottle.Throttle
}

func (e loggedMetricExporter) Export(ctx context.Context, rm *metricdata.ResourceMetrics) error {
	if err := e.Exporter.Export(ctx, rm); err != nil {
		e.warn.Warn("metrics export failed", "metrics export: failed", "err", err)
	}
	return nil
}
