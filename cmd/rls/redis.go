package main

import (
	"context"
	"flag"

	"github.com/rls-project/rls/internal/server"
)

// redisFlags registers the Redis backend's flags on fs.
func redisFlags(fs *flag.FlagSet, rc *server.RedisConfig) {
	fs.StringVar(&rc.URL, "redis-url", rc.URL,
		"--backend redis: where Redis is: redis://[user:pass@]host:port[/db] (rediss:// for TLS), "+
			"redis-sentinel://[user:pass@]host:26379,host:26379/master[/db], "+
			"or redis-cluster://[user:pass@]host:port,host:port (rediss-sentinel://, rediss-cluster:// for TLS)")
	fs.IntVar(&rc.PoolSize, "redis-pool-size", rc.PoolSize, "--backend redis: connections per Redis node (0: 10 per CPU)")
	fs.DurationVar(&rc.DialTimeout, "redis-dial-timeout", rc.DialTimeout, "--backend redis: timeout for connecting to Redis")
	fs.DurationVar(&rc.ReadTimeout, "redis-read-timeout", rc.ReadTimeout, "--backend redis: timeout for one socket read or write; a reply slower than this counts as Redis failing")
	fs.DurationVar(&rc.Timeout, "redis-timeout", rc.Timeout,
		"--backend redis: longest a decision waits for Redis before the failure mode applies; a caller's deadline (Envoy's rate limit timeout, 20ms by default) halved (leaving at least 2ms) shortens it")
	fs.DurationVar(&rc.HealthInterval, "redis-health-interval", rc.HealthInterval,
		"--backend redis: how often each Redis master is probed on its own connection and its epoch key read: finds a master that went away while no decision used it, and a Redis that lost its data (a flush, a restart without persistence), which is logged and counted (rls_redis_state_resets_total)")
	fs.StringVar(&rc.KeyPrefix, "redis-key-prefix", rc.KeyPrefix, "--backend redis: prefix of every Redis key")
	fs.IntVar(&rc.LocalCacheSize, "redis-local-cache-size", rc.LocalCacheSize,
		"--backend redis: keys whose denial this process remembers, answering them without Redis until Redis would admit them again (0 disables)")
	fs.IntVar(&rc.Coalesce, "redis-coalesce", rc.Coalesce,
		"--backend redis: gather concurrent decisions into pipelines of up to this many script calls, one pipeline in flight at a time (0: every decision sends its own)")
	fs.BoolVar(&rc.Leases, "redis-leases", rc.Leases,
		"--backend redis: let a hot key lease budget: a lease of hits is charged in Redis with a decision and admits requests on that key here without Redis until it is used or --redis-lease-lifetime has passed; what it did not use is given back. Never admits what Redis did not charge (false: every decision goes to Redis)")
	fs.DurationVar(&rc.LeaseLifetime, "redis-lease-lifetime", rc.LeaseLifetime,
		"--backend redis with --redis-leases: how long a lease admits before what it did not use is given back; a lease is never more than the key's rate restores in it (what a replica killed with a lease holds back)")
	fs.StringVar(&rc.TLSCert, "redis-tls-cert", rc.TLSCert, "--backend redis over TLS (rediss://...): PEM client certificate (with --redis-tls-key)")
	fs.StringVar(&rc.TLSKey, "redis-tls-key", rc.TLSKey, "--backend redis over TLS: PEM client private key")
	fs.StringVar(&rc.TLSCA, "redis-tls-ca", rc.TLSCA, "--backend redis over TLS: PEM CA bundle that verifies Redis (default: the system's roots)")
	fs.BoolVar(&rc.TLSSkipVerify, "redis-tls-skip-hostname-verify", rc.TLSSkipVerify, "--backend redis over TLS: verify Redis's certificate chain but not the name in it")
	fs.DurationVar(&rc.ClockOffset, "clock-offset", rc.ClockOffset, "testing only: shift this process's clock by this much (decisions take their time from Redis)")
}

// quietRedisLogger drops go-redis's own messages (dial retries, pool events): the backend
// reports each availability change once, with its cause. go-redis keeps one logger per
// process, so main, which owns the process, installs it; run never touches it.
type quietRedisLogger struct{}

func (quietRedisLogger) Printf(context.Context, string, ...any) {}
