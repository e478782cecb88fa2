package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
	"github.com/rls-project/rls/internal/redistest"
)

// TestSlots runs the cases of limits on requests in flight at instants the test sets, on a
// single node, on a Cluster (a batch's slots and rates on different masters), with leases on
// and with the local over-limit cache.
func TestSlots(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		env  string
		opts Options
	}{
		{"single", singleEnv, Options{}},
		{"cluster", clusterEnv, Options{}},
		{"single with leases and cache", singleEnv, Options{LeaseLifetime: time.Second, LocalCacheSize: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backendtest.RunSlots(t, func(t *testing.T, clock *backendtest.Clock) backend.Backend {
				opts := tc.opts
				opts.Now = clock.Now
				b := newTestBackend(t, tc.env, opts)
				b.scriptNow = clock.Micros
				return b
			})
		})
	}
}

// TestSlotsConcurrent: many callers acquiring and releasing one key's slots on Redis's clock
// never hold more than N at once, as each caller counts its own, and the key ends empty.
func TestSlotsConcurrent(t *testing.T) {
	t.Parallel()
	for _, env := range []string{singleEnv, clusterEnv} {
		t.Run(env, func(t *testing.T) {
			t.Parallel()
			b := newTestBackend(t, env, Options{})
			l := backendtest.Slots(5, time.Minute)
			var holding, most atomic.Int64
			var wg sync.WaitGroup
			for c := range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					out := make([]backend.Decision, 1)
					for i := range 20 {
						id := fmt.Sprintf("c%d-%d", c, i)
						ok, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: l, Cost: 1, Slot: id}}, out)
						if err != nil {
							t.Error(err)
							return
						}
						if !ok {
							continue
						}
						n := holding.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						time.Sleep(time.Millisecond)
						holding.Add(-1)
						if _, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: l, Cost: 1, Slot: id, Refund: true}}, out); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			wg.Wait()
			if m := most.Load(); m > 5 || m == 0 {
				t.Fatalf("at most %d held at once, want 1 to 5", m)
			}
			out := make([]backend.Decision, 1)
			if _, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: l}}, out); err != nil || out[0].Remaining != 5 {
				t.Fatalf("after: %+v %v, want all 5 free", out[0], err)
			}
		})
	}
}

// TestSlotsSentinel runs the cases of limits on requests in flight through a Sentinel: the
// same code as a single node, through the Sentinel's failover client.
func TestSlotsSentinel(t *testing.T) {
	t.Parallel()
	r := redistest.Start(t)
	target, err := ParseURL("redis-sentinel://" + startSentinel(t, r.Addr()) + "/rlsmaster")
	if err != nil {
		t.Fatal(err)
	}
	backendtest.RunSlots(t, func(t *testing.T, clock *backendtest.Clock) backend.Backend {
		b, err := New(context.Background(), Options{Target: target, Timeout: 5 * time.Second, Now: clock.Now,
			KeyPrefix: fmt.Sprintf("sentinel-%d:", time.Now().UnixNano())})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		b.scriptNow = clock.Micros
		return b
	})
}
