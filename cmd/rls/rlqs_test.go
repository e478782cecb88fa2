package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"

	"github.com/rls-project/rls/internal/rlqs"
)

func TestRLQSFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want rlqsConfig
		err  string // part of the error; "" for none
	}{
		{"defaults: off", nil, nil, rlqsConfig{enabled: false, maxReportBytes: 1 << 20, ttl: rlqs.DefaultTTL, tick: rlqs.DefaultTick, maxBuckets: rlqs.DefaultMaxBuckets, maxStreams: rlqs.DefaultMaxStreams, maxTotalBuckets: rlqs.DefaultMaxTotalBuckets, maxBucketBytes: rlqs.DefaultMaxBucketBytes, maxProxies: rlqs.DefaultMaxProxiesPerBucket}, ""},
		{"all set", []string{"--rlqs", "--rlqs-assignment-ttl", "2s", "--rlqs-tick", "100ms", "--rlqs-max-buckets", "7",
			"--rlqs-max-streams", "3", "--rlqs-max-total-buckets", "9", "--rlqs-max-bucket-bytes", "1000", "--rlqs-max-proxies-per-bucket", "4", "--rlqs-domains", "a,b", "--rlqs-max-report-bytes", "4096"}, nil,
			rlqsConfig{enabled: true, maxReportBytes: 4096, ttl: 2 * time.Second, tick: 100 * time.Millisecond, maxBuckets: 7, maxStreams: 3, maxTotalBuckets: 9, maxBucketBytes: 1000, maxProxies: 4, domains: "a,b"}, ""},
		{"from the environment", nil, []string{"RLS_RLQS=true", "RLS_RLQS_ASSIGNMENT_TTL=5s", "RLS_RLQS_TICK=1s"}, rlqsConfig{enabled: true, maxReportBytes: 1 << 20, ttl: 5 * time.Second, tick: time.Second, maxBuckets: rlqs.DefaultMaxBuckets, maxStreams: rlqs.DefaultMaxStreams, maxTotalBuckets: rlqs.DefaultMaxTotalBuckets, maxBucketBytes: rlqs.DefaultMaxBucketBytes, maxProxies: rlqs.DefaultMaxProxiesPerBucket}, ""},
		{"off", []string{"--rlqs=false", "--rlqs-assignment-ttl", "1500ms"}, nil, rlqsConfig{enabled: false, maxReportBytes: 1 << 20, ttl: 1500 * time.Millisecond, tick: rlqs.DefaultTick, maxBuckets: rlqs.DefaultMaxBuckets, maxStreams: rlqs.DefaultMaxStreams, maxTotalBuckets: rlqs.DefaultMaxTotalBuckets, maxBucketBytes: rlqs.DefaultMaxBucketBytes, maxProxies: rlqs.DefaultMaxProxiesPerBucket}, ""},
		{"sub-second ttl", []string{"--rlqs", "--rlqs-assignment-ttl", "300ms"}, nil, rlqsConfig{}, "--rlqs-assignment-ttl 300ms: want a whole number of seconds ≥ 1s"},
		{"fractional ttl", []string{"--rlqs", "--rlqs-assignment-ttl", "1.5s"}, nil, rlqsConfig{}, "--rlqs-assignment-ttl 1.5s: want a whole number of seconds ≥ 1s"},
		{"sub-second ttl for tests", []string{"--rlqs", "--rlqs-assignment-ttl", "300ms", "--rlqs-testing-subsecond-ttl"}, nil,
			rlqsConfig{enabled: true, maxReportBytes: 1 << 20, ttl: 300 * time.Millisecond, tick: rlqs.DefaultTick, maxBuckets: rlqs.DefaultMaxBuckets, maxStreams: rlqs.DefaultMaxStreams, maxTotalBuckets: rlqs.DefaultMaxTotalBuckets, maxBucketBytes: rlqs.DefaultMaxBucketBytes, maxProxies: rlqs.DefaultMaxProxiesPerBucket, subsecondTTLs: true}, ""},
		{"sub-millisecond ttl for tests", []string{"--rlqs", "--rlqs-assignment-ttl", "500us", "--rlqs-testing-subsecond-ttl"}, nil, rlqsConfig{}, "want at least 1ms"},
		{"zero ttl", []string{"--rlqs", "--rlqs-assignment-ttl", "0s"}, nil, rlqsConfig{}, "--rlqs-assignment-ttl 0s: want a positive"},
		{"negative ttl", []string{"--rlqs", "--rlqs-assignment-ttl", "-1s", "--rlqs-testing-subsecond-ttl"}, nil, rlqsConfig{}, "want a positive"},
		{"zero tick", []string{"--rlqs", "--rlqs-tick", "0s"}, nil, rlqsConfig{}, "--rlqs-tick 0s: want a positive duration"},
		{"negative max buckets", []string{"--rlqs", "--rlqs-max-buckets", "-3"}, nil, rlqsConfig{}, "--rlqs-max-buckets -3: want at least 1"},
		{"zero streams", []string{"--rlqs", "--rlqs-max-streams", "0"}, nil, rlqsConfig{}, "--rlqs-max-streams 0: want at least 1"},
		{"zero total buckets", []string{"--rlqs", "--rlqs-max-total-buckets", "0"}, nil, rlqsConfig{}, "--rlqs-max-total-buckets 0: want at least 1"},
		{"negative bucket bytes", []string{"--rlqs", "--rlqs-max-bucket-bytes", "-1"}, nil, rlqsConfig{}, "--rlqs-max-bucket-bytes -1: want at least 1"},
		{"zero proxies", []string{"--rlqs", "--rlqs-max-proxies-per-bucket", "0"}, nil, rlqsConfig{}, "--rlqs-max-proxies-per-bucket 0: want at least 1"},
		{"empty domain", []string{"--rlqs", "--rlqs-domains", "a,,b"}, nil, rlqsConfig{}, `--rlqs-domains "a,,b": an empty domain`},
		{"small report bound", []string{"--rlqs", "--rlqs-max-report-bytes", "100"}, nil, rlqsConfig{}, "--rlqs-max-report-bytes 100: want at least 1024"},
		{"not a duration", []string{"--rlqs-tick", "often"}, nil, rlqsConfig{}, "often"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr strings.Builder
			c, err := parseServeFlags(tc.args, tc.env, &stderr)
			if tc.err != "" {
				// The flag package prints what it finds itself; rls's own checks return it.
				if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.err) {
					t.Fatalf("got %v (printed %q), want an error containing %q", err, stderr.String(), tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *c.rlqs != tc.want {
				t.Fatalf("got %+v, want %+v", *c.rlqs, tc.want)
			}
		})
	}
}

func TestRLQSValidationErrorsAreUsage(t *testing.T) {
	_, err := parseServeFlags([]string{"--rlqs", "--rlqs-assignment-ttl", "250ms"}, nil, io.Discard)
	if !errors.Is(err, errUsage) {
		t.Fatalf("got %v, want a usage error", err)
	}
}

// panickyQuota is a Rate Limit Quota Service whose stream handler panics.
type panickyQuota struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
}

func (panickyQuota) StreamRateLimitQuotas(rlqspb.RateLimitQuotaService_StreamRateLimitQuotasServer) error {
	var m map[string]int
	m["boom"]++ // a nil map write: a runtime panic
	return nil
}
