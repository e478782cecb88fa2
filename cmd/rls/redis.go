package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/rls-project/rls/internal/backend"
	redisbackend "github.com/rls-project/rls/internal/backend/redis"
)

// redisConfig holds the Redis backend's flags.
type redisConfig struct {
	url            string
	poolSize       int
	dialTimeout    time.Duration
	readTimeout    time.Duration
	timeout        time.Duration
	keyPrefix      string
	localCacheSize int
	coalesce       int
	clockOffset    time.Duration
	tlsCert        string
	tlsKey         string
	tlsCA          string
	tlsSkipVerify  bool
	healthInterval time.Duration
}

// redisFlags registers the Redis backend's flags on fs.
func redisFlags(fs *flag.FlagSet) *redisConfig {
	rc := &redisConfig{}
	fs.StringVar(&rc.url, "redis-url", "redis://127.0.0.1:6379",
		"--backend redis: where Redis is: redis://[user:pass@]host:port[/db] (rediss:// for TLS), "+
			"redis-sentinel://[user:pass@]host:26379,host:26379/master[/db], "+
			"or redis-cluster://[user:pass@]host:port,host:port (rediss-sentinel://, rediss-cluster:// for TLS)")
	fs.IntVar(&rc.poolSize, "redis-pool-size", 0, "--backend redis: connections per Redis node (0: 10 per CPU)")
	fs.DurationVar(&rc.dialTimeout, "redis-dial-timeout", time.Second, "--backend redis: timeout for connecting to Redis")
	fs.DurationVar(&rc.readTimeout, "redis-read-timeout", time.Second, "--backend redis: timeout for one socket read or write; a reply slower than this counts as Redis failing")
	fs.DurationVar(&rc.timeout, "redis-timeout", 50*time.Millisecond,
		"--backend redis: longest a decision waits for Redis before the failure mode applies; a caller's deadline (Envoy's rate limit timeout, 20ms by default) halved (leaving at least 2ms) shortens it")
	fs.DurationVar(&rc.healthInterval, "redis-health-interval", time.Second,
		"--backend redis: how often each Redis master is probed on its own connection and its epoch key read: finds a master that went away while no decision used it, and a Redis that lost its data (a flush, a restart without persistence), which is logged and counted (rls_redis_state_resets_total)")
	fs.StringVar(&rc.keyPrefix, "redis-key-prefix", "rls:", "--backend redis: prefix of every Redis key")
	fs.IntVar(&rc.localCacheSize, "redis-local-cache-size", 65536,
		"--backend redis: keys whose denial this process remembers, answering them without Redis until Redis would admit them again (0 disables)")
	fs.IntVar(&rc.coalesce, "redis-coalesce", 64,
		"--backend redis: gather concurrent decisions into pipelines of up to this many script calls, one pipeline in flight at a time (0: every decision sends its own)")
	fs.StringVar(&rc.tlsCert, "redis-tls-cert", "", "--backend redis over TLS (rediss://...): PEM client certificate (with --redis-tls-key)")
	fs.StringVar(&rc.tlsKey, "redis-tls-key", "", "--backend redis over TLS: PEM client private key")
	fs.StringVar(&rc.tlsCA, "redis-tls-ca", "", "--backend redis over TLS: PEM CA bundle that verifies Redis (default: the system's roots)")
	fs.BoolVar(&rc.tlsSkipVerify, "redis-tls-skip-hostname-verify", false, "--backend redis over TLS: verify Redis's certificate chain but not the name in it")
	fs.DurationVar(&rc.clockOffset, "clock-offset", 0, "testing only: shift this process's clock by this much (decisions take their time from Redis)")
	return rc
}

// now is this process's clock, shifted by --clock-offset.
func (rc *redisConfig) now() func() time.Time {
	if rc == nil || rc.clockOffset == 0 {
		return time.Now
	}
	off := rc.clockOffset
	return func() time.Time { return time.Now().Add(off) }
}

// quietRedisLogger drops go-redis's own messages (dial retries, pool events): the backend
// reports each availability change once, with its cause. go-redis keeps one logger per
// process, so main, which owns the process, installs it; run never touches it.
type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}

// newRedisBackend connects the Redis backend. Redis being down is not an error: the backend
// starts unavailable (its failure mode applies) and recovers when Redis answers.
func newRedisBackend(ctx context.Context, rc *redisConfig, log *slog.Logger) (backend.Backend, error) {
	target, err := redisbackend.ParseURL(rc.url)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	if rc.healthInterval <= 0 {
		return nil, fmt.Errorf("--redis-health-interval %v: want a positive duration (1s by default)", rc.healthInterval)
	}
	if rc.tlsCert != "" || rc.tlsKey != "" || rc.tlsCA != "" || rc.tlsSkipVerify {
		if !target.TLS {
			return nil, errors.New("--redis-tls-* need TLS: a rediss://, rediss-sentinel:// or rediss-cluster:// --redis-url")
		}
		if target.TLSConfig, err = clientTLS("--redis-tls-*", rc.tlsCert, rc.tlsKey, rc.tlsCA, "", rc.tlsSkipVerify); err != nil {
			return nil, err
		}
	}
	b, err := redisbackend.New(ctx, redisbackend.Options{
		Target:         target,
		PoolSize:       rc.poolSize,
		DialTimeout:    rc.dialTimeout,
		ReadTimeout:    rc.readTimeout,
		Timeout:        rc.timeout,
		KeyPrefix:      rc.keyPrefix,
		LocalCacheSize: rc.localCacheSize,
		Coalesce:       rc.coalesce,
		HealthInterval: rc.healthInterval,
		Now:            rc.now(),
		Logger:         log.With("backend", "redis"),
	})
	if err != nil {
		return nil, err
	}
	log.Info("redis backend", "redis", target.String(), "timeout", rc.timeout, "key_prefix", rc.keyPrefix,
		"local_cache", rc.localCacheSize, "coalesce", rc.coalesce, "healthy", b.Healthy())
	return b, nil
}
