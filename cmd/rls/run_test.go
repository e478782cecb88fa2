package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRunUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"unknown command", []string{"frobnicate"}, nil, `unknown command "frobnicate"`},
		{"unknown flag", []string{"--nope"}, nil, "flag provided but not defined: --nope"},
		{"bad env value", nil, []string{"RLS_SHUTDOWN_TIMEOUT=soon"}, `RLS_SHUTDOWN_TIMEOUT="soon"`},
		{"validate without path", []string{"validate"}, nil, "usage: rls validate PATH"},
		{"stray argument", []string{"--log-level", "info", "extra"}, nil, `unexpected arguments ["extra"]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			err := run(context.Background(), tc.args, tc.env, io.Discard, &stderr)
			if err == nil || !strings.Contains(err.Error()+stderr.String(), tc.want) {
				t.Fatalf("err %v, stderr %q; want %q", err, stderr.String(), tc.want)
			}
		})
	}
}

func TestRunConfigErrors(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: eon, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad rules", []string{"--config", bad}, bad + `:4: domain "d": descriptor k: unit "eon"`},
		{"missing rules", []string{"--config", filepath.Join(dir, "none")}, "no such file"},
		{"bad backend", []string{"--backend", "etcd"}, `--backend "etcd": want memory or redis`},
		{"bad failure mode", []string{"--failure-mode", "maybe"}, `failure mode "maybe"`},
		{"bad headers", []string{"--response-headers", "x"}, `response headers "x"`},
		{"near-limit ratio NaN", []string{"--near-limit-ratio", "NaN"}, "--near-limit-ratio NaN: want a value in [0, 1]"},
		{"too many stream workers", []string{"--grpc-stream-workers", "1000000"}, "--grpc-stream-workers 1000000: want at most 4096"},
		{"bad log level", []string{"--log-level", "loud"}, `--log-level "loud"`},
		{"client CA without cert", []string{"--grpc-tls-client-ca", bad}, "--grpc-tls-client-ca needs --grpc-tls-cert"},
		{"busy port", []string{"--grpc-addr", busy.Addr().String()}, "--grpc-addr"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--http-addr", "127.0.0.1:0", "--grpc-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"}, tc.args...)
			// A case that wrongly starts serving ends with the deadline instead of hanging.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := run(ctx, args, nil, io.Discard, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestRunServesUntilCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var stderr bytes.Buffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"}, nil, io.Discard, &syncWriter{w: &stderr})
	}()
	time.Sleep(300 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("run returned %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("run did not return after cancel")
	}
}

type syncWriter struct{ w io.Writer }

func (s *syncWriter) Write(p []byte) (int, error) { return s.w.Write(p) }

func TestEnvName(t *testing.T) {
	if got := envName("grpc-max-connection-age"); got != "RLS_GRPC_MAX_CONNECTION_AGE" {
		t.Fatal(got)
	}
}

// TestBadValuesExit64: every value or combination of values serve refuses, whether a flag, an
// RLS_* variable or OpenTelemetry's environment gives it, exits 64 and says which flag or
// variable is wrong and why, before anything is loaded or bound. There is at least one case
// for each rule group of server.Config.Validate.
func TestBadValuesExit64(t *testing.T) {
	file := filepath.Join(t.TempDir(), "some.pem")
	if err := os.WriteFile(file, []byte("not read: the combination is refused first"), 0o600); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	tests := []struct {
		name string
		args []string
		env  []string
		want []string
	}{
		{"log level", []string{"--log-level", "loud"}, nil, []string{`--log-level "loud": want debug, info, warn or error`}},
		{"log format", []string{"--log-format", "xml"}, nil, []string{`--log-format "xml": want text or json`}},
		{"backend", []string{"--backend", "etcd"}, nil, []string{`--backend "etcd": want memory or redis`}},
		{"failure mode", []string{"--failure-mode", "maybe"}, nil, []string{`--failure-mode: `, `"maybe"`}},
		{"response headers", []string{"--response-headers", "x"}, nil, []string{"--response-headers: "}},
		{"near-limit ratio", []string{"--near-limit-ratio", "2"}, nil, []string{"--near-limit-ratio 2: want a value in [0, 1]"}},
		{"near-limit ratio from RLS_*", nil, []string{"RLS_NEAR_LIMIT_RATIO=-1"}, []string{"RLS_NEAR_LIMIT_RATIO -1: want a value in [0, 1]"}},
		{"backend from RLS_*", nil, []string{"RLS_BACKEND=etcd"}, []string{`RLS_BACKEND "etcd": want memory or redis`}},
		{"concurrent streams", []string{"--grpc-max-concurrent-streams", "0"}, nil, []string{"--grpc-max-concurrent-streams 0: want at least 1"}},
		{"stream workers", []string{"--grpc-stream-workers", "5000"}, nil, []string{"--grpc-stream-workers 5000: want at most 4096"}},
		{"connections", []string{"--grpc-max-connections", "-1"}, nil, []string{"--grpc-max-connections -1: want 0 (no bound) or more"}},
		{"connection idle", []string{"--grpc-max-connection-idle", "-1s"}, nil, []string{"--grpc-max-connection-idle -1s: want 0 (never) or more"}},
		{"calls", []string{"--grpc-max-calls", "-1"}, nil, []string{"--grpc-max-calls -1: want 0 (no bound) or more"}},
		{"new keys", nil, []string{"RLS_MAX_NEW_KEYS_PER_CALLER=-1"}, []string{"RLS_MAX_NEW_KEYS_PER_CALLER -1: want 0 (no bound) or more"}},
		{"client CA without a certificate", []string{"--grpc-tls-client-ca", file}, nil, []string{"--grpc-tls-client-ca needs --grpc-tls-cert and --grpc-tls-key"}},
		{"client SAN without a CA", []string{"--grpc-tls-cert", file, "--grpc-tls-key", file, "--grpc-tls-client-san", "x"}, nil, []string{"--grpc-tls-client-san needs --grpc-tls-client-ca"}},
		{"HTTP certificate without its key", []string{"--http-tls-cert", file}, nil, []string{"--http-tls-cert and --http-tls-key go together"}},
		{"HTTP client CA without a certificate", []string{"--http-tls-client-ca", file}, nil, []string{"--http-tls-client-ca needs --http-tls-cert and --http-tls-key"}},
		{"HTTP timeout", []string{"--http-read-timeout", "0s"}, nil, []string{"--http-read-timeout 0s: must be > 0"}},
		{"HTTP header bytes", []string{"--http-max-header-bytes", "0"}, nil, []string{"--http-max-header-bytes 0: must be > 0"}},
		{"pprof without a debug listener", []string{"--debug", "--debug-addr", ""}, nil, []string{"--debug serves pprof on the debug listener: it needs --debug-addr"}},
		{"metrics path", []string{"--metrics-addr", "127.0.0.1:0", "--metrics-path", "metrics"}, nil, []string{`--metrics-path "metrics": want a path starting with /`}},
		{"reload debounce", []string{"--reload-debounce", "0s"}, nil, []string{"--reload-debounce 0s: must be > 0"}},
		{"request bytes", []string{"--max-request-bytes", "100"}, nil, []string{"--max-request-bytes 100: want at least 1024"}},
		{"overrides", []string{"--overrides", "sometimes"}, nil, []string{`--overrides "sometimes": want allow, ignore or refuse`}},
		{"RLQS tick", []string{"--rlqs", "--rlqs-tick", "0s"}, nil, []string{"--rlqs-tick 0s: want a positive duration"}},
		{"Redis health interval", []string{"--backend", "redis", "--redis-health-interval", "0s"}, nil, []string{"--redis-health-interval 0s: want a positive duration"}},
		{"Redis negative timeout and sizes", []string{"--backend", "redis", "--redis-timeout", "-1s", "--redis-coalesce", "-3"}, nil,
			[]string{"--redis-timeout -1s: want a duration ≥ 0", "--redis-coalesce -3: want a number ≥ 0"}},
		{"Redis TLS without rediss://", []string{"--backend", "redis", "--redis-tls-ca", file}, nil, []string{"--redis-tls-* need TLS"}},
		{"rules from files and xDS", []string{"--config", file, "--xds-server", "127.0.0.1:1"}, nil, []string{"--config and --xds-server both give the rules: keep one"}},
		{"xDS metadata", []string{"--xds-server", "127.0.0.1:1", "--xds-node-metadata", "zone"}, nil, []string{`--xds-node-metadata: "zone": want key=value`}},
		{"xDS TLS files without --xds-tls", []string{"--xds-server", "127.0.0.1:1", "--xds-tls-ca", file}, nil, []string{"need --xds-tls"}},
		{"OTLP protocol", nil, []string{"OTEL_TRACES_EXPORTER=otlp", "OTEL_EXPORTER_OTLP_PROTOCOL=pigeon"}, []string{`OTEL_EXPORTER_OTLP_PROTOCOL "pigeon": want grpc or http/protobuf`}},
		{"every value wrong is named", []string{"--near-limit-ratio", "2", "--reload-debounce", "0s", "--rlqs", "--rlqs-max-buckets", "0"}, nil,
			[]string{"--near-limit-ratio 2", "--reload-debounce 0s", "--rlqs-max-buckets 0"}},
		{"a flag the flag package refuses", []string{"--grpc-max-calls", "many"}, nil, []string{`invalid value "many" for flag --grpc-max-calls`}},
		{"an RLS_* variable the flag package refuses", nil, []string{"RLS_SHUTDOWN_TIMEOUT=soon"}, []string{`RLS_SHUTDOWN_TIMEOUT="soon"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// The gRPC port is taken: a case that got past validation fails binding it (exit 1)
			// instead of serving.
			args := append([]string{"--grpc-addr", busy.Addr().String(), "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0"}, tc.args...)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var stderr bytes.Buffer
			code := exitCode(run(ctx, args, tc.env, io.Discard, &stderr), &stderr)
			if code != 64 {
				t.Errorf("exit %d, want 64", code)
			}
			for _, w := range tc.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if strings.Contains(stderr.String(), "level=") {
				t.Errorf("the server started logging before the values were checked:\n%s", stderr.String())
			}
		})
	}
}

// TestNameSources: a value wrong in an RLS_* variable is named by the variable, one from
// envoyproxy/ratelimit's environment by the flag and the variables it came from; a flag whose
// name another's begins with is left alone.
func TestNameSources(t *testing.T) {
	from := map[string]string{"backend": "RLS_BACKEND", "debug": "RLS_DEBUG", "redis-url": "REDIS_TYPE, REDIS_URL"}
	for _, tc := range []struct{ in, want string }{
		{`--backend "etcd": want memory or redis`, `RLS_BACKEND "etcd": want memory or redis`},
		{"--debug serves pprof on the debug listener: it needs --debug-addr", "RLS_DEBUG serves pprof on the debug listener: it needs --debug-addr"},
		{"--redis-url: bad\n--log-level x", "--redis-url (from REDIS_TYPE, REDIS_URL): bad\n--log-level x"},
		{"no flag here", "no flag here"},
	} {
		if got := nameSources(tc.in, from); got != tc.want {
			t.Errorf("nameSources(%q):\n got %q\nwant %q", tc.in, got, tc.want)
		}
	}
}
