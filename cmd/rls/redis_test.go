package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestRedisFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want redisConfig
	}{
		{"defaults", nil, nil, redisConfig{url: "redis://127.0.0.1:6379", dialTimeout: time.Second, readTimeout: time.Second,
			timeout: 50 * time.Millisecond, keyPrefix: "rls:", localCacheSize: 65536, coalesce: 64, healthInterval: time.Second}},
		{"flags", []string{"--redis-url", "redis-cluster://a:1,b:2", "--redis-pool-size", "7", "--redis-timeout", "15ms",
			"--redis-key-prefix", "x:", "--redis-local-cache-size", "0", "--redis-coalesce", "0", "--clock-offset", "-3s",
			"--redis-health-interval", "250ms"}, nil,
			redisConfig{url: "redis-cluster://a:1,b:2", poolSize: 7, dialTimeout: time.Second, readTimeout: time.Second,
				timeout: 15 * time.Millisecond, keyPrefix: "x:", clockOffset: -3 * time.Second, healthInterval: 250 * time.Millisecond}},
		{"environment", nil, []string{"RLS_REDIS_URL=redis://h:1", "RLS_REDIS_READ_TIMEOUT=2s", "RLS_REDIS_DIAL_TIMEOUT=3s", "RLS_CLOCK_OFFSET=1h"},
			redisConfig{url: "redis://h:1", dialTimeout: 3 * time.Second, readTimeout: 2 * time.Second,
				timeout: 50 * time.Millisecond, keyPrefix: "rls:", localCacheSize: 65536, coalesce: 64, clockOffset: time.Hour,
				healthInterval: time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			rc := redisFlags(fs)
			if err := parseFlags(fs, tc.args, tc.env); err != nil {
				t.Fatal(err)
			}
			if *rc != tc.want {
				t.Fatalf("got %+v\nwant %+v", *rc, tc.want)
			}
		})
	}
}

func TestClockOffset(t *testing.T) {
	rc := &redisConfig{clockOffset: -90 * time.Second}
	if d := time.Since(rc.now()()); d < 89*time.Second || d > 91*time.Second {
		t.Fatalf("--clock-offset -90s: the clock is %v behind, want 90s", d)
	}
	if d := time.Since((&redisConfig{}).now()()); d < 0 || d > time.Second {
		t.Fatalf("no offset: the clock is %v behind", d)
	}
}

func TestNewRedisBackendBadURL(t *testing.T) {
	_, err := newRedisBackend(context.Background(), &redisConfig{url: "redis-sentinel://h:26379"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "--redis-url") || !strings.Contains(err.Error(), "master name") {
		t.Fatalf("got %v, want an error naming --redis-url and the missing master name", err)
	}
}
