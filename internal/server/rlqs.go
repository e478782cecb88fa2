package server

import (
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
	// ReportBudget bounds the bytes of the reports of all streams decoded and taken in at once
	// (--rlqs-report-budget-bytes; 0: rlqs.DefaultReportBudget).
	ReportBudget int64
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
		rdb, err := redisClient(c.Redis.URL, c.Redis, "--redis-url")
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
		MaxProxiesPerBucket: rc.MaxProxies, Domains: domains, ReportBudget: rc.ReportBudget, LogEvery: c.Log.RepeatInterval,
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

// redisClient connects to the Redis of url (given by flag) for a user other than the decisions
// (RLQS's shares, the regions' coordination), with the backend's TLS flags and the dial settings
// of every client of the backend (redisbackend.NewClient): replies bounded, one dial per
// attempt. Commands are not retried: their users decide again when a reply is lost.
func redisClient(url string, rc RedisConfig, flag string) (goredis.UniversalClient, error) {
	t, err := redisbackend.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if rc.TLSCert != "" || rc.TLSKey != "" || rc.TLSCA != "" || rc.TLSSkipVerify {
		if t.TLSConfig, err = clientTLS("--redis-tls-*", rc.TLSCert, rc.TLSKey, rc.TLSCA, "", rc.TLSSkipVerify); err != nil {
			return nil, err
		}
	}
	return redisbackend.NewClient(t, rc.DialTimeout, rc.ReadTimeout), nil
}
