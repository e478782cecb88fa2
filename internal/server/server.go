// Package server is one rls server: its configuration (Config, with every default and every
// rule about values), its listeners (gRPC, HTTP, debug, metrics), the wiring of the backend,
// the decision service, RLQS, xDS, file reloads, the caller policy, metrics and readiness, and
// its lifecycle: New builds it, Run serves, Shutdown drains and stops it. cmd/rls parses flags
// and environment into a Config; nothing here reads flags or exits.
package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/decisionlog"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/logthrottle"
	"github.com/rls-project/rls/internal/regions"
	"github.com/rls-project/rls/internal/rlqs"
	"github.com/rls-project/rls/internal/service"
	"github.com/rls-project/rls/internal/top"
	"github.com/rls-project/rls/internal/version"
	"github.com/rls-project/rls/internal/xds"
)

// Server is one rls instance. New builds it whole (rules loaded, backend connected, listeners
// bound) without answering anything yet; Run serves; Shutdown stops it in the order load
// balancers need. Everything it uses is its own: logger, metrics registry, tracer provider. The
// process-wide state it touches is the SIGHUP handler and go-redis's logger.
type Server struct {
	cfg     Config
	log     *slog.Logger
	tracing tracingSetup
	rules   *descriptors.RuleSet // as loaded at start
	failure service.FailureMode
	be      backend.Backend
	local   backend.Backend
	svc     *service.Service
	top     *top.Top      // nil: top talkers off
	rlqs    *rlqs.Server  // nil with --rlqs=false
	regions *regions.Node // nil without --region
	warn    *logthrottle.Throttle
	reg     *prometheus.Registry // every metric of this server
	statsd  statsSetup           // envoyproxy/ratelimit's counters, OTLP metrics
	callers *callerPolicy        // nil without --caller-policy
	// decisions is the decision log, nil without --decision-log; decisionFile its file.
	decisions    *decisionlog.Log
	decisionFile *os.File

	grpc     *grpc.Server
	ready    *readiness
	draining chan struct{} // closed when the gRPC drain begins: ends health watches
	http     *http.Server
	debug    *http.Server // nil without --debug-addr
	metrics  *http.Server // nil without --metrics-addr
	xds      *xds.Client  // nil without --xds-server

	grpcL, httpL, debugL, metricsL net.Listener

	errc       chan error         // one per listener: why its Serve returned
	rctx       context.Context    // the file watches' and the xDS subscription's, until close
	stopReload context.CancelFunc // ends rctx
	stopHealth func()
}

// Run serves on every listener until ctx ends, which returns nil, or until one fails, which
// returns its error. Readiness turns SERVING once every listener is serving.
func (s *Server) Run(ctx context.Context) error {
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
	s.log.Info("rls serving", append(attrs, "version", version.Get().String(), "backend", s.cfg.Backend, "failure_mode", s.failure.String(),
		"rules", rulesSource(s.cfg), "domains", domains,
		"tls", s.cfg.GRPC.TLSCert != "", "tracing", s.tracing.tracer != nil, "pprof", s.cfg.Debug.Pprof)...)
	select {
	case <-ctx.Done():
		return nil
	case err := <-s.errc:
		return fmt.Errorf("serving: %w", err)
	}
}

// Shutdown stops a server that Run returned from, in order: health says NOT_SERVING at once (so
// load balancers and Envoy's health checks stop sending), rls goes on answering for
// --shutdown-delay (skipped when a listener failed), then drains gRPC (GOAWAY; in-flight calls get
// --shutdown-timeout), then closes the rest. It returns serveErr.
func (s *Server) Shutdown(serveErr error) error {
	s.beginShutdown()
	s.log.Info("shutting down", "delay", s.cfg.Shutdown.Delay, "timeout", s.cfg.Shutdown.Timeout)
	if serveErr == nil && s.cfg.Shutdown.Delay > 0 {
		time.Sleep(s.cfg.Shutdown.Delay)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.Shutdown.Timeout)
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
func (s *Server) beginShutdown() {
	s.stopHealth()
	s.ready.stop()
}

// drain stops the gRPC server gracefully: a GOAWAY on every connection, health watches ended,
// in-flight calls let finish until ctx ends, then closed.
func (s *Server) drain(ctx context.Context) {
	close(s.draining)
	stopped := make(chan struct{})
	go func() { s.grpc.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-ctx.Done():
		s.log.Warn("in-flight calls did not finish in time; closing", "timeout", s.cfg.Shutdown.Timeout)
		s.grpc.Stop()
		// Stop cancels every call, and GracefulStop then returns once their handlers have.
		// A handler that does not return at once waits on the backend without watching its
		// call: a lone decision reading its own reply from a Redis that stopped answering,
		// bounded by its deadline only (up to --redis-timeout). It is not waited for, as
		// closing the backend does not wait for a pipeline in flight (backendCloseTimeout).
		t := time.NewTimer(handlersStopTimeout)
		select {
		case <-stopped:
		case <-t.C:
			s.log.Warn("calls still waiting on the backend; closing it under them", "waited", handlersStopTimeout)
		}
		t.Stop()
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

// handlersStopTimeout is how long a drain cut short waits for the handlers of the calls it
// cancelled to return.
const handlersStopTimeout = 200 * time.Millisecond

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

// close releases everything New opened; it is safe on a server built halfway.
func (s *Server) close() {
	s.stopReload()
	s.stopHealth()
	for _, l := range []net.Listener{s.grpcL, s.httpL, s.debugL, s.metricsL} {
		if l != nil {
			l.Close() // already closed when served; open when New failed after binding
		}
	}
	if s.regions != nil {
		s.regions.Close()
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
	s.closeDecisionLog()
	s.tracing.shutdown()
	s.statsd.stop()
	if s.warn != nil {
		s.warn.Close() // what was suppressed since the last line
	}
}
