package main

import (
	"io"
	"reflect"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/server"
)

// TestServeFlagsFillConfig: each serve flag, from the command line or its RLS_* variable, sets
// its field of server.Config; without flags the configuration is server.DefaultConfig.
func TestServeFlagsFillConfig(t *testing.T) {
	c, err := parseServeFlags(nil, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := server.DefaultConfig(); !reflect.DeepEqual(c, want) {
		t.Errorf("no flags:\n got %+v\nwant %+v", c, want)
	}
	want := server.DefaultConfig()
	want.HTTP.HTTPLimits = server.HTTPLimits{ReadHeaderTimeout: time.Second, ReadTimeout: 2 * time.Second,
		WriteTimeout: 3 * time.Second, IdleTimeout: 4 * time.Second, MaxHeaderBytes: 1024}
	want.GRPC.MaxConnections, want.GRPC.MaxConnectionIdle = 5, time.Minute
	want.Bounds.MaxCalls, want.Bounds.Overrides = 7, "refuse"
	want.AdminTokenFile, want.CallerPolicy = "/token", "/policy.yaml"
	want.Memory.MaxKeys, want.Debug.Pprof = 9, true
	env := []string{"RLS_HTTP_IDLE_TIMEOUT=4s", "RLS_GRPC_MAX_CALLS=7", "RLS_CALLER_POLICY=/policy.yaml"}
	want.Env = env
	c, err = parseServeFlags([]string{"--http-read-header-timeout", "1s", "--http-read-timeout", "2s", "--http-write-timeout", "3s",
		"--http-max-header-bytes", "1024", "--grpc-max-connections", "5", "--grpc-max-connection-idle", "1m",
		"--overrides", "refuse", "--admin-token-file", "/token", "--memory-max-keys", "9", "--debug"}, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("flags:\n got %+v\nwant %+v", c, want)
	}
}
