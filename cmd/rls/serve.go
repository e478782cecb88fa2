package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/service"
)

// serveConfig is every serve flag.
type serveConfig struct {
	config          string
	grpcAddr        string
	httpAddr        string
	http            httpLimits
	debugAddr       string
	backend         string
	memoryMaxKeys   int
	memoryMaxBytes  int64
	detailedValues  int
	logLevel        string
	logFormat       string
	responseHeaders string
	reflection      bool
	keepaliveMin    time.Duration
	maxConnAge      time.Duration
	maxConnAgeGrace time.Duration
	tlsCert         string
	tlsKey          string
	tlsClientCA     string
	shutdownDelay   time.Duration
	shutdownTimeout time.Duration
	failureMode     string
	nearLimitRatio  float64
	debug           bool
	env             []string
	redis           *redisConfig
	reload          *reloadConfig
}

func parseServeFlags(args, env []string, stderr io.Writer) (serveConfig, error) {
	var c serveConfig
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.config, "config", "", "rule file or directory of *.yaml/*.yml rule files (default: the embedded example rules)")
	fs.StringVar(&c.grpcAddr, "grpc-addr", ":8081", "gRPC listen address (RateLimitService, health, reflection)")
	fs.StringVar(&c.httpAddr, "http-addr", ":8080", "HTTP listen address (/healthz, /readyz, /metrics, POST /json); keep it off the public network")
	httpFlags(fs, &c.http)
	fs.StringVar(&c.debugAddr, "debug-addr", "127.0.0.1:6070", "debug HTTP listen address (/debug/rules, /debug/explain, and /debug/pprof/ with --debug); loopback by default since it shows every rule and any key's state; empty: no debug listener")
	fs.StringVar(&c.backend, "backend", "memory", "where limit state lives: memory (this process only) or redis (shared by every replica)")
	fs.StringVar(&c.failureMode, "failure-mode", "error", "answer when the backend fails, for rules without failure_mode: error (gRPC UNAVAILABLE: Envoy's failure_mode_deny decides), allow (OK), deny (OVER_LIMIT) or local (decide in this process's memory)")
	fs.Float64Var(&c.nearLimitRatio, "near-limit-ratio", 0.8, "an admitted decision that leaves at least this share of the burst used counts as near_limit in metrics (0 disables)")
	fs.BoolVar(&c.debug, "debug", false, "serve Go's pprof under /debug/pprof/ on the debug listener (--debug-addr)")
	fs.Int64Var(&c.memoryMaxBytes, "memory-max-bytes", backend.DefaultMemoryMaxBytes,
		"memory backend: bytes of state kept (each key counts its length plus its bookkeeping) before the least recently used key is forgotten")
	fs.IntVar(&c.memoryMaxKeys, "memory-max-keys", 0, "memory backend: keys kept before the least recently used is forgotten, besides --memory-max-bytes (0: no bound on the count)")
	fs.IntVar(&c.detailedValues, "detailed-metric-values", 100, "distinct request values per detailed_metric rule kept as metric labels; the rest count under <rule>/_overflow_")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.logFormat, "log-format", "text", "text or json")
	fs.StringVar(&c.responseHeaders, "response-headers", "none", "rate-limit headers rls adds: none (Envoy adds its own), draft (RateLimit, RateLimit-Policy) or legacy (RateLimit-Limit/-Remaining/-Reset)")
	fs.BoolVar(&c.reflection, "grpc-reflection", true, "serve gRPC reflection (for grpcurl)")
	fs.DurationVar(&c.keepaliveMin, "grpc-keepalive-min-time", 10*time.Second, "shortest interval between client keepalive pings accepted, with or without streams (Envoy pings every 30s)")
	fs.DurationVar(&c.maxConnAge, "grpc-max-connection-age", 10*time.Minute, "close connections after this long (with GOAWAY) so clients spread over new replicas; 0 never")
	fs.DurationVar(&c.maxConnAgeGrace, "grpc-max-connection-age-grace", 30*time.Second, "time in-flight calls get to finish after a max-age GOAWAY")
	fs.StringVar(&c.tlsCert, "grpc-tls-cert", "", "PEM certificate for gRPC TLS (with --grpc-tls-key)")
	fs.StringVar(&c.tlsKey, "grpc-tls-key", "", "PEM private key for gRPC TLS")
	fs.StringVar(&c.tlsClientCA, "grpc-tls-client-ca", "", "PEM CA bundle: require and verify client certificates (mTLS)")
	fs.DurationVar(&c.shutdownDelay, "shutdown-delay", 0, "on SIGTERM, report NOT_SERVING this long before draining, so load balancers stop sending")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long in-flight calls get to finish")
	c.redis = redisFlags(fs)
	c.reload = reloadFlags(fs)
	if err := parseFlags(fs, args, env); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	c.env = env
	return c, nil
}

func newLogger(level, format string, w io.Writer) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: l}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

func loadRules(path string) (*descriptors.RuleSet, error) {
	if path == "" {
		return descriptors.Parse(map[string][]byte{defaultRulesName: defaultRules})
	}
	return descriptors.Load(path)
}

func newBackend(ctx context.Context, c serveConfig, log *slog.Logger) (backend.Backend, error) {
	switch c.backend {
	case "memory":
		return backend.NewMemory(c.memoryOptions())
	case "redis":
		return newRedisBackend(ctx, c.redis, log)
	}
	return nil, fmt.Errorf("--backend %q: want memory or redis", c.backend)
}

func grpcCredentials(c serveConfig) (grpc.ServerOption, error) {
	if c.tlsCert == "" && c.tlsKey == "" {
		if c.tlsClientCA != "" {
			return nil, errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key")
		}
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.tlsCert, c.tlsKey)
	if err != nil {
		return nil, fmt.Errorf("--grpc-tls-cert/--grpc-tls-key: %w", err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.tlsClientCA != "" {
		pem, err := os.ReadFile(c.tlsClientCA)
		if err != nil {
			return nil, fmt.Errorf("--grpc-tls-client-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--grpc-tls-client-ca %s: no PEM certificates", c.tlsClientCA)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return grpc.Creds(credentials.NewTLS(cfg)), nil
}

// newGRPCServer returns the gRPC server with the settings Envoy needs: keepalive pings accepted
// every --grpc-keepalive-min-time even without streams, a maximum connection age, optional
// (m)TLS, and panics answered INTERNAL instead of killing the process.
// interceptors run outside the panic recovery, in order; extra are further server options.
func newGRPCServer(c serveConfig, log *slog.Logger, interceptors []grpc.UnaryServerInterceptor, extra ...grpc.ServerOption) (*grpc.Server, error) {
	interceptors = append(interceptors, recovery.UnaryServerInterceptor(recovery.WithRecoveryHandlerContext(
		func(ctx context.Context, p any) error {
			log.ErrorContext(ctx, "panic in gRPC handler", "panic", p)
			return status.Error(codes.Internal, "internal error")
		})))
	opts := append([]grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: c.keepaliveMin, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(interceptors...),
		// Decodes requests without protobuf's UTF-8 check, so that validation answers invalid
		// UTF-8 InvalidArgument instead of the codec answering INTERNAL.
		grpc.ForceServerCodecV2(service.Codec()),
	}, extra...)
	if c.maxConnAge > 0 {
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge: c.maxConnAge, MaxConnectionAgeGrace: c.maxConnAgeGrace,
		}))
	}
	creds, err := grpcCredentials(c)
	if err != nil {
		return nil, err
	}
	if creds != nil {
		opts = append(opts, creds)
	}
	return grpc.NewServer(opts...), nil
}

func rulesSource(path string) string {
	if path == "" {
		return strings.TrimPrefix(defaultRulesName, "embedded:") + " (embedded)"
	}
	return path
}

// drainingHealth ends health Watch streams when draining begins: GracefulStop waits for every
// stream, and a client that watches health (gRPC client-side health checking) never ends its
// watch itself, so without this every shutdown would last --shutdown-timeout and end forced.
type drainingHealth struct {
	*health.Server
	draining <-chan struct{}
}

func (h drainingHealth) Watch(req *healthpb.HealthCheckRequest, stream healthpb.Health_WatchServer) error {
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.draining:
			cancel()
		case <-ctx.Done():
		}
	}()
	return h.Server.Watch(req, &watchStream{Health_WatchServer: stream, ctx: ctx})
}

// watchStream is a Watch stream whose context also ends when draining begins.
type watchStream struct {
	healthpb.Health_WatchServer
	ctx context.Context
}

func (s *watchStream) Context() context.Context { return s.ctx }

// memoryOptions are the memory backend's options, for the backend and for failure mode local.
func (c serveConfig) memoryOptions() backend.MemoryOptions {
	return backend.MemoryOptions{MaxBytes: c.memoryMaxBytes, MaxKeys: c.memoryMaxKeys}
}
