package server

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestClockOffset(t *testing.T) {
	rc := RedisConfig{ClockOffset: -90 * time.Second}
	if d := time.Since(rc.now()()); d < 89*time.Second || d > 91*time.Second {
		t.Fatalf("--clock-offset -90s: the clock is %v behind, want 90s", d)
	}
	if d := time.Since(RedisConfig{}.now()()); d < 0 || d > time.Second {
		t.Fatalf("no offset: the clock is %v behind", d)
	}
}

func TestNewRedisBackendBadURL(t *testing.T) {
	_, err := newRedisBackend(context.Background(), RedisConfig{URL: "redis-sentinel://h:26379"}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "--redis-url") || !strings.Contains(err.Error(), "master name") {
		t.Fatalf("got %v, want an error naming --redis-url and the missing master name", err)
	}
}
