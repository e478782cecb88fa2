package main

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/server"
)

func TestRedisFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want server.RedisConfig
	}{
		{"defaults", nil, nil, server.RedisConfig{URL: "redis://127.0.0.1:6379", DialTimeout: time.Second, ReadTimeout: time.Second,
			Timeout: 50 * time.Millisecond, KeyPrefix: "rls:", LocalCacheSize: 65536, Coalesce: 64, HealthInterval: time.Second,
			Leases: true, LeaseLifetime: 50 * time.Millisecond}},
		{"flags", []string{"--redis-url", "redis-cluster://a:1,b:2", "--redis-pool-size", "7", "--redis-timeout", "15ms",
			"--redis-key-prefix", "x:", "--redis-local-cache-size", "0", "--redis-coalesce", "0", "--clock-offset", "-3s",
			"--redis-health-interval", "250ms", "--redis-leases=false", "--redis-lease-lifetime", "20ms"}, nil,
			server.RedisConfig{URL: "redis-cluster://a:1,b:2", PoolSize: 7, DialTimeout: time.Second, ReadTimeout: time.Second,
				Timeout: 15 * time.Millisecond, KeyPrefix: "x:", ClockOffset: -3 * time.Second, HealthInterval: 250 * time.Millisecond,
				LeaseLifetime: 20 * time.Millisecond}},
		{"environment", nil, []string{"RLS_REDIS_URL=redis://h:1", "RLS_REDIS_READ_TIMEOUT=2s", "RLS_REDIS_DIAL_TIMEOUT=3s", "RLS_CLOCK_OFFSET=1h"},
			server.RedisConfig{URL: "redis://h:1", DialTimeout: 3 * time.Second, ReadTimeout: 2 * time.Second,
				Timeout: 50 * time.Millisecond, KeyPrefix: "rls:", LocalCacheSize: 65536, Coalesce: 64, ClockOffset: time.Hour,
				HealthInterval: time.Second, Leases: true, LeaseLifetime: 50 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			rc := server.DefaultConfig().Redis
			redisFlags(fs, &rc)
			if _, err := parseFlags(fs, tc.args, tc.env); err != nil {
				t.Fatal(err)
			}
			if rc != tc.want {
				t.Fatalf("got %+v\nwant %+v", rc, tc.want)
			}
		})
	}
}
