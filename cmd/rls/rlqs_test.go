package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/rlqs"
	"github.com/rls-project/rls/internal/server"
)

func TestRLQSFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want server.RLQSConfig
		err  string // part of the error; "" for none
	}{
		{"defaults: off", nil, nil, server.RLQSConfig{Enabled: false, MaxReportBytes: 1 << 20, TTL: rlqs.DefaultTTL, Tick: rlqs.DefaultTick, MaxBuckets: rlqs.DefaultMaxBuckets, MaxStreams: rlqs.DefaultMaxStreams, MaxTotalBuckets: rlqs.DefaultMaxTotalBuckets, MaxBucketBytes: rlqs.DefaultMaxBucketBytes, MaxProxies: rlqs.DefaultMaxProxiesPerBucket, ReportBudget: rlqs.DefaultReportBudget}, ""},
		{"all set", []string{"--rlqs", "--rlqs-assignment-ttl", "2s", "--rlqs-tick", "100ms", "--rlqs-max-buckets", "7",
			"--rlqs-max-streams", "3", "--rlqs-max-total-buckets", "9", "--rlqs-max-bucket-bytes", "1000", "--rlqs-max-proxies-per-bucket", "4", "--rlqs-domains", "a,b", "--rlqs-max-report-bytes", "4096"}, nil,
			server.RLQSConfig{Enabled: true, MaxReportBytes: 4096, TTL: 2 * time.Second, Tick: 100 * time.Millisecond, MaxBuckets: 7, MaxStreams: 3, MaxTotalBuckets: 9, MaxBucketBytes: 1000, MaxProxies: 4, Domains: "a,b", ReportBudget: rlqs.DefaultReportBudget}, ""},
		{"from the environment", nil, []string{"RLS_RLQS=true", "RLS_RLQS_ASSIGNMENT_TTL=5s", "RLS_RLQS_TICK=1s"}, server.RLQSConfig{Enabled: true, MaxReportBytes: 1 << 20, TTL: 5 * time.Second, Tick: time.Second, MaxBuckets: rlqs.DefaultMaxBuckets, MaxStreams: rlqs.DefaultMaxStreams, MaxTotalBuckets: rlqs.DefaultMaxTotalBuckets, MaxBucketBytes: rlqs.DefaultMaxBucketBytes, MaxProxies: rlqs.DefaultMaxProxiesPerBucket, ReportBudget: rlqs.DefaultReportBudget}, ""},
		{"off", []string{"--rlqs=false", "--rlqs-assignment-ttl", "1500ms"}, nil, server.RLQSConfig{Enabled: false, MaxReportBytes: 1 << 20, TTL: 1500 * time.Millisecond, Tick: rlqs.DefaultTick, MaxBuckets: rlqs.DefaultMaxBuckets, MaxStreams: rlqs.DefaultMaxStreams, MaxTotalBuckets: rlqs.DefaultMaxTotalBuckets, MaxBucketBytes: rlqs.DefaultMaxBucketBytes, MaxProxies: rlqs.DefaultMaxProxiesPerBucket, ReportBudget: rlqs.DefaultReportBudget}, ""},
		{"sub-second ttl", []string{"--rlqs", "--rlqs-assignment-ttl", "300ms"}, nil, server.RLQSConfig{}, "--rlqs-assignment-ttl 300ms: want a whole number of seconds ≥ 1s"},
		{"fractional ttl", []string{"--rlqs", "--rlqs-assignment-ttl", "1.5s"}, nil, server.RLQSConfig{}, "--rlqs-assignment-ttl 1.5s: want a whole number of seconds ≥ 1s"},
		{"sub-second ttl for tests", []string{"--rlqs", "--rlqs-assignment-ttl", "300ms", "--rlqs-testing-subsecond-ttl"}, nil,
			server.RLQSConfig{Enabled: true, MaxReportBytes: 1 << 20, TTL: 300 * time.Millisecond, Tick: rlqs.DefaultTick, MaxBuckets: rlqs.DefaultMaxBuckets, MaxStreams: rlqs.DefaultMaxStreams, MaxTotalBuckets: rlqs.DefaultMaxTotalBuckets, MaxBucketBytes: rlqs.DefaultMaxBucketBytes, MaxProxies: rlqs.DefaultMaxProxiesPerBucket, ReportBudget: rlqs.DefaultReportBudget, SubsecondTTLs: true}, ""},
		{"sub-millisecond ttl for tests", []string{"--rlqs", "--rlqs-assignment-ttl", "500us", "--rlqs-testing-subsecond-ttl"}, nil, server.RLQSConfig{}, "want at least 1ms"},
		{"zero ttl", []string{"--rlqs", "--rlqs-assignment-ttl", "0s"}, nil, server.RLQSConfig{}, "--rlqs-assignment-ttl 0s: want a positive"},
		{"negative ttl", []string{"--rlqs", "--rlqs-assignment-ttl", "-1s", "--rlqs-testing-subsecond-ttl"}, nil, server.RLQSConfig{}, "want a positive"},
		{"zero tick", []string{"--rlqs", "--rlqs-tick", "0s"}, nil, server.RLQSConfig{}, "--rlqs-tick 0s: want a positive duration"},
		{"negative max buckets", []string{"--rlqs", "--rlqs-max-buckets", "-3"}, nil, server.RLQSConfig{}, "--rlqs-max-buckets -3: want at least 1"},
		{"zero streams", []string{"--rlqs", "--rlqs-max-streams", "0"}, nil, server.RLQSConfig{}, "--rlqs-max-streams 0: want at least 1"},
		{"zero total buckets", []string{"--rlqs", "--rlqs-max-total-buckets", "0"}, nil, server.RLQSConfig{}, "--rlqs-max-total-buckets 0: want at least 1"},
		{"negative bucket bytes", []string{"--rlqs", "--rlqs-max-bucket-bytes", "-1"}, nil, server.RLQSConfig{}, "--rlqs-max-bucket-bytes -1: want at least 1"},
		{"zero proxies", []string{"--rlqs", "--rlqs-max-proxies-per-bucket", "0"}, nil, server.RLQSConfig{}, "--rlqs-max-proxies-per-bucket 0: want at least 1"},
		{"empty domain", []string{"--rlqs", "--rlqs-domains", "a,,b"}, nil, server.RLQSConfig{}, `--rlqs-domains "a,,b": an empty domain`},
		{"small report bound", []string{"--rlqs", "--rlqs-max-report-bytes", "100"}, nil, server.RLQSConfig{}, "--rlqs-max-report-bytes 100: want at least 1024"},
		{"budget under a report", []string{"--rlqs", "--rlqs-report-budget-bytes", "4096"}, nil, server.RLQSConfig{}, "--rlqs-report-budget-bytes 4096: want at least --rlqs-max-report-bytes (1048576)"},
		{"negative budget", []string{"--rlqs", "--rlqs-report-budget-bytes", "-1"}, nil, server.RLQSConfig{}, "--rlqs-report-budget-bytes -1: want at least"},
		{"not a duration", []string{"--rlqs-tick", "often"}, nil, server.RLQSConfig{}, "often"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr strings.Builder
			c, err := parseServeFlags(tc.args, tc.env, &stderr)
			if err == nil {
				err = c.Validate()
			}
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
			if c.RLQS != tc.want {
				t.Fatalf("got %+v, want %+v", c.RLQS, tc.want)
			}
		})
	}
}

func TestRLQSValidationErrorsAreUsage(t *testing.T) {
	err := run(context.Background(), []string{"--rlqs", "--rlqs-assignment-ttl", "250ms"}, nil, io.Discard, io.Discard)
	if !errors.Is(err, errUsage) {
		t.Fatalf("got %v, want a usage error", err)
	}
}
