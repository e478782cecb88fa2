package server

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"

	grpcprom "github.com/grpc-ecosystem/go-grpc-middleware/providers/prometheus"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/reflection"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/service"
	"github.com/rls-project/rls/internal/top"
)

// Serve runs one server built from c, logging to stderr, until ctx ends (SIGTERM, SIGINT) or a
// listener fails, then shuts it down: New, Run, Shutdown. It sets the process's Go memory limit
// from c's bounds first, unless GOMEMLIMIT is set (SetMemoryLimit).
func Serve(ctx context.Context, c Config, stderr io.Writer) error {
	SetMemoryLimit(c)
	s, err := New(ctx, c, stderr)
	if err != nil {
		return err
	}
	return s.Shutdown(s.Run(ctx))
}

// New builds a server from c, logging to stderr, in the steps below, each named for what it
// builds. c must pass Validate (New returns its error otherwise). On error, what New had
// opened is closed.
func New(ctx context.Context, c Config, stderr io.Writer) (_ *Server, err error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: c, stopReload: func() {}, stopHealth: func() {}}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if err := s.startLogging(stderr); err != nil {
		return nil, err
	}
	s.logMemoryLimit()
	// The watchers start once everything a reload touches (the service, readiness) is built: a
	// reload runs on the watcher's goroutine, at once for a SIGHUP that came while rls started.
	for _, step := range []func(context.Context) error{
		s.loadRules, s.startTracing, s.connectBackends, s.buildStats, s.buildService, s.buildGRPC, s.buildHTTP, s.watchRules, s.listen,
	} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	if s.xds != nil {
		go s.xds.Run(s.rctx)
	}
	return s, nil
}

// startLogging builds the logger and the throttle of repeated warnings, and logs what
// envoyproxy/ratelimit's environment changed.
func (s *Server) startLogging(stderr io.Writer) (err error) {
	if s.log, err = newLogger(s.cfg.Log, stderr); err != nil {
		return err
	}
	s.cfg.RatelimitEnv.Log(s.log)
	s.warn = logthrottle.New(s.log, s.cfg.Log.RepeatInterval)
	return nil
}

// loadRules loads the rules the server starts with (none yet with --xds-server).
func (s *Server) loadRules(context.Context) (err error) {
	s.earlySIGHUPBeforeLoad()
	if s.rules, err = s.cfg.initialRules(); err != nil {
		return fmt.Errorf("loading rules%s: %w", s.cfg.fromRatelimitEnv("config"), err)
	}
	return nil
}

// startTracing starts OTLP trace export when the environment asks for it.
func (s *Server) startTracing(ctx context.Context) (err error) {
	s.tracing, err = setupTracing(ctx, s.cfg.Env, s.log, s.warn)
	return err
}

// connectBackends builds the metrics registry and connects the backend and the local fallback.
func (s *Server) connectBackends(ctx context.Context) (err error) {
	s.reg = prometheus.NewRegistry()
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	registerBuildInfo(s.reg)
	if s.be, err = newBackend(ctx, s.cfg, s.log); err != nil {
		return err
	}
	registerBackendMetrics(s.reg, s.be)
	if s.regions, err = startRegions(s.cfg, s.be, s.log); err != nil {
		return err
	}
	if s.regions != nil {
		prometheus.WrapRegistererWith(prometheus.Labels{"region": s.cfg.Regions.Region}, s.reg).MustRegister(s.regions.Collector())
	}
	// The local fallback exists whatever the default, since any rule may ask for it.
	s.local, err = backend.NewMemory(s.cfg.memoryOptions())
	return err
}

// buildService builds the decision service, with the caller policy.
func (s *Server) buildService(context.Context) (err error) {
	c := s.cfg
	metrics, err := service.NewMetrics(s.reg, c.NearLimitRatio)
	if err != nil {
		return err
	}
	headers, err := service.ParseHeaderMode(c.ResponseHeaders)
	if err != nil {
		return fmt.Errorf("--response-headers: %w", err)
	}
	if s.failure, err = service.ParseFailureMode(c.FailureMode); err != nil {
		return fmt.Errorf("--failure-mode: %w", err)
	}
	overrides, err := c.Bounds.overridePolicy()
	if err != nil {
		return err
	}
	if s.callers, err = newCallerPolicy(c, s.reg, s.log); err != nil {
		return err
	}
	if err := s.openDecisionLog(); err != nil {
		return err
	}
	if c.Top.Keys > 0 && c.Debug.Addr != "" { // only the debug listener shows them
		s.top = top.New(top.Config{Keys: c.Top.Keys, MaxBytes: c.Top.MaxBytes})
	}
	s.svc, err = service.New(s.rules, service.Options{
		Backend: s.be, Logger: s.log, Headers: headers, FailureMode: s.failure, Local: s.local, Global: s.globalExplainer(),
		Metrics: metrics, Tracer: s.tracing.tracer, DetailedMetricValues: c.DetailedMetricValues,
		LegacyHeaderNames: c.HeaderNames, ShadowMode: c.ShadowMode, QuotaMode: c.QuotaMode,
		MaxInflightBytes: c.Bounds.MaxInflightBytes, MaxJSONBytes: int64(c.Bounds.MaxRequestBytes),
		Overrides:           overrides,
		Authorize:           s.callers.authorizer(),
		MaxNewKeysPerCaller: c.Bounds.MaxNewKeysPerCaller, Warnings: s.warn,
		Stats: s.statsd.serviceStats(), DecisionLog: s.decisions,
		Top: s.top,
	})
	return err
}

// watchRules reloads the rule files and the caller policy when they change and on SIGHUP, and
// prepares the xDS subscription with --xds-server.
func (s *Server) watchRules(ctx context.Context) (err error) {
	c := s.cfg
	// The watcher outlives SIGTERM (which ends ctx) until close: a SIGHUP during the drain must
	// still reload, not kill the process with the signal's default action.
	s.rctx, s.stopReload = context.WithCancel(context.WithoutCancel(ctx))
	path, apply := c.Rules.Path, s.applyRules
	if c.fromXDS() {
		if s.xds, err = newXDS(c, s.applyXDS, s); err != nil {
			return err
		}
		// SIGHUP must not kill the process (its default action); there is no file to read.
		path, apply = "", func() error {
			s.log.Info("SIGHUP: the rules come over xDS; nothing to reload", "rules", rulesSource(c))
			return nil
		}
	}
	rulesHUP, err := startReload(s.rctx, c.Reload, path, apply, s.log)
	if err != nil {
		return err
	}
	policyHUP, err := s.callers.watch(s.rctx, c.Reload)
	if err != nil {
		return err
	}
	s.earlySIGHUPAfterLoad(rulesHUP, policyHUP)
	return nil
}

// buildGRPC builds the gRPC server with every service it serves, and readiness.
func (s *Server) buildGRPC(context.Context) (err error) {
	c := s.cfg
	grpcMetrics := grpcprom.NewServerMetrics(grpcprom.WithServerHandlingTimeHistogram(
		grpcprom.WithHistogramBuckets([]float64{.0001, .00025, .0005, .001, .0025, .005, .01, .02, .05, .1, .5})))
	s.reg.MustRegister(grpcMetrics)
	gate, err := newCallGate(c.GRPC.MessageTimeout, c.Bounds.MaxCalls, s.reg, s.warn)
	if err != nil {
		return err
	}
	// The gate's interceptor first: it marks the call's message arrived.
	s.grpc, err = newGRPCServer(c, s.log, []grpc.UnaryServerInterceptor{gate.interceptor, grpcMetrics.UnaryServerInterceptor()},
		append(s.tracing.serverOptions(), gate.options()...)...)
	if err != nil {
		return err
	}
	service.RegisterServer(s.grpc, s.svc)
	if s.rlqs, err = startRLQS(s.grpc, c, s.svc, s.reg, s.log); err != nil {
		return err
	}
	hs := health.NewServer()
	s.draining = make(chan struct{})
	healthpb.RegisterHealthServer(s.grpc, drainingHealth{Server: hs, draining: s.draining})
	if c.GRPC.Reflection {
		reflection.Register(s.grpc)
	}
	grpcMetrics.InitializeMetrics(s.grpc)
	gate.serve(s.grpc)
	s.ready = newReadiness(hs, s.failure, s.svc.AnswersWithoutBackend, s.log)
	// Without rules yet every answer is UNAVAILABLE: not ready. --ready-with-rules asks for
	// rules even when rls answers without them.
	s.ready.needRules(s.rules == nil || (c.Rules.ReadyWithRules && c.fromXDS() && c.Rules.StartWithoutRules))
	s.stopHealth = sync.OnceFunc(s.ready.follow(s.be))
	return nil
}

// buildHTTP builds the HTTP servers: the main one, the debug one, the metrics one.
func (s *Server) buildHTTP(context.Context) error {
	c := s.cfg
	token, err := loadAdminToken(c.AdminTokenFile)
	if err != nil {
		return err
	}
	guard := func(h http.Handler) http.Handler { return h }
	var tlsCfg *tls.Config
	if c.HTTP.TLSCert != "" {
		if tlsCfg, err = serverTLS("--http-tls", c.HTTP.TLSCert, c.HTTP.TLSKey, c.HTTP.TLSClientCA, "", tls.VerifyClientCertIfGiven); err != nil {
			return err
		}
		if c.HTTP.TLSClientCA != "" {
			guard = requireClientCert
		}
	}
	s.http = c.HTTP.server(mountKeys(mainMux(s.svc, s.ready, s.statsd.gatherer, s.reg, guard), s.svc, token, s.log, s.warn, guard))
	s.http.TLSConfig = tlsCfg
	if c.Debug.Addr != "" {
		s.debug = c.HTTP.debugServer(debugMux(s.svc, s.rlqs, s.top, c.Debug.Pprof))
	}
	if c.Metrics.Addr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET "+c.Metrics.Path, promhttp.HandlerFor(s.statsd.gatherer, promhttp.HandlerOpts{Registry: s.reg}))
		s.metrics = c.HTTP.server(mux)
	}
	return nil
}

// listen binds every listener.
func (s *Server) listen(ctx context.Context) (err error) {
	c := s.cfg
	var lc net.ListenConfig
	if s.grpcL, err = lc.Listen(ctx, "tcp", c.GRPC.Addr); err != nil {
		return fmt.Errorf("--grpc-addr: %w", err)
	}
	s.grpcL = limitConns(s.grpcL, connLimits{max: c.GRPC.MaxConnections, perSource: c.GRPC.MaxConnsPerSource}, s.reg, s.warn)
	if s.httpL, err = lc.Listen(ctx, "tcp", c.HTTP.Addr); err != nil {
		return fmt.Errorf("--http-addr: %w", err)
	}
	if s.http.TLSConfig != nil {
		s.httpL = tls.NewListener(s.httpL, s.http.TLSConfig)
	}
	if s.debug != nil {
		if s.debugL, err = lc.Listen(ctx, "tcp", c.Debug.Addr); err != nil {
			return fmt.Errorf("--debug-addr: %w", err)
		}
	}
	if s.metrics != nil {
		if s.metricsL, err = lc.Listen(ctx, "tcp", c.Metrics.Addr); err != nil {
			return fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	return nil
}

// globalExplainer is the regions' node as the service's explainer, or nil without --region.
func (s *Server) globalExplainer() service.GlobalExplainer {
	if s.regions == nil {
		return nil
	}
	return s.regions
}
