package main

import (
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/rls-project/rls/internal/server"
)

// TestRatelimitEnvPrecedence: rls's flags win over its RLS_* variables, which win over
// envoyproxy/ratelimit's; --ratelimit-env=false ignores the last.
func TestRatelimitEnvPrecedence(t *testing.T) {
	env := []string{"USE_STATSD=false", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=r1:6379", "NEAR_LIMIT_RATIO=0.5",
		"GRPC_PORT=9000", "SHADOW_MODE=true"}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want func(c server.Config) string // "" when as wanted
	}{
		{"the environment applies", nil, nil, func(c server.Config) string {
			if c.Backend != "redis" || c.Redis.URL != "redis://r1:6379" || c.NearLimitRatio != 0.5 || c.GRPC.Addr != "0.0.0.0:9000" || !c.ShadowMode {
				return "not applied"
			}
			return ""
		}},
		{"RLS_* wins", nil, []string{"RLS_REDIS_URL=redis://r2:6379", "RLS_SHADOW_MODE=false"}, func(c server.Config) string {
			if c.Redis.URL != "redis://r2:6379" || c.ShadowMode || c.Backend != "redis" {
				return "RLS_* lost"
			}
			return ""
		}},
		{"a flag wins", []string{"--near-limit-ratio", "0.9", "--backend", "memory"}, []string{"RLS_NEAR_LIMIT_RATIO=0.7"}, func(c server.Config) string {
			if c.NearLimitRatio != 0.9 || c.Backend != "memory" || c.Redis.URL != "redis://r1:6379" {
				return "the flag lost"
			}
			return ""
		}},
		{"--ratelimit-env=false", []string{"--ratelimit-env=false"}, nil, func(c server.Config) string {
			if c.Backend != "memory" || c.NearLimitRatio != 0.8 || c.ShadowMode || len(c.RatelimitEnv.Result.Present) != 0 {
				return "the environment was read"
			}
			return ""
		}},
		{"RLS_RATELIMIT_ENV=false", nil, []string{"RLS_RATELIMIT_ENV=false"}, func(c server.Config) string {
			if c.Backend != "memory" {
				return "the environment was read"
			}
			return ""
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseServeFlags(tc.args, append(append([]string{}, env...), tc.env...), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if why := tc.want(c); why != "" {
				t.Errorf("%s: backend %s, url %s, ratio %v, grpc %s, shadow %v", why, c.Backend, c.Redis.URL, c.NearLimitRatio, c.GRPC.Addr, c.ShadowMode)
			}
		})
	}
	// A bad value stops rls, naming the variable.
	_, err := parseServeFlags(nil, []string{"USE_STATSD=false", "NEAR_LIMIT_RATIO=lots"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "NEAR_LIMIT_RATIO") {
		t.Errorf("bad NEAR_LIMIT_RATIO: %v", err)
	}
	// Logged at start: what applied, what was overridden, what rls does instead.
	c, err := parseServeFlags([]string{"--backend", "memory"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	c.RatelimitEnv.Log(slog.New(slog.NewTextHandler(&log, nil)))
	for _, want := range []string{"envoyproxy/ratelimit environment found", "flag=--near-limit-ratio", "overridden by rls's own\" flag=--backend", "variable=USE_STATSD"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
}
