package server

import (
	"crypto/tls"
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

// RLQSConfig is the Rate Limit Quota Service's.
type RLQSConfig struct {
	Enabled        bool          // --rlqs
	MaxReportBytes int           // --rlqs-max-report-bytes
	TTL            time.Duration // --rlqs-assignment-ttl
	Tick           time.Duration // --rlqs-tick
	MaxBuckets     int           // --rlqs-max-buckets
	SubsecondTTLs  bool          // --rlqs-testing-subsecond-ttl
	// The bounds of all streams together.
	MaxStreams      int    // --rlqs-max-streams
	MaxTotalBuckets int    // --rlqs-max-total-buckets
	MaxProxies      int    // --rlqs-max-proxies-per-bucket
	MaxBucketBytes  int64  // --rlqs-max-bucket-bytes
	Domains         string // --rlqs-domains: comma-separated; "": all
}

// startRLQS builds the Rate Limit Quota Service and registers it on g; nil when --rlqs=false.
// With --backend redis, replicas divide each limit through the same Redis and key prefix.
func startRLQS(g *grpc.Server, c Config, svc *service.Service, reg prometheus.Registerer, log *slog.Logger) (*rlqs.Server, error) {
	rc := c.RLQS
	if !rc.Enabled {
		return nil, nil
	}
	var store rlqs.Store
	if c.Backend == "redis" {
		rdb, err := rlqsRedisClient(c.Redis)
		if err != nil {
			return nil, err
		}
		store = rlqs.NewRedis(rdb, c.Redis.KeyPrefix)
	}
	var domains []string
	if rc.Domains != "" {
		for _, d := range strings.Split(rc.Domains, ",") {
			domains = append(domains, strings.TrimSpace(d))
		}
	}
	s, err := rlqs.New(rlqs.Options{
		Rules: svc.Rules, Store: store, TTL: rc.TTL, Tick: rc.Tick, MaxBuckets: rc.MaxBuckets,
		MaxStreams: rc.MaxStreams, MaxTotalBuckets: rc.MaxTotalBuckets, MaxBucketBytes: rc.MaxBucketBytes,
		MaxProxiesPerBucket: rc.MaxProxies, Domains: domains, LogEvery: c.Log.RepeatInterval,
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
func rlqsRedisClient(rc RedisConfig) (goredis.UniversalClient, error) {
	t, err := redisbackend.ParseURL(rc.URL)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	var tlsConf *tls.Config
	if t.TLS {
		host := t.Addrs[0]
		if i := strings.LastIndexByte(host, ':'); i >= 0 {
			host = host[:i]
		}
		if tlsConf, err = clientTLS("--redis-tls-*", rc.TLSCert, rc.TLSKey, rc.TLSCA, host, rc.TLSSkipVerify); err != nil {
			return nil, err
		}
	}
	switch t.Topology {
	case redisbackend.Sentinel:
		return goredis.NewFailoverClient(&goredis.FailoverOptions{
			MasterName: t.Master, SentinelAddrs: t.Addrs, SentinelUsername: t.SentinelUsername, SentinelPassword: t.SentinelPassword,
			Username: t.Username, Password: t.Password, DB: t.DB, TLSConfig: tlsConf,
			DialTimeout: rc.DialTimeout, ReadTimeout: rc.ReadTimeout, WriteTimeout: rc.ReadTimeout, MaxRetries: -1, DisableIdentity: true,
		}), nil
	case redisbackend.Cluster:
		return goredis.NewClusterClient(&goredis.ClusterOptions{
			Addrs: t.Addrs, Username: t.Username, Password: t.Password, TLSConfig: tlsConf,
			DialTimeout: rc.DialTimeout, ReadTimeout: rc.ReadTimeout, WriteTimeout: rc.ReadTimeout, MaxRetries: -1, DisableIdentity: true,
		}), nil
	}
	o, err := goredis.ParseURL(rc.URL)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	if tlsConf != nil {
		o.TLSConfig = tlsConf
	}
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.MaxRetries, o.DisableIdentity = rc.DialTimeout, rc.ReadTimeout, rc.ReadTimeout, -1, true
	return goredis.NewClient(o), nil
}
