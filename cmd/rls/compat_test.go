package main

import (
	"context"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
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
		want func(c serveConfig) string // "" when as wanted
	}{
		{"the environment applies", nil, nil, func(c serveConfig) string {
			if c.backend != "redis" || c.redis.url != "redis://r1:6379" || c.nearLimitRatio != 0.5 || c.grpcAddr != "0.0.0.0:9000" || !c.shadowMode {
				return "not applied"
			}
			return ""
		}},
		{"RLS_* wins", nil, []string{"RLS_REDIS_URL=redis://r2:6379", "RLS_SHADOW_MODE=false"}, func(c serveConfig) string {
			if c.redis.url != "redis://r2:6379" || c.shadowMode || c.backend != "redis" {
				return "RLS_* lost"
			}
			return ""
		}},
		{"a flag wins", []string{"--near-limit-ratio", "0.9", "--backend", "memory"}, []string{"RLS_NEAR_LIMIT_RATIO=0.7"}, func(c serveConfig) string {
			if c.nearLimitRatio != 0.9 || c.backend != "memory" || c.redis.url != "redis://r1:6379" {
				return "the flag lost"
			}
			return ""
		}},
		{"--ratelimit-env=false", []string{"--ratelimit-env=false"}, nil, func(c serveConfig) string {
			if c.backend != "memory" || c.nearLimitRatio != 0.8 || c.shadowMode || len(c.compat.Present) != 0 {
				return "the environment was read"
			}
			return ""
		}},
		{"RLS_RATELIMIT_ENV=false", nil, []string{"RLS_RATELIMIT_ENV=false"}, func(c serveConfig) string {
			if c.backend != "memory" {
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
				t.Errorf("%s: backend %s, url %s, ratio %v, grpc %s, shadow %v", why, c.backend, c.redis.url, c.nearLimitRatio, c.grpcAddr, c.shadowMode)
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
	c.logRatelimitEnv(slog.New(slog.NewTextHandler(&log, nil)))
	for _, want := range []string{"envoyproxy/ratelimit environment found", "flag=--near-limit-ratio", "overridden by rls's own\" flag=--backend", "variable=USE_STATSD"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log.String())
		}
	}
}

// TestMetricsAddrAndHealthcheck: --metrics-addr serves the metrics at --metrics-path, and
// /healthcheck says what /readyz says, as envoyproxy/ratelimit's probe expects it.
func TestMetricsAddrAndHealthcheck(t *testing.T) {
	c := testConfig(t, "--metrics-addr", "127.0.0.1:0", "--metrics-path", "/stats/prometheus")
	s, err := newServer(context.Background(), c, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	s.ready.healthcheck(rec, httptest.NewRequest("GET", "/healthcheck", nil))
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), "starting") {
		t.Errorf("/healthcheck before start: %d %q, want 500 starting", rec.Code, rec.Body.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.shutdown(s.run(ctx)) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		code, body := httpGet(t, "http://"+s.httpL.Addr().String()+"/healthcheck")
		if code == 200 && body == "OK" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/healthcheck: %d %q", code, body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if code, body := httpGet(t, "http://"+s.metricsL.Addr().String()+"/stats/prometheus"); code != 200 || !strings.Contains(body, "rls_config_generation") {
		t.Errorf("metrics listener: %d, %d bytes", code, len(body))
	}
	if code, _ := httpGet(t, "http://"+s.metricsL.Addr().String()+"/json"); code != 404 {
		t.Errorf("metrics listener serves /json: %d", code)
	}
}

// TestClientSAN: --grpc-tls-client-san needs client certificates, and accepts one that names
// it among its DNS names, URIs, e-mail addresses or IPs.
func TestClientSAN(t *testing.T) {
	if _, err := grpcCredentials(testConfig(t, "--grpc-tls-client-san", "x")); err == nil {
		t.Error("--grpc-tls-client-san without --grpc-tls-client-ca: no error")
	}
	u, _ := url.Parse("spiffe://cluster.local/ns/gw/sa/envoy")
	cert := &x509.Certificate{DNSNames: []string{"envoy.gw.svc"}, URIs: []*url.URL{u},
		EmailAddresses: []string{"ops@example.com"}, IPAddresses: []net.IP{net.ParseIP("10.0.0.7")}}
	for san, want := range map[string]bool{
		"envoy.gw.svc": true, "spiffe://cluster.local/ns/gw/sa/envoy": true, "ops@example.com": true, "10.0.0.7": true,
		"other.gw.svc": false, "envoy": false, "10.0.0.8": false, "": false,
	} {
		if got := hasSAN(cert, san); got != want {
			t.Errorf("hasSAN(%q) = %v, want %v", san, got, want)
		}
	}
}
