package server

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/rls-project/rls/internal/backend"
	redisbackend "github.com/rls-project/rls/internal/backend/redis"
)

// RedisConfig is the Redis backend's (--backend redis), and RLQS's store with it.
type RedisConfig struct {
	URL            string        // --redis-url
	PoolSize       int           // --redis-pool-size; 0: 10 per CPU
	DialTimeout    time.Duration // --redis-dial-timeout
	ReadTimeout    time.Duration // --redis-read-timeout
	Timeout        time.Duration // --redis-timeout
	KeyPrefix      string        // --redis-key-prefix
	LocalCacheSize int           // --redis-local-cache-size
	Coalesce       int           // --redis-coalesce
	ClockOffset    time.Duration // --clock-offset, for tests
	TLSCert        string        // --redis-tls-cert
	TLSKey         string        // --redis-tls-key
	TLSCA          string        // --redis-tls-ca
	TLSSkipVerify  bool          // --redis-tls-skip-hostname-verify
	HealthInterval time.Duration // --redis-health-interval
	Leases         bool          // --redis-leases
	LeaseLifetime  time.Duration // --redis-lease-lifetime
}

// leaseLifetime is the backend's Options.LeaseLifetime: 0 with leases off.
func (rc RedisConfig) leaseLifetime() time.Duration {
	if !rc.Leases {
		return 0
	}
	return rc.LeaseLifetime
}

// now is this process's clock, shifted by --clock-offset.
func (rc RedisConfig) now() func() time.Time {
	if rc.ClockOffset == 0 {
		return time.Now
	}
	off := rc.ClockOffset
	return func() time.Time { return time.Now().Add(off) }
}

// newRedisBackend connects the Redis backend. Redis being down is not an error: the backend
// starts unavailable (its failure mode applies) and recovers when Redis answers.
func newRedisBackend(ctx context.Context, rc RedisConfig, log *slog.Logger) (backend.Backend, error) {
	target, err := redisbackend.ParseURL(rc.URL)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	if rc.TLSCert != "" || rc.TLSKey != "" || rc.TLSCA != "" || rc.TLSSkipVerify {
		if target.TLSConfig, err = clientTLS("--redis-tls-*", rc.TLSCert, rc.TLSKey, rc.TLSCA, "", rc.TLSSkipVerify); err != nil {
			return nil, err
		}
	}
	b, err := redisbackend.New(ctx, redisbackend.Options{
		Target:         target,
		PoolSize:       rc.PoolSize,
		DialTimeout:    rc.DialTimeout,
		ReadTimeout:    rc.ReadTimeout,
		Timeout:        rc.Timeout,
		KeyPrefix:      rc.KeyPrefix,
		LocalCacheSize: rc.LocalCacheSize,
		Coalesce:       rc.Coalesce,
		HealthInterval: rc.HealthInterval,
		LeaseLifetime:  rc.leaseLifetime(),
		Now:            rc.now(),
		Logger:         log.With("backend", "redis"),
	})
	if err != nil {
		return nil, err
	}
	log.Info("redis backend", "redis", target.String(), "timeout", rc.Timeout, "key_prefix", rc.KeyPrefix,
		"local_cache", rc.LocalCacheSize, "coalesce", rc.Coalesce, "lease_lifetime", rc.leaseLifetime(), "healthy", b.Healthy())
	return b, nil
}

// newBackend connects the backend --backend names.
func newBackend(ctx context.Context, c Config, log *slog.Logger) (backend.Backend, error) {
	switch c.Backend {
	case "memory":
		return backend.NewMemory(c.memoryOptions())
	case "redis":
		b, err := newRedisBackend(ctx, c.Redis, log)
		if err != nil {
			return nil, fmt.Errorf("%w%s", err, c.fromRatelimitEnv("redis-url"))
		}
		return b, nil
	}
	return nil, fmt.Errorf("--backend %q: want memory or redis", c.Backend)
}
