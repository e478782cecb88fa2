package redis

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

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

// TestSlotsScriptFlushed: after SCRIPT FLUSH (a restarted Redis) slots.lua is loaded again, by
// a lone call and by a pipeline of several, on a single node and on every master of a Cluster;
// a call that found the script missing had not run and is sent once more.
// Not parallel, as TestNoScript: the flush reaches every test's calls on the shared Redis.
func TestSlotsScriptFlushed(t *testing.T) {
	for _, env := range []string{singleEnv, clusterEnv} {
		t.Run(env, func(t *testing.T) {
			b := newTestBackend(t, env, Options{})
			ctx := context.Background()
			flush := func() {
				t.Helper()
				var err error
				if cc, ok := b.rdb.(*goredis.ClusterClient); ok {
					err = cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error { return c.ScriptFlush(ctx).Err() })
				} else {
					err = b.rdb.ScriptFlush(ctx).Err()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			l := backendtest.Slots(1, time.Minute)
			out := make([]backend.Decision, 4)
			flush()
			if ok, err := b.Decide(ctx, []backend.Request{{Key: "lone", Limit: l, Cost: 1, Slot: "a"}}, out); err != nil || !ok {
				t.Fatalf("a lone acquire after SCRIPT FLUSH: %v %v", ok, err)
			}
			flush()
			reqs := []backend.Request{{Key: "k1", Limit: l, Cost: 1, Slot: "a"}, {Key: "k2", Limit: l, Cost: 1, Slot: "a"},
				{Key: "k3", Limit: l, Cost: 1, Slot: "a"}, {Key: "k1", Limit: l, Cost: 1, Slot: "b"}}
			if ok, err := b.Decide(ctx, reqs, out); err != nil || ok || !out[0].Allowed || out[3].Allowed {
				t.Fatalf("four acquires after SCRIPT FLUSH: %v %v %+v, want k1's second refusing the batch", ok, err, out)
			}
			if ok, err := b.Decide(ctx, reqs[:3], out); err != nil || !ok {
				t.Fatalf("the first three again: %v %v %+v, want them undone and admitted", ok, err, out)
			}
		})
	}
}
