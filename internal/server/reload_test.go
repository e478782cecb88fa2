package server

import (
	"context"
	"io"
	"log/slog"
	"syscall"
	"testing"
	"time"
)

// TestSIGHUPReloadsEmbeddedRules signals this process: startReload's handler receives SIGHUP
// instead of the default action, which would end the test binary.
func TestSIGHUPReloadsEmbeddedRules(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	applied := make(chan struct{}, 10)
	apply := func() error { applied <- struct{}{}; return nil }
	if _, err := startReload(ctx, ReloadConfig{Debounce: time.Hour}, "", apply, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
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
