package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc"

	redisbackend "github.com/rls-project/rls/internal/backend/redis"
	"github.com/rls-project/rls/internal/rlqs"
	"github.com/rls-project/rls/internal/service"
)

// rlqsConfig holds the Rate Limit Quota Service's flags.
type rlqsConfig struct {
	enabled        bool
	maxReportBytes int
	ttl            time.Duration
	tick           time.Duration
	maxBuckets     int
	subsecondTTLs  bool
	// The bounds of all streams together.
	maxStreams, maxTotalBuckets, maxProxies int
	maxBucketBytes                          int64
	domains                                 string // comma-separated; "": all
}

// rlqsFlags registers the Rate Limit Quota Service's flags on fs.
func rlqsFlags(fs *flag.FlagSet) *rlqsConfig {
	rc := &rlqsConfig{}
	fs.BoolVar(&rc.enabled, "rlqs", false, "serve Envoy's Rate Limit Quota Service (StreamRateLimitQuotas, for the rate_limit_quota filter) on --grpc-addr; off unless asked for, as a ShouldRateLimit deployment needs none of it")
	fs.IntVar(&rc.maxReportBytes, "rlqs-max-report-bytes", 1<<20,
		"RLQS: largest usage report accepted (a larger one ends its stream with RESOURCE_EXHAUSTED). gRPC bounds every method's messages alike, so with --rlqs this is also the bound to which a ShouldRateLimit message is read before --max-request-bytes refuses it")
	fs.DurationVar(&rc.ttl, "rlqs-assignment-ttl", rlqs.DefaultTTL,
		"RLQS: time to live of every quota assignment: how long a proxy enforces its share without hearing from rls, and how long a vanished proxy's share stays held (a few of the filter's reporting intervals)")
	fs.DurationVar(&rc.tick, "rlqs-tick", rlqs.DefaultTick,
		"RLQS: how often each stream's shares are decided again between reports; the share of a proxy alone in its bucket and at its target only every quarter of the TTL (at most 1s); a share released or wanted wakes the proxies concerned at once")
	fs.IntVar(&rc.maxBuckets, "rlqs-max-buckets", rlqs.DefaultMaxBuckets, "RLQS: most buckets one stream may report (more ends the stream with RESOURCE_EXHAUSTED)")
	fs.IntVar(&rc.maxStreams, "rlqs-max-streams", rlqs.DefaultMaxStreams,
		"RLQS: most streams open at once on this replica, whoever opens them (one more is refused with RESOURCE_EXHAUSTED)")
	fs.IntVar(&rc.maxTotalBuckets, "rlqs-max-total-buckets", rlqs.DefaultMaxTotalBuckets,
		"RLQS: most buckets of all streams together (a bucket on two streams counts twice); a report that would add one more ends its stream with RESOURCE_EXHAUSTED")
	fs.Int64Var(&rc.maxBucketBytes, "rlqs-max-bucket-bytes", rlqs.DefaultMaxBucketBytes,
		"RLQS: most bytes of the distinct bucket ids of all streams together (each id is kept once); a report that would pass it ends its stream with RESOURCE_EXHAUSTED")
	fs.IntVar(&rc.maxProxies, "rlqs-max-proxies-per-bucket", rlqs.DefaultMaxProxiesPerBucket,
		"RLQS: most proxies (streams, on every replica sharing Redis) one bucket's limit is divided among; one more ends its stream with RESOURCE_EXHAUSTED")
	fs.StringVar(&rc.domains, "rlqs-domains", "",
		"RLQS: the only domains served, comma-separated (default: every domain); a stream naming another ends with PERMISSION_DENIED")
	fs.BoolVar(&rc.subsecondTTLs, "rlqs-testing-subsecond-ttl", false,
		"RLQS, for tests only: accept a --rlqs-assignment-ttl that is not a whole number of seconds (Envoy reads it in whole seconds: a 300ms TTL expires at once there)")
	return rc
}

// validate checks the RLQS flags. Envoy's filter reads an assignment's time to live in whole
// seconds (the nanos are dropped), so a TTL under a second would expire every assignment as it
// arrives and a fractional one would expire it before rls stops counting it held: both are refused
// unless --rlqs-testing-subsecond-ttl.
func (rc *rlqsConfig) validate() error {
	if rc == nil || !rc.enabled {
		return nil
	}
	switch {
	case rc.maxReportBytes < 1024:
		return fmt.Errorf("%w: --rlqs-max-report-bytes %d: want at least 1024", errUsage, rc.maxReportBytes)
	case rc.ttl <= 0:
		return fmt.Errorf("%w: --rlqs-assignment-ttl %v: want a positive whole number of seconds", errUsage, rc.ttl)
	case !rc.subsecondTTLs && (rc.ttl < time.Second || rc.ttl%time.Second != 0):
		return fmt.Errorf("%w: --rlqs-assignment-ttl %v: want a whole number of seconds ≥ 1s (Envoy reads the assignment's time to live in whole seconds)", errUsage, rc.ttl)
	case rc.ttl < time.Millisecond:
		return fmt.Errorf("%w: --rlqs-assignment-ttl %v: want at least 1ms", errUsage, rc.ttl)
	case rc.tick <= 0:
		return fmt.Errorf("%w: --rlqs-tick %v: want a positive duration", errUsage, rc.tick)
	case rc.maxBuckets <= 0:
		return fmt.Errorf("%w: --rlqs-max-buckets %d: want at least 1", errUsage, rc.maxBuckets)
	case rc.maxStreams <= 0:
		return fmt.Errorf("%w: --rlqs-max-streams %d: want at least 1", errUsage, rc.maxStreams)
	case rc.maxTotalBuckets <= 0:
		return fmt.Errorf("%w: --rlqs-max-total-buckets %d: want at least 1", errUsage, rc.maxTotalBuckets)
	case rc.maxBucketBytes <= 0:
		return fmt.Errorf("%w: --rlqs-max-bucket-bytes %d: want at least 1", errUsage, rc.maxBucketBytes)
	case rc.maxProxies <= 0:
		return fmt.Errorf("%w: --rlqs-max-proxies-per-bucket %d: want at least 1", errUsage, rc.maxProxies)
	}
	for _, d := range strings.Split(rc.domains, ",") {
		if rc.domains != "" && strings.TrimSpace(d) == "" {
			return fmt.Errorf("%w: --rlqs-domains %q: an empty domain", errUsage, rc.domains)
		}
	}
	return nil
}

// startRLQS builds the Rate Limit Quota Service and registers it on g; nil when --rlqs=false.
// With --backend redis, replicas divide each limit through the same Redis and key prefix.
func startRLQS(g *grpc.Server, c serveConfig, svc *service.Service, reg prometheus.Registerer, log *slog.Logger) (*rlqs.Server, error) {
	rc := c.rlqs
	if rc == nil || !rc.enabled {
		return nil, nil
	}
	if err := rc.validate(); err != nil {
		return nil, err
	}
	var store rlqs.Store
	if c.backend == "redis" {
		rdb, err := rlqsRedisClient(c.redis)
		if err != nil {
			return nil, err
		}
		store = rlqs.NewRedis(rdb, c.redis.keyPrefix)
	}
	var domains []string
	if rc.domains != "" {
		for _, d := range strings.Split(rc.domains, ",") {
			domains = append(domains, strings.TrimSpace(d))
		}
	}
	s, err := rlqs.New(rlqs.Options{
		Rules: svc.Rules, Store: store, TTL: rc.ttl, Tick: rc.tick, MaxBuckets: rc.maxBuckets,
		MaxStreams: rc.maxStreams, MaxTotalBuckets: rc.maxTotalBuckets, MaxBucketBytes: rc.maxBucketBytes,
		MaxProxiesPerBucket: rc.maxProxies, Domains: domains, LogEvery: c.logRepeat,
		Registerer: reg, Logger: log.With("service", "rlqs"),
	})
	if err != nil {
		if store != nil {
			store.Close()
		}
		return nil, err
	}
	rlqspb.RegisterRateLimitQuotaServiceServer(g, s)
	return s, nil
}

// mountRLQS serves the RLQS debug pages on mux: /debug/rlqs and /debug/rlqs/explain.
func mountRLQS(mux *http.ServeMux, s *rlqs.Server) {
	if s == nil {
		return
	}
	mux.Handle("GET /debug/rlqs", s.AssignmentsHandler())
	mux.Handle("GET /debug/rlqs/explain", s.ExplainHandler())
}

// rlqsRedisClient connects to the Redis of --redis-url for the shares, with the backend's TLS
// flags. Commands are not retried: a transaction whose reply was lost is decided again anyway.
func rlqsRedisClient(rc *redisConfig) (goredis.UniversalClient, error) {
	t, err := redisbackend.ParseURL(rc.url)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	var tlsConf *tls.Config
	if t.TLS {
		host := t.Addrs[0]
		if i := strings.LastIndexByte(host, ':'); i >= 0 {
			host = host[:i]
		}
		if tlsConf, err = clientTLS("--redis-tls-*", rc.tlsCert, rc.tlsKey, rc.tlsCA, host, rc.tlsSkipVerify); err != nil {
			return nil, err
		}
	}
	switch t.Topology {
	case redisbackend.Sentinel:
		return goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName: t.Master, SentinelAddrs: t.Addrs, SentinelUsername: t.SentinelUsername, SentinelPassword: t.SentinelPassword,
			Username: t.Username, Password: t.Password, DB: t.DB, TLSConfig: tlsConf,
			DialTimeout: rc.dialTimeout, ReadTimeout: rc.readTimeout, WriteTimeout: rc.readTimeout, MaxRetries: -1, DisableIdentity: true,
		}), nil
	case redisbackend.Cluster:
		return goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs: t.Addrs, Username: t.Username, Password: t.Password, TLSConfig: tlsConf,
			DialTimeout: rc.dialTimeout, ReadTimeout: rc.readTimeout, WriteTimeout: rc.readTimeout, MaxRetries: -1, DisableIdentity: true,
		}), nil
	}
	o, err := goredis.ParseURL(rc.url)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	if tlsConf != nil {
		o.TLSConfig = tlsConf
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries, o.DisableIdentity = rc.dialTimeout, rc.readTimeout, rc.readTimeout, -1, true
	return goredis.NewClient(o), nil
}
