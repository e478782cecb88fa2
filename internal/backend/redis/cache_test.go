package redis

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// TestLocalCache: a denied hot key is answered from memory, with no Redis command, until Redis
// would admit it; a smaller cost, another limit or a refund goes to Redis.
func TestLocalCache(t *testing.T) {
	clock := time.Now()
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	b := newTestBackend(t, singleEnv, Options{LocalCacheSize: 10, Now: now})
	counter := &commandCounter{calls: make(chan string, 1000)}
	b.rdb.AddHook(counter)
	ctx := context.Background()
	l := limit.Limit{Rate: 2, Period: time.Second, Burst: 2} // a slot frees every 500ms
	decide := func(r backend.Request) backend.Decision {
		t.Helper()
		out := make([]backend.Decision, 1)
		if _, err := b.Decide(ctx, []backend.Request{r}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	hot := backend.Request{Key: "hot", Limit: l, Cost: 2}
	if d := decide(hot); !d.Allowed {
		t.Fatalf("first request: %+v, want allowed", d)
	}
	first := decide(hot)
	if first.Allowed {
		t.Fatalf("second request: %+v, want denied", first)
	}
	counter.count()
	for i := range 100 {
		if d := decide(hot); d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > first.RetryAfter {
			t.Fatalf("cached request %d: %+v, want denied within %v", i, d, first.RetryAfter)
		}
	}
	if n := counter.count(); n != 0 {
		t.Fatalf("100 denied requests on a cached key sent %d Redis commands, want 0", n)
	}
	if h := b.CacheHits(); h != 100 {
		t.Fatalf("CacheHits() = %d after 100 cached answers, want 100", h)
	}
	steps := []struct {
		name  string
		req   backend.Request
		calls int
	}{
		{"higher cost, cached", backend.Request{Key: "hot", Limit: l, Cost: 3}, 0},
		{"smaller cost asks Redis", backend.Request{Key: "hot", Limit: l, Cost: 1}, 1},
		{"another limit asks Redis", backend.Request{Key: "hot", Limit: limit.Limit{Rate: 3, Period: time.Second, Burst: 2}, Cost: 2}, 1},
		{"a batch with an uncached key asks Redis", backend.Request{Key: "cold", Limit: l, Cost: 1}, 1},
	}
	for _, s := range steps {
		decide(s.req)
		if n := counter.count(); n != s.calls {
			t.Fatalf("%s: %d Redis commands, want %d", s.name, n, s.calls)
		}
	}
	// Once Redis would admit the key again, the cache no longer answers.
	advance(first.RetryAfter)
	time.Sleep(first.RetryAfter)
	if d := decide(hot); !d.Allowed {
		t.Fatalf("after RetryAfter: %+v, want allowed", d)
	}
	if n := counter.count(); n != 1 {
		t.Fatalf("after RetryAfter: %d Redis commands, want 1", n)
	}
	// A refund forgets the cached denial.
	decide(hot)
	counter.count()
	decide(backend.Request{Key: "hot", Limit: l, Cost: 2, Refund: true})
	if d := decide(hot); !d.Allowed {
		t.Fatalf("after a refund: %+v, want allowed", d)
	}
	if n := counter.count(); n != 2 {
		t.Fatalf("refund and request: %d Redis commands, want 2", n)
	}
}

// TestLocalCacheDroppedWhenCharged: a cached denial is dropped once a smaller request on the
// key is admitted, so the next denial reports what remains now, not what remained then.
func TestLocalCacheDroppedWhenCharged(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{LocalCacheSize: 10})
	l := limit.Limit{Rate: 10, Period: time.Hour, Burst: 10}
	decide := func(cost int64) backend.Decision {
		t.Helper()
		out := make([]backend.Decision, 1)
		if _, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: l, Cost: cost}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for _, step := range []struct {
		cost      int64
		allowed   bool
		remaining int64
	}{{8, true, 2}, {5, false, 2}, {1, true, 1}, {5, false, 1}} {
		if d := decide(step.cost); d.Allowed != step.allowed || d.Remaining != step.remaining {
			t.Fatalf("cost %d: %+v, want allowed=%v remaining %d", step.cost, d, step.allowed, step.remaining)
		}
	}
	if h := b.CacheHits(); h != 0 {
		t.Fatalf("%d answers from the cache, want 0 (the denial was dropped when the key was charged)", h)
	}
}

// A key longer than maxCachedKeyBytes is never cached, so that the cache's count bound also
// bounds its memory: a client's keys can be as long as its request.
func TestLocalCacheSkipsLongKeys(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{LocalCacheSize: 10})
	counter := &commandCounter{calls: make(chan string, 1000)}
	b.rdb.AddHook(counter)
	l := limit.Limit{Rate: 1, Period: time.Hour, Burst: 1}
	for _, tc := range []struct {
		key   string
		calls int
	}{{strings.Repeat("k", maxCachedKeyBytes), 0}, {strings.Repeat("k", maxCachedKeyBytes+1), 5}} {
		r := backend.Request{Key: tc.key, Limit: l, Cost: 1}
		out := make([]backend.Decision, 1)
		for range 2 {
			if _, err := b.Decide(context.Background(), []backend.Request{r}, out); err != nil {
				t.Fatal(err)
			}
		}
		counter.count()
		for range 5 {
			if _, err := b.Decide(context.Background(), []backend.Request{r}, out); err != nil || out[0].Allowed {
				t.Fatalf("%d-byte key: %+v %v, want denied", len(tc.key), out[0], err)
			}
		}
		if n := counter.count(); n != tc.calls {
			t.Fatalf("5 denied requests on a %d-byte key sent %d Redis commands, want %d", len(tc.key), n, tc.calls)
		}
	}
}
