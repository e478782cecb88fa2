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
	"math"
	"os"
	"slices"
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
	"github.com/rls-project/rls/internal/ratelimitenv"
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
	logRepeat       time.Duration
	responseHeaders string
	reflection      bool
	keepaliveMin    time.Duration
	maxStreams      uint
	streamWorkers   uint
	maxConnAge      time.Duration
	maxConnAgeGrace time.Duration
	grpcConns       grpcConnLimits
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
	xds             *xdsConfig
	usage           *usageConfig
	rlqs            *rlqsConfig
	bounds          *boundsConfig
	policy          *policyConfig

	configAllFiles    bool
	configDotFiles    bool
	mergeDomains      bool
	shadowMode        bool
	quotaMode         bool
	startWithoutRules bool
	readyWithRules    bool
	tlsClientSAN      string
	metricsAddr       string
	metricsPath       string
	headerNames       service.LegacyHeaderNames
	ratelimitEnv      bool
	// compat is what envoyproxy/ratelimit's environment asked; applied are its settings in
	// force, overridden those a flag or an RLS_* variable set otherwise. Logged at start.
	compat     ratelimitenv.Result
	applied    []ratelimitenv.Setting
	overridden []ratelimitenv.Setting
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
	fs.DurationVar(&c.logRepeat, "log-repeat-interval", service.DefaultWarningInterval, "a warning any client can cause (a refused key reset, the gRPC connection cap reached) is logged once per this interval and cause, then once with how many were suppressed (0: every time)")
	fs.StringVar(&c.responseHeaders, "response-headers", "none", "rate-limit headers rls adds: none (Envoy adds its own), draft (RateLimit, RateLimit-Policy) or legacy (RateLimit-Limit/-Remaining/-Reset)")
	fs.BoolVar(&c.reflection, "grpc-reflection", true, "serve gRPC reflection (for grpcurl)")
	fs.UintVar(&c.maxStreams, "grpc-max-concurrent-streams", 1024, "concurrent calls one gRPC connection may carry; a client needing more opens another connection, as Envoy does (each open call holds memory, so this bounds what one connection can take)")
	fs.UintVar(&c.streamWorkers, "grpc-stream-workers", defaultStreamWorkers, "goroutines kept to run calls, each reusing the stack the calls before it grew; a call arriving when all are busy runs on a new goroutine, as with 0 (a goroutine per call)")
	fs.DurationVar(&c.keepaliveMin, "grpc-keepalive-min-time", 10*time.Second, "shortest interval between client keepalive pings accepted, with or without streams (Envoy pings every 30s)")
	fs.DurationVar(&c.maxConnAge, "grpc-max-connection-age", 10*time.Minute, "close connections after this long (with GOAWAY) so clients spread over new replicas; 0 never")
	fs.DurationVar(&c.maxConnAgeGrace, "grpc-max-connection-age-grace", 30*time.Second, "time in-flight calls get to finish after a max-age GOAWAY")
	fs.StringVar(&c.tlsCert, "grpc-tls-cert", "", "PEM certificate for gRPC TLS (with --grpc-tls-key)")
	fs.StringVar(&c.tlsKey, "grpc-tls-key", "", "PEM private key for gRPC TLS")
	fs.StringVar(&c.tlsClientCA, "grpc-tls-client-ca", "", "PEM CA bundle: require and verify client certificates (mTLS)")
	fs.DurationVar(&c.shutdownDelay, "shutdown-delay", 0, "on SIGTERM, report NOT_SERVING this long before draining, so load balancers stop sending")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "on SIGTERM, how long in-flight calls get to finish")
	fs.BoolVar(&c.configAllFiles, "config-all-files", false, "load every file of the --config directory and of its subdirectories, whatever its name, as envoyproxy/ratelimit's runtime directory is read (default: the directory's *.yaml and *.yml files)")
	fs.BoolVar(&c.configDotFiles, "config-dot-files", false, "also load files and directories whose names start with '.' (keep it off for Kubernetes ConfigMap mounts, whose ..data entries repeat every file)")
	fs.BoolVar(&c.mergeDomains, "merge-domains", false, "merge rule files (or xDS resources) that define the same domain, instead of rejecting the second")
	fs.BoolVar(&c.shadowMode, "shadow-mode", false, "put every rule in shadow mode: decide and count, but answer OK")
	fs.BoolVar(&c.quotaMode, "quota-mode", false, "put every rule in quota mode")
	fs.BoolVar(&c.startWithoutRules, "start-without-rules", false, "--xds-server: answer at once, with no limits, before the first rules arrive (default: answer UNAVAILABLE and report not ready until they do)")
	fs.BoolVar(&c.readyWithRules, "ready-with-rules", false, "report ready only once rules have been loaded, even with --start-without-rules")
	fs.StringVar(&c.tlsClientSAN, "grpc-tls-client-san", "", "with --grpc-tls-client-ca: also require this name (DNS, URI, e-mail or IP) among the client certificate's subject alternative names")
	fs.StringVar(&c.metricsAddr, "metrics-addr", "", "also serve Prometheus metrics on this address, at --metrics-path (they are always on --http-addr's /metrics)")
	fs.StringVar(&c.metricsPath, "metrics-path", "/metrics", "--metrics-addr: the path metrics are served at")
	fs.StringVar(&c.headerNames.Limit, "response-header-limit", "RateLimit-Limit", "--response-headers legacy: name of the limit header")
	fs.StringVar(&c.headerNames.Remaining, "response-header-remaining", "RateLimit-Remaining", "--response-headers legacy: name of the remaining header")
	fs.StringVar(&c.headerNames.Reset, "response-header-reset", "RateLimit-Reset", "--response-headers legacy: name of the reset header")
	fs.BoolVar(&c.ratelimitEnv, "ratelimit-env", true, "read envoyproxy/ratelimit's environment variables (REDIS_URL, RUNTIME_ROOT, CONFIG_TYPE...) when they are set; flags and RLS_* variables win over them")
	grpcConnFlags(fs, &c.grpcConns)
	c.redis = redisFlags(fs)
	c.reload = reloadFlags(fs)
	c.xds = xdsFlags(fs)
	c.usage = usageFlags(fs)
	c.rlqs = rlqsFlags(fs)
	c.bounds = boundsFlags(fs)
	c.policy = policyFlags(fs)
	if err := parseFlags(fs, args, env); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	if err := c.rlqs.validate(); err != nil {
		return c, err
	}
	if err := c.bounds.validate(); err != nil {
		return c, err
	}
	c.env = env
	if err := c.usage.load(); err != nil {
		return c, err
	}
	if c.ratelimitEnv {
		if err := c.readRatelimitEnv(fs, env); err != nil {
			return c, err
		}
	}
	return c, nil
}

// readRatelimitEnv applies envoyproxy/ratelimit's environment, when env holds it, to the flags
// that neither the command line nor an RLS_* variable set.
func (c *serveConfig) readRatelimitEnv(fs *flag.FlagSet, env []string) error {
	res, err := ratelimitenv.Translate(env)
	if err != nil {
		return fmt.Errorf("envoyproxy/ratelimit environment (--ratelimit-env=false ignores it): %w", err)
	}
	c.compat = res
	if len(res.Present) == 0 {
		return nil
	}
	explicit := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	for _, kv := range env {
		if k, _, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "RLS_") {
			explicit[strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "RLS_"), "_", "-"))] = true
		}
	}
	for _, st := range res.Settings {
		if explicit[st.Flag] {
			c.overridden = append(c.overridden, st)
			continue
		}
		if err := fs.Set(st.Flag, st.Value); err != nil {
			return fmt.Errorf("envoyproxy/ratelimit environment: %s gives --%s=%s: %v", st.From, st.Flag, st.Display(), err)
		}
		c.applied = append(c.applied, st)
	}
	return nil
}

// fromRatelimitEnv says, for an error, which envoyproxy/ratelimit variables gave flag; "" when
// none did.
func (c serveConfig) fromRatelimitEnv(flag string) string {
	for _, st := range c.applied {
		if st.Flag == flag {
			return fmt.Sprintf(" (--%s from %s)", flag, st.From)
		}
	}
	return ""
}

// logRatelimitEnv says, once at start, what envoyproxy/ratelimit's environment changed and
// what of it rls does not do as asked.
func (c serveConfig) logRatelimitEnv(log *slog.Logger) {
	if len(c.compat.Present) == 0 {
		return
	}
	log.Info("envoyproxy/ratelimit environment found; reading it (--ratelimit-env=false ignores it)", "variables", strings.Join(c.compat.Present, ","))
	for _, st := range c.applied {
		log.Info("envoyproxy/ratelimit setting", "flag", "--"+st.Flag, "value", st.Display(), "from", st.From)
	}
	for _, st := range c.overridden {
		log.Info("envoyproxy/ratelimit setting overridden by rls's own", "flag", "--"+st.Flag, "from", st.From)
	}
	for _, n := range c.compat.Notices {
		log.Warn("envoyproxy/ratelimit setting not applied as given", "variable", n.Var, "instead", n.Text)
	}
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

// loadRules loads rule files: path, or the embedded example rules when path is empty.
func loadRules(path string, opts descriptors.Options) (*descriptors.RuleSet, error) {
	if path == "" {
		return descriptors.ParseWith(map[string][]byte{defaultRulesName: defaultRules}, opts)
	}
	return descriptors.LoadWith(path, opts)
}

// fromXDS reports whether the rules come from an xDS server.
func (c serveConfig) fromXDS() bool { return c.xds != nil && c.xds.server != "" }

// rulesOptions are the loader's options, for files and xDS alike.
func (c serveConfig) rulesOptions() descriptors.Options {
	return descriptors.Options{AllFiles: c.configAllFiles, DotFiles: c.configDotFiles, MergeDomains: c.mergeDomains}
}

// initialRules are the rules rls starts with: the files', or with --xds-server none yet (nil),
// or an empty set with --start-without-rules.
func (c serveConfig) initialRules() (*descriptors.RuleSet, error) {
	if !c.fromXDS() {
		return loadRules(c.config, c.rulesOptions())
	}
	if c.config != "" {
		return nil, errors.New("--config and --xds-server both give the rules: keep one")
	}
	if c.startWithoutRules {
		return descriptors.Parse(nil)
	}
	return nil, nil
}

func newBackend(ctx context.Context, c serveConfig, log *slog.Logger) (backend.Backend, error) {
	switch c.backend {
	case "memory":
		return backend.NewMemory(c.memoryOptions())
	case "redis":
		b, err := newRedisBackend(ctx, c.redis, log)
		if err != nil {
			return nil, fmt.Errorf("%w%s", err, c.fromRatelimitEnv("redis-url"))
		}
		return b, nil
	}
	return nil, fmt.Errorf("--backend %q: want memory or redis", c.backend)
}

func grpcCredentials(c serveConfig) (grpc.ServerOption, error) {
	if c.tlsCert == "" && c.tlsKey == "" {
		if c.tlsClientCA != "" {
			return nil, errors.New("--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key")
		}
		if c.tlsClientSAN != "" {
			return nil, errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca, --grpc-tls-cert and --grpc-tls-key")
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
		if san := c.tlsClientSAN; san != "" {
			cfg.VerifyConnection = func(cs tls.ConnectionState) error {
				if len(cs.PeerCertificates) > 0 && hasSAN(cs.PeerCertificates[0], san) {
					return nil
				}
				return fmt.Errorf("client certificate does not name %q", san)
			}
		}
	} else if c.tlsClientSAN != "" {
		return nil, errors.New("--grpc-tls-client-san needs --grpc-tls-client-ca")
	}
	return grpc.Creds(credentials.NewTLS(cfg)), nil
}

// hasSAN reports whether cert names san among its DNS names, URIs, e-mail addresses or IPs.
func hasSAN(cert *x509.Certificate, san string) bool {
	if slices.Contains(cert.DNSNames, san) || slices.Contains(cert.EmailAddresses, san) {
		return true
	}
	for _, u := range cert.URIs {
		if u.String() == san {
			return true
		}
	}
	for _, ip := range cert.IPAddresses {
		if ip.String() == san {
			return true
		}
	}
	return false
}

// Stream workers: the default keeps a worker for each call of 64 clients at once (Envoy's
// connections carry many); the bound keeps a typo from starting millions of goroutines.
const (
	defaultStreamWorkers = 64
	maxStreamWorkers     = 4096
)

// newGRPCServer returns the gRPC server with the settings Envoy needs: keepalive pings accepted
// every --grpc-keepalive-min-time even without streams, a maximum connection age, optional
// (m)TLS, and panics answered INTERNAL instead of killing the process.
// interceptors (unary) run outside the panic recovery, in order; extra are further server options.
func newGRPCServer(c serveConfig, log *slog.Logger, interceptors []grpc.UnaryServerInterceptor, extra ...grpc.ServerOption) (*grpc.Server, error) {
	recovered := recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "panic in gRPC handler", "panic", p)
		return status.Error(codes.Internal, "internal error")
	})
	interceptors = append(interceptors, recovery.UnaryServerInterceptor(recovered))
	opts := append([]grpc.ServerOption{
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: c.keepaliveMin, PermitWithoutStream: true}),
		// Bounds on what one connection can hold: calls open at once, and each call's headers
		// (gRPC's own default is 16 MiB of headers per call, with no bound on calls).
		grpc.MaxConcurrentStreams(uint32(min(c.maxStreams, math.MaxUint32))),
		grpc.MaxHeaderListSize(grpcMaxHeaderBytes),
		// A larger message is refused from its length prefix, before it is read.
		grpc.MaxRecvMsgSize(c.maxRecvMsgSize()),
		// Fixed flow-control windows, where gRPC's default grows them with the bandwidth it
		// measures (up to 16 MiB): a client can then send no more than a window past what rls
		// has read, so a refused message costs rls 64 KiB of reading, not all of it.
		grpc.InitialWindowSize(grpcWindowBytes),
		grpc.InitialConnWindowSize(grpcConnWindowBytes),
		grpc.ChainUnaryInterceptor(interceptors...),
		// Streams (RLQS) too: a panic ends the stream with INTERNAL, not the process.
		grpc.ChainStreamInterceptor(recovery.StreamServerInterceptor(recovered)),
		// Decodes requests without protobuf's UTF-8 check, so that validation answers invalid
		// UTF-8 InvalidArgument instead of the codec answering INTERNAL.
		grpc.ForceServerCodecV2(service.CodecMax(c.bounds.maxRequestBytes)),
	}, extra...)
	if c.streamWorkers > 0 {
		// A new goroutine per call grows its stack to what the handler needs on every call
		// (runtime.newstack, about a tenth of rls's CPU under load); a worker grows it once.
		opts = append(opts, grpc.NumStreamWorkers(uint32(c.streamWorkers))) // at most maxStreamWorkers
	}
	if c.maxConnAge > 0 || c.grpcConns.maxIdle > 0 {
		kp := keepalive.ServerParameters{MaxConnectionIdle: c.grpcConns.maxIdle}
		if c.maxConnAge > 0 {
			kp.MaxConnectionAge, kp.MaxConnectionAgeGrace = c.maxConnAge, c.maxConnAgeGrace
		}
		opts = append(opts, grpc.KeepaliveParams(kp))
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

// maxRecvMsgSize is the gRPC server's bound on a message: --max-request-bytes, or with RLQS
// served --rlqs-max-report-bytes when larger (gRPC has one bound for every method). A
// ShouldRateLimit request past --max-request-bytes is then refused by the codec, once read.
func (c serveConfig) maxRecvMsgSize() int {
	if c.rlqs != nil && c.rlqs.enabled {
		return max(c.bounds.maxRequestBytes, c.rlqs.maxReportBytes)
	}
	return c.bounds.maxRequestBytes
}

// The flow-control windows: one call's (gRPC's least) and one connection's. Envoy's requests
// take a few hundred bytes, so neither slows them.
const (
	grpcWindowBytes     = 64 << 10
	grpcConnWindowBytes = 1 << 20
)

// grpcMaxHeaderBytes bounds the headers (metadata) of one gRPC call: Envoy's rate-limit calls
// carry a few hundred bytes.
const grpcMaxHeaderBytes = 64 << 10

func rulesSource(c serveConfig) string {
	switch {
	case c.fromXDS():
		return "xds " + c.xds.server + " node " + c.xds.nodeID
	case c.config == "":
		return strings.TrimPrefix(defaultRulesName, "embedded:") + " (embedded)"
	}
	return c.config
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
