package server

import (
	"time"

	"github.com/rls-project/rls/internal/backend"
	redisbackend "github.com/rls-project/rls/internal/backend/redis"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/ratelimitenv"
	"github.com/rls-project/rls/internal/regions"
	"github.com/rls-project/rls/internal/reload"
	"github.com/rls-project/rls/internal/rlqs"
	"github.com/rls-project/rls/internal/service"
	"github.com/rls-project/rls/internal/top"
	"github.com/rls-project/rls/internal/xds"
)

// Config is everything one server is built from: each field is a serve flag (named in its
// comment or in the error Validate returns for it). DefaultConfig holds every default;
// Validate every rule about the values; New what needs the outside world (files, addresses).
type Config struct {
	Rules    RulesConfig
	GRPC     GRPCConfig
	HTTP     HTTPConfig
	Debug    DebugConfig
	Metrics  MetricsConfig
	Log      LogConfig
	Shutdown ShutdownConfig
	Reload   ReloadConfig
	Bounds   BoundsConfig
	Redis    RedisConfig
	RLQS     RLQSConfig
	XDS      XDSConfig
	Regions  RegionsConfig
	Stats    StatsConfig // envoyproxy/ratelimit's counters (stats.go)
	// DecisionLog is the decision log (decisionlog.go).
	DecisionLog DecisionLogConfig

	Backend              string // --backend: memory or redis
	Memory               MemoryConfig
	FailureMode          string  // --failure-mode
	NearLimitRatio       float64 // --near-limit-ratio
	DetailedMetricValues int     // --detailed-metric-values
	Top                  TopConfig
	ResponseHeaders      string // --response-headers: none, draft or legacy
	HeaderNames          service.LegacyHeaderNames
	ShadowMode           bool   // --shadow-mode
	QuotaMode            bool   // --quota-mode
	AdminTokenFile       string // --admin-token-file
	CallerPolicy         string // --caller-policy

	// Env is the process environment (os.Environ), for OpenTelemetry's OTEL_* variables.
	Env []string
	// RatelimitEnv is what envoyproxy/ratelimit's environment asked, logged at start and named in
	// errors about the flags it set.
	RatelimitEnv RatelimitEnv
}

// RatelimitEnv is what envoyproxy/ratelimit's environment asked; Applied are its settings in
// force, Overridden those a flag or an RLS_* variable set otherwise.
type RatelimitEnv struct {
	Result     ratelimitenv.Result
	Applied    []ratelimitenv.Setting
	Overridden []ratelimitenv.Setting
}

// RulesConfig says where the rules come from (files, or XDSConfig.Server) and how they load.
type RulesConfig struct {
	Path              string // --config; "": the embedded example rules
	AllFiles          bool   // --config-all-files
	DotFiles          bool   // --config-dot-files
	MergeDomains      bool   // --merge-domains
	Overdraft         bool   // --overdraft
	StartWithoutRules bool   // --start-without-rules
	ReadyWithRules    bool   // --ready-with-rules
}

// GRPCConfig is the gRPC listener's.
type GRPCConfig struct {
	Addr                  string        // --grpc-addr
	Reflection            bool          // --grpc-reflection
	KeepaliveMinTime      time.Duration // --grpc-keepalive-min-time
	MaxConcurrentStreams  uint          // --grpc-max-concurrent-streams
	StreamWorkers         uint          // --grpc-stream-workers
	MaxConnectionAge      time.Duration // --grpc-max-connection-age
	MaxConnectionAgeGrace time.Duration // --grpc-max-connection-age-grace
	MaxConnections        int           // --grpc-max-connections
	MaxConnectionIdle     time.Duration // --grpc-max-connection-idle
	MaxConnsPerSource     int           // --grpc-max-connections-per-source; 0: no bound
	HandshakeTimeout      time.Duration // --grpc-handshake-timeout
	MessageTimeout        time.Duration // --grpc-message-timeout; 0: none
	TLSCert               string        // --grpc-tls-cert
	TLSKey                string        // --grpc-tls-key
	TLSClientCA           string        // --grpc-tls-client-ca
	TLSClientSAN          string        // --grpc-tls-client-san
}

// HTTPConfig is the HTTP listener's; its limits bound the debug and metrics listeners too.
type HTTPConfig struct {
	Addr        string // --http-addr
	TLSCert     string // --http-tls-cert
	TLSKey      string // --http-tls-key
	TLSClientCA string // --http-tls-client-ca
	HTTPLimits
}

// TopConfig sizes the top talkers (/debug/top on the debug listener).
type TopConfig struct {
	Keys     int   // --top-keys; 0: off
	MaxBytes int64 // --top-max-bytes
}

// DebugConfig is the debug listener's.
type DebugConfig struct {
	Addr  string // --debug-addr; "": none
	Pprof bool   // --debug
}

// MetricsConfig is the metrics listener's.
type MetricsConfig struct {
	Addr string // --metrics-addr; "": none
	Path string // --metrics-path
}

// LogConfig is the logger's.
type LogConfig struct {
	Level          string        // --log-level
	Format         string        // --log-format
	RepeatInterval time.Duration // --log-repeat-interval
}

// ShutdownConfig is how a server stops on SIGTERM.
type ShutdownConfig struct {
	Delay   time.Duration // --shutdown-delay
	Timeout time.Duration // --shutdown-timeout
}

// MemoryConfig bounds the memory backend (and failure mode local's).
type MemoryConfig struct {
	MaxBytes int64 // --memory-max-bytes
	MaxKeys  int   // --memory-max-keys; 0: no bound on the count
}

// ReloadConfig is how rule and policy files are reloaded.
type ReloadConfig struct {
	Debounce time.Duration // --reload-debounce
}

// DefaultConfig is the configuration of rls run without flags.
func DefaultConfig() Config {
	return Config{
		GRPC: GRPCConfig{
			Addr: ":8081", Reflection: true, KeepaliveMinTime: 10 * time.Second,
			MaxConcurrentStreams: defaultGRPCMaxConcurrentStreams, StreamWorkers: defaultStreamWorkers,
			MaxConnectionAge: 10 * time.Minute, MaxConnectionAgeGrace: 30 * time.Second,
			MaxConnections: defaultGRPCMaxConnections, MaxConnectionIdle: defaultGRPCMaxConnectionIdle,
			MaxConnsPerSource: defaultGRPCMaxConnsPerSource, HandshakeTimeout: defaultGRPCHandshakeTimeout,
			MessageTimeout: defaultGRPCMessageTimeout,
		},
		HTTP: HTTPConfig{Addr: ":8080", HTTPLimits: HTTPLimits{
			ReadHeaderTimeout: defaultHTTPReadHeaderTimeout, ReadTimeout: defaultHTTPReadTimeout,
			WriteTimeout: defaultHTTPWriteTimeout, IdleTimeout: defaultHTTPIdleTimeout,
			MaxHeaderBytes: defaultHTTPMaxHeaderBytes,
		}},
		Debug:    DebugConfig{Addr: "127.0.0.1:6070"},
		Metrics:  MetricsConfig{Path: "/metrics"},
		Log:      LogConfig{Level: "info", Format: "text", RepeatInterval: service.DefaultWarningInterval},
		Shutdown: ShutdownConfig{Timeout: 10 * time.Second},
		Reload:   ReloadConfig{Debounce: reload.DefaultDebounce},
		Bounds: BoundsConfig{
			MaxRequestBytes: service.DefaultMaxRequestBytes, MaxInflightBytes: service.DefaultMaxInflightBytes,
			Overrides: "allow", OverrideMaxPeriod: time.Duration(limit.Year.Seconds()) * time.Second,
			MaxCalls: defaultGRPCMaxCalls,
		},
		Redis: RedisConfig{
			URL: "redis://127.0.0.1:6379", DialTimeout: redisbackend.DefaultDialTimeout, ReadTimeout: redisbackend.DefaultReadTimeout,
			Timeout: redisbackend.DefaultTimeout, HealthInterval: redisbackend.DefaultHealthInterval, KeyPrefix: redisbackend.DefaultKeyPrefix,
			LocalCacheSize: 65536, Coalesce: 64, Leases: true, LeaseLifetime: 50 * time.Millisecond,
		},
		RLQS: RLQSConfig{
			MaxReportBytes: 1 << 20, TTL: rlqs.DefaultTTL, Tick: rlqs.DefaultTick,
			MaxBuckets: rlqs.DefaultMaxBuckets, MaxStreams: rlqs.DefaultMaxStreams,
			MaxTotalBuckets: rlqs.DefaultMaxTotalBuckets, MaxBucketBytes: rlqs.DefaultMaxBucketBytes,
			MaxProxies: rlqs.DefaultMaxProxiesPerBucket, ReportBudget: rlqs.DefaultReportBudget,
		},
		Stats:       StatsConfig{FlushInterval: 10 * time.Second},
		DecisionLog: DecisionLogConfig{Interval: time.Second},
		XDS:         XDSConfig{NodeID: "default", BackoffInitial: xds.DefaultBackoffInitial, BackoffMax: xds.DefaultBackoffMax},
		Regions: RegionsConfig{
			Safe: regions.SafeZero.String(), Interval: regions.DefaultInterval, Lease: regions.DefaultLease,
			TableLease: regions.DefaultTableLease, Margin: regions.DefaultMargin, MaxKeys: regions.DefaultMaxKeys,
		},

		Backend:              "memory",
		Memory:               MemoryConfig{MaxBytes: backend.DefaultMemoryMaxBytes},
		FailureMode:          "error",
		NearLimitRatio:       0.8,
		DetailedMetricValues: service.DefaultDetailedMetricValues,
		Top:                  TopConfig{Keys: top.DefaultKeys, MaxBytes: top.DefaultMaxBytes},
		ResponseHeaders:      "none",
		HeaderNames: service.LegacyHeaderNames{
			Limit: service.DefaultLimitHeader, Remaining: service.DefaultRemainingHeader, Reset: service.DefaultResetHeader,
		},
	}
}

// fromXDS reports whether the rules come from an xDS server.
func (c Config) fromXDS() bool { return c.XDS.Server != "" }

// rulesOptions are the loader's options, for files and xDS alike.
func (c Config) rulesOptions() descriptors.Options {
	return descriptors.Options{AllFiles: c.Rules.AllFiles, DotFiles: c.Rules.DotFiles, MergeDomains: c.Rules.MergeDomains,
		Overdraft: c.Rules.Overdraft, GlobalDomains: c.Regions.domains()}
}

// memoryOptions are the memory backend's options, for the backend and for failure mode local.
func (c Config) memoryOptions() backend.MemoryOptions {
	return backend.MemoryOptions{MaxBytes: c.Memory.MaxBytes, MaxKeys: c.Memory.MaxKeys}
}

// fromRatelimitEnv says, for an error, which envoyproxy/ratelimit variables gave flag; "" when
// none did.
func (c Config) fromRatelimitEnv(flag string) string {
	for _, st := range c.RatelimitEnv.Applied {
		if st.Flag == flag {
			return " (--" + flag + " from " + st.From + ")"
		}
	}
	return ""
}
