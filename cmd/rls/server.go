package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/rlqs"
	"github.com/rls-project/rls/internal/service"
	"github.com/rls-project/rls/internal/xds"
)

// serve runs one server until ctx ends (SIGTERM, SIGINT) or a listener fails, then shuts it
// down: build, run, shut down.
func serve(ctx context.Context, c serveConfig, stderr io.Writer) error {
	s, err := newServer(ctx, c, stderr)
	if err != nil {
		return err
	}
	return s.shutdown(s.run(ctx))
}

// server is one rls instance. newServer builds it whole (rules loaded, backend connected,
// listeners bound) without answering anything yet; run serves; shutdown stops it in the order
// load balancers need. Everything it uses is its own: logger, metrics registry, tracer
// provider. The process-wide state it touches is the SIGHUP handler and go-redis's logger.
type server struct {
	cfg     serveConfig
	log     *slog.Logger
	tracing tracingSetup
	rules   *descriptors.RuleSet // as loaded at start
	failure service.FailureMode
	be      backend.Backend
	local   backend.Backend
	svc     *service.Service
	rlqs    *rlqs.Server // nil with --rlqs=false
	warn    *logthrottle.Throttle

	grpc     *grpc.Server
	ready    *readiness
	draining chan struct{} // closed when the gRPC drain begins: ends health watches
	http     *http.Server
	debug    *http.Server // nil without --debug-addr
	metrics  *http.Server // nil without --metrics-addr
	xds      *xds.Client  // nil without --xds-server

	grpcL, httpL, debugL, metricsL net.Listener

	errc       chan error         // one per listener: why its Serve returned
	stopReload context.CancelFunc // also ends the xDS subscription
	stopHealth func()
}

// newServer builds a server from c, logging to stderr. On error, what it had opened is closed.
func newServer(ctx context.Context, c serveConfig, stderr io.Writer) (_ *server, err error) {
	s := &server{cfg: c, stopReload: func() {}, stopHealth: func() {}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if s.log, err = newLogger(c.logLevel, c.logFormat, stderr); err != nil {
		return nil, err
	}
	c.logRatelimitEnv(s.log)
	s.warn = logthrottle.New(s.log, c.logRepeat)
	headers, err := service.ParseHeaderMode(c.responseHeaders)
	if err != nil {
		return nil, fmt.Errorf("--response-headers: %w", err)
	}
	if s.failure, err = service.ParseFailureMode(c.failureMode); err != nil {
		return nil, fmt.Errorf("--failure-mode: %w", err)
	}
	if c.maxStreams == 0 {
		return nil, errors.New("--grpc-max-concurrent-streams 0: want at least 1")
	}
	if c.streamWorkers > maxStreamWorkers {
		return nil, fmt.Errorf("--grpc-stream-workers %d: want at most %d (calls beyond the workers run on goroutines of their own)", c.streamWorkers, maxStreamWorkers)
	}
	if !(c.nearLimitRatio >= 0 && c.nearLimitRatio <= 1) { // NaN too
		return nil, fmt.Errorf("--near-limit-ratio %v: want a value in [0, 1]", c.nearLimitRatio)
	}
	if err := c.http.validate(); err != nil {
		return nil, err
	}
	if err := c.grpcConns.validate(); err != nil {
		return nil, err
	}
	if c.debug && c.debugAddr == "" {
		return nil, errors.New("--debug serves pprof on the debug listener: it needs --debug-addr")
	}
	if s.rules, err = c.initialRules(); err != nil {
		return nil, fmt.Errorf("loading rules%s: %w", c.fromRatelimitEnv("config"), err)
	}
	if s.tracing, err = setupTracing(ctx, c.env, s.log); err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := service.NewMetrics(reg, c.nearLimitRatio)
	if err != nil {
		return nil, err
	}
	if s.be, err = newBackend(ctx, c, s.log); err != nil {
		return nil, err
	}
	registerBackendMetrics(reg, s.be)
	// The local fallback exists whatever the default, since any rule may ask for it.
	if s.local, err = backend.NewMemory(c.memoryOptions()); err != nil {
		return nil, err
	}
	overrides, err := c.bounds.overridePolicy()
	if err != nil {
		return nil, err
	}
	callers, err := newCallerPolicy(c, reg, s.log)
	if err != nil {
		return nil, err
	}
	s.svc, err = service.New(s.rules, service.Options{
		Backend: s.be, Logger: s.log, Headers: headers, FailureMode: s.failure, Local: s.local,
		Metrics: metrics, Tracer: s.tracing.tracer, DetailedMetricValues: c.detailedValues,
		LegacyHeaderNames: c.headerNames, ShadowMode: c.shadowMode, QuotaMode: c.quotaMode,
		MaxInflightBytes: c.bounds.maxInflightBytes, MaxJSONBytes: int64(c.bounds.maxRequestBytes),
		Overrides: overrides,
		Authorize: callers.authorizer(),
	})
	if err != nil {
		return nil, err
	}
	// The watcher outlives SIGTERM (which ends ctx) until close: a SIGHUP during the drain must
	// still reload, not kill the process with the signal's default action.
	var rctx context.Context
	rctx, s.stopReload = context.WithCancel(context.WithoutCancel(ctx))
	path, apply := c.config, s.applyRules
	if c.fromXDS() {
		if s.xds, err = newXDS(c, s.applyXDS, s); err != nil {
			return nil, err
		}
		// SIGHUP must not kill the process (its default action); there is no file to read.
		path, apply = "", func() error {
			s.log.Info("SIGHUP: the rules come over xDS; nothing to reload", "rules", rulesSource(c))
			return nil
		}
	}
	if err := startReload(rctx, c.reload, path, apply, s.log); err != nil {
		return nil, err
	}
	if err := callers.watch(rctx, c.reload); err != nil {
		return nil, err
	}

	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .02, .05, .1, .5})))
	reg.MustRegister(grpcMetrics)
	calls, err := newCallLimit(c.bounds.maxCalls, reg)
	if err != nil {
		return nil, err
	}
	s.grpc, err = newGRPCServer(c, s.log, []grpc.UnaryServerInterceptor{grpcMetrics.UnaryServerInterceptor()}, append(s.tracing.serverOptions(), calls...)...)
	if err != nil {
		return nil, err
	}
	service.RegisterServer(s.grpc, s.svc)
	if s.rlqs, err = startRLQS(s.grpc, c, s.svc, reg, s.log); err != nil {
		return nil, err
	}
	hs := health.NewServer()
	s.draining = make(chan struct{})
	healthpb.RegisterHealthServer(s.grpc, drainingHealth{Server: hs, draining: s.draining})
	if c.reflection {
		reflection.Register(s.grpc)
	}
	grpcMetrics.InitializeMetrics(s.grpc)
	s.ready = newReadiness(hs, s.failure, s.log)
	// Without rules yet every answer is UNAVAILABLE: not ready. --ready-with-rules asks for
	// rules even when rls answers without them.
	s.ready.needRules(s.rules == nil || (c.readyWithRules && c.fromXDS() && c.startWithoutRules))
	s.stopHealth = sync.OnceFunc(s.ready.follow(s.be))

	s.http = c.http.server(c.usage.mount(mainMux(s.svc, s.ready, reg), s.svc, s.log, s.warn))
	if c.debugAddr != "" {
		s.debug = c.http.debugServer(debugMux(s.svc, s.rlqs, c.debug))
	}
	if c.metricsAddr != "" {
		if !strings.HasPrefix(c.metricsPath, "/") {
			return nil, fmt.Errorf("--metrics-path %q: want a path starting with /", c.metricsPath)
		}
		mux := http.NewServeMux()
		mux.Handle("GET "+c.metricsPath, promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
		s.metrics = c.http.server(mux)
	}

	var lc net.ListenConfig
	if s.grpcL, err = lc.Listen(ctx, "tcp", c.grpcAddr); err != nil {
		return nil, fmt.Errorf("--grpc-addr: %w", err)
	}
	s.grpcL = c.grpcConns.limit(s.grpcL, reg, s.warn)
	if s.httpL, err = lc.Listen(ctx, "tcp", c.httpAddr); err != nil {
		return nil, fmt.Errorf("--http-addr: %w", err)
	}
	if s.debug != nil {
		if s.debugL, err = lc.Listen(ctx, "tcp", c.debugAddr); err != nil {
			return nil, fmt.Errorf("--debug-addr: %w", err)
		}
	}
	if s.metrics != nil {
		if s.metricsL, err = lc.Listen(ctx, "tcp", c.metricsAddr); err != nil {
			return nil, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	if s.xds != nil {
		go s.xds.Run(rctx)
	}
	return s, nil
}

// applyRules loads the rule files again and swaps them in, whole or not at all.
func (s *server) applyRules() error {
	return s.swapRules(loadRules(s.cfg.config, s.cfg.rulesOptions()))
}

// swapRules puts rs in force, or with err keeps the rules in force and returns err: the one
// end of every reload, from files or xDS.
func (s *server) swapRules(rs *descriptors.RuleSet, err error) error {
	if err != nil {
		s.svc.RulesRejected()
		s.log.Error("rules rejected; the running rules stay in force", "rules", rulesSource(s.cfg), "err", err)
		return err
	}
	s.svc.SetRules(rs)
	// A cached denial was computed under the old limits; state itself is clamped per key.
	if p, ok := s.be.(backend.CachePurger); ok {
		p.PurgeCache()
	}
	if s.ready != nil {
		s.ready.rulesLoaded()
	}
	gen, _ := s.svc.Generation()
	s.log.Info("rules loaded", "rules", rulesSource(s.cfg), "generation", gen, "domains", len(rs.Domains), "files", len(rs.Files))
	return nil
}

// run serves on every listener until ctx ends, which returns nil, or until one fails, which
// returns its error. Readiness turns SERVING once every listener is serving.
func (s *server) run(ctx context.Context) error {
	s.errc = make(chan error, 4)
	go func() { s.errc <- s.grpc.Serve(s.grpcL) }()
	go func() { s.errc <- s.http.Serve(s.httpL) }()
	if s.debug != nil {
		go func() { s.errc <- s.debug.Serve(s.debugL) }()
	}
	if s.metrics != nil {
		go func() { s.errc <- s.metrics.Serve(s.metricsL) }()
	}
	s.ready.start()
	domains := 0 // none yet while rules are awaited from xDS
	if rs := s.svc.Rules(); rs != nil {
		domains = len(rs.Domains)
	}
	attrs := []any{"grpc", s.grpcL.Addr().String(), "http", s.httpL.Addr().String()}
	if s.debugL != nil {
		attrs = append(attrs, "debug_http", s.debugL.Addr().String())
	}
	if s.metricsL != nil {
		attrs = append(attrs, "metrics_http", s.metricsL.Addr().String())
	}
	s.log.Info("rls serving", append(attrs, "backend", s.cfg.backend, "failure_mode", s.failure.String(),
		"rules", rulesSource(s.cfg), "domains", domains,
		"tls", s.cfg.tlsCert != "", "tracing", s.tracing.tracer != nil, "pprof", s.cfg.debug)...)
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.errc:
		return fmt.Errorf("serving: %w", err)
	}
}

// shutdown stops a server that run returned from, in order: health says NOT_SERVING at once (so
// load balancers and Envoy's health checks stop sending), rls goes on answering for
// --shutdown-delay (skipped when a listener failed), then drains gRPC (GOAWAY; in-flight calls get
// --shutdown-timeout), then closes the rest. It returns serveErr.
func (s *server) shutdown(serveErr error) error {
	s.beginShutdown()
	s.log.Info("shutting down", "delay", s.cfg.shutdownDelay, "timeout", s.cfg.shutdownTimeout)
	if serveErr == nil && s.cfg.shutdownDelay > 0 {
		time.Sleep(s.cfg.shutdownDelay)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.shutdownTimeout)
	defer cancel()
	s.drain(ctx)
	s.close()
	if serveErr != nil {
		return serveErr
	}
	s.log.Info("stopped")
	return nil
}

// beginShutdown reports NOT_SERVING from now on, over gRPC health and /readyz.
func (s *server) beginShutdown() {
	s.stopHealth()
	s.ready.stop()
}

// drain stops the gRPC server gracefully: a GOAWAY on every connection, health watches ended,
// in-flight calls let finish until ctx ends, then closed.
func (s *server) drain(ctx context.Context) {
	close(s.draining)
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.log.Warn("in-flight calls did not finish in time; closing", "timeout", s.cfg.shutdownTimeout)
		s.grpc.Stop()
		<-stopped
	}
	// /readyz stays up (saying 503) through the drain; HTTP requests in flight get what is
	// left of the timeout.
	if s.http != nil {
		_ = s.http.Shutdown(ctx)
	}
	if s.debug != nil {
		_ = s.debug.Shutdown(ctx)
	}
	if s.metrics != nil {
		_ = s.metrics.Shutdown(ctx)
	}
}

// backendCloseTimeout is how long closing waits for the backend: a Redis that stopped answering
// holds the pipeline in flight until the socket's read timeout, which must not keep the process
// past its shutdown timeout by more than this.
const backendCloseTimeout = time.Second

// closeWithin calls closeFn and waits for it at most d; past d it logs and returns, leaving it
// to finish (or to end with the process).
func closeWithin(log *slog.Logger, what string, d time.Duration, closeFn func() error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = closeFn()
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		log.Warn(what+" did not close in time; going on without it", "waited", d)
	}
}

// close releases everything newServer opened; it is safe on a server built halfway.
func (s *server) close() {
	s.stopReload()
	s.stopHealth()
	for _, l := range []net.Listener{s.grpcL, s.httpL, s.debugL, s.metricsL} {
		if l != nil {
			l.Close() // already closed when served; open when newServer failed after binding
		}
	}
	if s.be != nil {
		closeWithin(s.log, "backend", backendCloseTimeout, s.be.Close)
	}
	if s.local != nil {
		s.local.Close()
	}
	if s.rlqs != nil {
		s.rlqs.Close()
	}
	s.tracing.shutdown()
	if s.warn != nil {
		s.warn.Close() // what was suppressed since the last line
	}
}
