package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
	"github.com/rls-project/rls/internal/redistest"
)

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		opts Options
	}{
		{"single", singleEnv, Options{}},
		{"single coalesced", singleEnv, Options{Coalesce: 16}},
		{"single cached", singleEnv, Options{LocalCacheSize: 100}},
		{"cluster", clusterEnv, Options{}},
		{"cluster coalesced cached", clusterEnv, Options{Coalesce: 16, LocalCacheSize: 100}},
		{"single leased", singleEnv, Options{Coalesce: 16, LocalCacheSize: 100, LeaseLifetime: 50 * time.Millisecond}},
		{"cluster leased", clusterEnv, Options{Coalesce: 16, LocalCacheSize: 100, LeaseLifetime: 50 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.env, tc.opts)
			backendtest.Run(t, func(t *testing.T) backend.Backend { return b })
		})
	}
}

// TestSentinel runs the conformance suite through a Sentinel that monitors a Redis started
// here, without leases and with them (as rls runs by default).
func TestSentinel(t *testing.T) {
	r := redistest.Start(t)
	target, err := ParseURL("redis-sentinel://" + startSentinel(t, r.Addr()) + "/rlsmaster")
	if err != nil {
		t.Fatal(err)
	}
	for _, lifetime := range []time.Duration{0, 50 * time.Millisecond} {
		t.Run(fmt.Sprintf("leases %v", lifetime), func(t *testing.T) {
			b, err := New(context.Background(), Options{Target: target, Timeout: 5 * time.Second, LeaseLifetime: lifetime})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			if !b.Healthy() {
				t.Fatal("not healthy through Sentinel")
			}
			backendtest.Run(t, func(t *testing.T) backend.Backend { return b })
		})
	}
	direct := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer direct.Close()
	if n, err := direct.DBSize(context.Background()).Result(); err != nil || n == 0 {
		t.Fatalf("the master behind the Sentinel holds %d keys (%v), want the suite's", n, err)
	}
}
