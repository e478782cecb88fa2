package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestReloadFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     []string
		want    time.Duration
		wantErr string
	}{
		{"default", nil, nil, 200 * time.Millisecond, ""},
		{"flag", []string{"--reload-debounce", "2s"}, nil, 2 * time.Second, ""},
		{"env", nil, []string{"RLS_RELOAD_DEBOUNCE=750ms"}, 750 * time.Millisecond, ""},
		{"zero", []string{"--reload-debounce", "0s"}, nil, 0, "--reload-debounce 0s: must be > 0"},
		{"negative", nil, []string{"RLS_RELOAD_DEBOUNCE=-1s"}, 0, "--reload-debounce -1s: must be > 0"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			rc := reloadFlags(fs)
			if err := parseFlags(fs, tc.args, tc.env); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			err := startReload(ctx, rc, "", func() error { return nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || rc.debounce != tc.want {
				t.Fatalf("debounce %v, err %v; want %v", rc.debounce, err, tc.want)
			}
		})
	}
}

// TestSIGHUPReloadsEmbeddedRules signals this process: startReload's handler receives SIGHUP
// instead of the default action, which would end the test binary.
func TestSIGHUPReloadsEmbeddedRules(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applied := make(chan struct{}, 10)
	apply := func() error { applied <- struct{}{}; return nil }
	if err := startReload(ctx, &reloadConfig{debounce: time.Hour}, "", apply, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := syscall.Kill(syscall.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
		select {
		case <-applied:
		case <-time.After(10 * time.Second):
			t.Fatalf("SIGHUP %d: no reload", i+1)
		}
	}
}
