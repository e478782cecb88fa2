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
		{"unknown flag", []string{"--nope"}, nil, "flag provided but not defined: -nope"},
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
