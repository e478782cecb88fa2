package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/rls-project/rls/internal/ratelimitenv"
	"github.com/rls-project/rls/internal/server"
)

// parseServeFlags parses serve's flags, their RLS_* variables and (unless --ratelimit-env=false)
// envoyproxy/ratelimit's environment into a configuration, not yet validated. Only what the
// flag package refuses (an unknown flag, a value not of the flag's type) and stray arguments
// are errors here, usage errors all.
func parseServeFlags(args, env []string, stderr io.Writer) (server.Config, error) {
	c, _, err := parseServe(args, env, stderr)
	return c, err
}

// parseServe is parseServeFlags, also returning where each flag not set on the command line got
// its value: its RLS_* variable, or the envoyproxy/ratelimit variables it was translated from.
func parseServe(args, env []string, stderr io.Writer) (server.Config, map[string]string, error) {
	c := server.DefaultConfig()
	ratelimitEnv := true
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	serveFlags(fs, &c, &ratelimitEnv)
	rest, from, err := parseFlagsFrom(fs, args, env)
	if err != nil {
		return c, nil, err
	}
	if len(rest) > 0 {
		return c, nil, fmt.Errorf("%w: unexpected arguments %q", errUsage, rest)
	}
	c.Env = env
	if ratelimitEnv {
		// What envoyproxy/ratelimit's environment gives that rls cannot take stops rls as a
		// rule file that does not load does (exit 1): a REDIS_URL is read as --redis-url is.
		if err := readRatelimitEnv(fs, env, &c.RatelimitEnv); err != nil {
			return c, nil, err
		}
		for _, st := range c.RatelimitEnv.Applied {
			if !strings.HasPrefix(st.From, "default of ") {
				from[st.Flag] = st.From
			}
		}
	}
	return c, from, nil
}

// serveFlags registers every serve flag on fs, each setting its field of c, its default the
// value the field holds (server.DefaultConfig's).
func serveFlags(fs *flag.FlagSet, c *server.Config, ratelimitEnv *bool) {
	fs.StringVar(&c.Rules.Path, "config", c.Rules.Path, "rule file or directory of *.yaml/*.yml rule files (default: the embedded example rules)")
	fs.StringVar(&c.GRPC.Addr, "grpc-addr", c.GRPC.Addr, "gRPC listen address (RateLimitService, health, reflection)")
	fs.StringVar(&c.HTTP.Addr, "http-addr", c.HTTP.Addr, "HTTP listen address (/healthz, /readyz, /metrics, POST /json); keep it off the public network")
	fs.StringVar(&c.HTTP.TLSCert, "http-tls-cert", c.HTTP.TLSCert, "PEM certificate: serve --http-addr over TLS (with --http-tls-key)")
	fs.StringVar(&c.HTTP.TLSKey, "http-tls-key", c.HTTP.TLSKey, "PEM private key for --http-addr's TLS")
	fs.StringVar(&c.HTTP.TLSClientCA, "http-tls-client-ca", c.HTTP.TLSClientCA, "PEM CA bundle: POST /json and /v1/keys require a client certificate it signed, whose names the caller policy sees (probes and /metrics need none)")
	httpFlags(fs, &c.HTTP.HTTPLimits)
	fs.StringVar(&c.Debug.Addr, "debug-addr", c.Debug.Addr, "debug HTTP listen address (/debug/rules, /debug/explain, and /debug/pprof/ with --debug); loopback by default since it shows every rule and any key's state; empty: no debug listener")
	fs.StringVar(&c.Backend, "backend", c.Backend, "where limit state lives: memory (this process only) or redis (shared by every replica)")
	fs.StringVar(&c.FailureMode, "failure-mode", c.FailureMode, "answer when the backend fails, for rules without failure_mode: error (gRPC UNAVAILABLE: Envoy's failure_mode_deny decides), allow (OK), deny (OVER_LIMIT) or local (decide in this process's memory)")
	fs.Float64Var(&c.NearLimitRatio, "near-limit-ratio", c.NearLimitRatio, "an admitted decision that leaves at least this share of the burst used counts as near_limit in metrics (0 disables)")
	fs.BoolVar(&c.Debug.Pprof, "debug", c.Debug.Pprof, "serve Go's pprof under /debug/pprof/ on the debug listener (--debug-addr)")
	fs.Int64Var(&c.Memory.MaxBytes, "memory-max-bytes", c.Memory.MaxBytes,
		"memory backend: bytes of state kept (each key counts its length plus its bookkeeping) before the least recently used key is forgotten")
	fs.IntVar(&c.Memory.MaxKeys, "memory-max-keys", c.Memory.MaxKeys, "memory backend: keys kept before the least recently used is forgotten, besides --memory-max-bytes (0: no bound on the count)")
	fs.IntVar(&c.DetailedMetricValues, "detailed-metric-values", c.DetailedMetricValues, "distinct request values per detailed_metric rule kept as metric labels; the rest count under <rule>/_overflow_")
	fs.StringVar(&c.Log.Level, "log-level", c.Log.Level, "debug, info, warn or error")
	fs.StringVar(&c.Log.Format, "log-format", c.Log.Format, "text or json")
	fs.DurationVar(&c.Log.RepeatInterval, "log-repeat-interval", c.Log.RepeatInterval, "a warning any client can cause (a refused key reset, the gRPC connection cap reached) is logged once per this interval and cause, then once with how many were suppressed (0: every time)")
	fs.StringVar(&c.ResponseHeaders, "response-headers", c.ResponseHeaders, "rate-limit headers rls adds: none (Envoy adds its own), draft (RateLimit, RateLimit-Policy) or legacy (RateLimit-Limit/-Remaining/-Reset)")
	fs.BoolVar(&c.GRPC.Reflection, "grpc-reflection", c.GRPC.Reflection, "serve gRPC reflection (for grpcurl)")
	fs.UintVar(&c.GRPC.MaxConcurrentStreams, "grpc-max-concurrent-streams", c.GRPC.MaxConcurrentStreams, "concurrent calls one gRPC connection may carry; a client needing more opens another connection, as Envoy does (each open call holds memory, so this bounds what one connection can take)")
	fs.UintVar(&c.GRPC.StreamWorkers, "grpc-stream-workers", c.GRPC.StreamWorkers, "goroutines kept to run calls, each reusing the stack the calls before it grew; a call arriving when all are busy runs on a new goroutine, as with 0 (a goroutine per call)")
	fs.DurationVar(&c.GRPC.KeepaliveMinTime, "grpc-keepalive-min-time", c.GRPC.KeepaliveMinTime, "shortest interval between client keepalive pings accepted, with or without streams (Envoy pings every 30s)")
	fs.DurationVar(&c.GRPC.MaxConnectionAge, "grpc-max-connection-age", c.GRPC.MaxConnectionAge, "close connections after this long (with GOAWAY) so clients spread over new replicas; 0 never")
	fs.DurationVar(&c.GRPC.MaxConnectionAgeGrace, "grpc-max-connection-age-grace", c.GRPC.MaxConnectionAgeGrace, "time in-flight calls get to finish after a max-age GOAWAY")
	fs.StringVar(&c.GRPC.TLSCert, "grpc-tls-cert", c.GRPC.TLSCert, "PEM certificate for gRPC TLS (with --grpc-tls-key)")
	fs.StringVar(&c.GRPC.TLSKey, "grpc-tls-key", c.GRPC.TLSKey, "PEM private key for gRPC TLS")
	fs.StringVar(&c.GRPC.TLSClientCA, "grpc-tls-client-ca", c.GRPC.TLSClientCA, "PEM CA bundle: require and verify client certificates (mTLS)")
	fs.DurationVar(&c.Shutdown.Delay, "shutdown-delay", c.Shutdown.Delay, "on SIGTERM, report NOT_SERVING this long before draining, so load balancers stop sending")
	fs.DurationVar(&c.Shutdown.Timeout, "shutdown-timeout", c.Shutdown.Timeout, "on SIGTERM, how long in-flight calls get to finish")
	fs.BoolVar(&c.Rules.AllFiles, "config-all-files", c.Rules.AllFiles, "load every file of the --config directory and of its subdirectories, whatever its name, as envoyproxy/ratelimit's runtime directory is read (default: the directory's *.yaml and *.yml files)")
	fs.BoolVar(&c.Rules.DotFiles, "config-dot-files", c.Rules.DotFiles, "also load files and directories whose names start with '.' (keep it off for Kubernetes ConfigMap mounts, whose ..data entries repeat every file)")
	fs.BoolVar(&c.Rules.MergeDomains, "merge-domains", c.Rules.MergeDomains, "merge rule files (or xDS resources) that define the same domain, instead of rejecting the second")
	fs.BoolVar(&c.Rules.Overdraft, "overdraft", c.Rules.Overdraft, "give every gcra and fixed_window limit overdraft, as a rule's overdraft: true does: hits reported past a limit are charged, into debt, rather than refused uncharged (for costs known only afterwards, such as the tokens Envoy AI Gateway reports when a stream is done; rules from xDS have no overdraft field)")
	fs.BoolVar(&c.ShadowMode, "shadow-mode", c.ShadowMode, "put every rule in shadow mode: decide and count, but answer OK")
	fs.BoolVar(&c.QuotaMode, "quota-mode", c.QuotaMode, "put every rule in quota mode")
	fs.BoolVar(&c.Rules.StartWithoutRules, "start-without-rules", c.Rules.StartWithoutRules, "--xds-server: answer at once, with no limits, before the first rules arrive (default: answer UNAVAILABLE and report not ready until they do)")
	fs.BoolVar(&c.Rules.ReadyWithRules, "ready-with-rules", c.Rules.ReadyWithRules, "report ready only once rules have been loaded, even with --start-without-rules")
	fs.StringVar(&c.GRPC.TLSClientSAN, "grpc-tls-client-san", c.GRPC.TLSClientSAN, "with --grpc-tls-client-ca: also require this name (DNS, URI, e-mail or IP) among the client certificate's subject alternative names")
	fs.StringVar(&c.Metrics.Addr, "metrics-addr", c.Metrics.Addr, "also serve Prometheus metrics on this address, at --metrics-path (they are always on --http-addr's /metrics)")
	fs.StringVar(&c.Metrics.Path, "metrics-path", c.Metrics.Path, "--metrics-addr: the path metrics are served at")
	fs.StringVar(&c.HeaderNames.Limit, "response-header-limit", c.HeaderNames.Limit, "--response-headers legacy: name of the limit header")
	fs.StringVar(&c.HeaderNames.Remaining, "response-header-remaining", c.HeaderNames.Remaining, "--response-headers legacy: name of the remaining header")
	fs.StringVar(&c.HeaderNames.Reset, "response-header-reset", c.HeaderNames.Reset, "--response-headers legacy: name of the reset header")
	statsFlags(fs, &c.Stats)
	decisionLogFlags(fs, &c.DecisionLog)
	fs.BoolVar(ratelimitEnv, "ratelimit-env", *ratelimitEnv, "read envoyproxy/ratelimit's environment variables (REDIS_URL, RUNTIME_ROOT, CONFIG_TYPE...) when they are set; flags and RLS_* variables win over them")
	grpcConnFlags(fs, &c.GRPC)
	redisFlags(fs, &c.Redis)
	reloadFlags(fs, &c.Reload)
	xdsFlags(fs, &c.XDS)
	adminTokenFlag(fs, &c.AdminTokenFile)
	rlqsFlags(fs, &c.RLQS)
	boundsFlags(fs, &c.Bounds)
	policyFlags(fs, &c.CallerPolicy)
	regionsFlags(fs, &c.Regions)
	topFlags(fs, &c.Top)
}

// readRatelimitEnv applies envoyproxy/ratelimit's environment, when env holds it, to the flags
// that neither the command line nor an RLS_* variable set.
func readRatelimitEnv(fs *flag.FlagSet, env []string, re *server.RatelimitEnv) error {
	res, err := ratelimitenv.Translate(env)
	if err != nil {
		return fmt.Errorf("envoyproxy/ratelimit environment (--ratelimit-env=false ignores it): %w", err)
	}
	re.Result = res
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
			re.Overridden = append(re.Overridden, st)
			continue
		}
		if err := fs.Set(st.Flag, st.Value); err != nil {
			return fmt.Errorf("envoyproxy/ratelimit environment: %s gives --%s=%s: %v", st.From, st.Flag, st.Display(), err)
		}
		re.Applied = append(re.Applied, st)
	}
	return nil
}

// statsFlags registers the flags of envoyproxy/ratelimit's counters (server.StatsConfig).
func statsFlags(fs *flag.FlagSet, c *server.StatsConfig) {
	fs.BoolVar(&c.RatelimitNames, "ratelimit-metrics", c.RatelimitNames, "also serve envoyproxy/ratelimit's Prometheus series, as its default statsd mapper names them (ratelimit_service_rate_limit_total_hits{domain,key1,key2}, ...), on /metrics and --metrics-addr")
	fs.StringVar(&c.StatsdAddr, "statsd-addr", c.StatsdAddr, "send envoyproxy/ratelimit's statsd counters (ratelimit.service.rate_limit.DOMAIN.KEY.total_hits, ...) to this host:port over UDP every --statsd-flush-interval (empty: none)")
	fs.DurationVar(&c.FlushInterval, "statsd-flush-interval", c.FlushInterval, "--statsd-addr: how often the counters that changed are sent")
	fs.BoolVar(&c.DogStatsD, "statsd-dogstatsd", c.DogStatsD, "--statsd-addr: send DogStatsD, tags as |#name:value, renamed by --statsd-mogrifiers")
	fs.StringVar(&c.Tags, "statsd-tags", c.Tags, "--statsd-addr: tags added to every ratelimit.* counter, name:value,name:value (DogStatsD tags, else .__name=value in the name as envoyproxy/ratelimit sends them)")
	fs.StringVar(&c.Mogrifiers, "statsd-mogrifiers", c.Mogrifiers, `--statsd-dogstatsd: counters renamed and tagged, the first whose pattern matches, as a JSON list [{"pattern":"^ratelimit\\.service\\.rate_limit\\.(.*)\\.total_hits$","name":"ratelimit.hits","tags":{"key":"$1"}}]`)
}
