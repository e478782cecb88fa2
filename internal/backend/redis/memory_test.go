package redis

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/redistest"
)

func TestParseInfo(t *testing.T) {
	var s infoSnap
	parseInfo("# Server\r\nredis_version:7.0.15\r\nrun_id:abc\r\n", &s)
	parseInfo("# Stats\r\nevicted_keys:42\r\nexpired_keys:7\r\n", &s)
	parseInfo("# Memory\r\nmaxmemory_policy:volatile-ttl\r\n", &s)
	parseInfo("# Commandstats\r\ncmdstat_get:calls=9,usec=1\r\ncmdstat_flushall:calls=2,usec=3,usec_per_call=1.5\r\ncmdstat_flushdb:calls=1,usec=1\r\n", &s)
	want := infoSnap{runID: "abc", evicted: 42, flushes: 3, policy: "volatile-ttl"}
	if s != want {
		t.Fatalf("parsed %+v, want %+v", s, want)
	}
}

func TestEpochVerdict(t *testing.T) {
	was := infoSnap{ok: true, runID: "a", evicted: 10, flushes: 1}
	for _, c := range []struct {
		name    string
		now     infoSnap
		evicted bool
		why     string
	}{
		{"evicted", infoSnap{ok: true, runID: "a", evicted: 11, flushes: 1}, true, ""},
		{"flushed while evicting", infoSnap{ok: true, runID: "a", evicted: 99, flushes: 2}, false, "flushed"},
		{"restarted", infoSnap{ok: true, runID: "b", evicted: 99}, false, "restarted"},
		{"deleted", infoSnap{ok: true, runID: "a", evicted: 10, flushes: 1}, false, "deleted"},
		{"counters reset", infoSnap{ok: true, runID: "a", evicted: 0, flushes: 0}, false, "reset"},
		{"INFO refused", infoSnap{}, false, "gone"},
	} {
		why, evicted := epochVerdict(was, c.now)
		if evicted != c.evicted || !strings.Contains(why, c.why) {
			t.Errorf("%s: %q evicted=%v, want evicted=%v and a reason naming %q", c.name, why, evicted, c.evicted, c.why)
		}
	}
	if _, evicted := epochVerdict(infoSnap{}, infoSnap{ok: true, runID: "a", evicted: 11}); evicted {
		t.Error("an epoch gone with no reading from before it taken for an eviction")
	}
}

// memoryBackend is a Backend on r, its health checked every 20 ms, its epoch known.
func memoryBackend(t *testing.T, r *redistest.Server) *Backend {
	t.Helper()
	target, err := ParseURL(r.URL())
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(context.Background(), Options{Target: target, Timeout: 5 * time.Second, ReadTimeout: 5 * time.Second,
		KeyPrefix: "mem:", HealthInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	waitFor(t, "the epoch known", func() bool { return b.single.epochKnown() })
	return b
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// fill writes 1 KiB keys without an expiry into Redis until stop says so or Redis refuses one,
// and returns that refusal.
func fill(t *testing.T, c *goredis.Client, stop func() bool) error {
	t.Helper()
	v := strings.Repeat("x", 1024)
	for i := 0; !stop(); i++ {
		if i > 1e6 {
			t.Fatal("a million keys written: Redis did not fill")
		}
		if err := c.Set(context.Background(), "junk:"+strconv.Itoa(i), v, 0).Err(); err != nil {
			return err
		}
	}
	return nil
}

// An epoch key that Redis evicts (allkeys-random, a full Redis) is not a data loss: rls logs
// it, counts the evictions, keeps a new epoch and counts no reset; a FLUSHALL afterwards is
// still found, once.
func TestEpochEvictedIsNoLoss(t *testing.T) {
	r := redistest.StartWith(t, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-random")
	b := memoryBackend(t, r)
	n := b.single
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer admin.Close()
	epoch := b.prefix + "epoch{}"
	gone := func() bool { return admin.Exists(context.Background(), epoch).Val() == 0 }
	if err := fill(t, admin, gone); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a new epoch", func() bool { return !gone() })
	time.Sleep(100 * time.Millisecond) // a few more checks
	if got := b.resets.Load(); got != 0 {
		t.Fatalf("rls_redis_state_resets_total %d after an eviction of the epoch key, want 0", got)
	}
	if n.evicted.Load() == 0 {
		t.Fatal("rls_redis_evicted_keys_total 0, Redis evicted the epoch key")
	}
	if err := admin.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the flush found", func() bool { return b.resets.Load() == 1 })
	time.Sleep(100 * time.Millisecond)
	if got := b.resets.Load(); got != 1 {
		t.Fatalf("rls_redis_state_resets_total %d after one flush, want 1", got)
	}
}

// A Redis out of memory (noeviction) refuses rls's script calls with OOM: the decisions fail
// as unavailable (the failure mode), each is counted in rls_redis_oom_total, and the breaker
// stays closed, since the node answered; once Redis has room, decisions succeed at once.
func TestOutOfMemoryKeepsBreakerClosed(t *testing.T) {
	r := redistest.StartWith(t, "--maxmemory-policy", "noeviction")
	b := memoryBackend(t, r)
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer admin.Close()
	ctx := context.Background()
	// Far below what Redis uses empty: every write is refused, none evicts.
	if err := admin.ConfigSet(ctx, "maxmemory", "100kb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.Set(ctx, "x", "y", 0).Err(); !oomReply(err) {
		t.Fatalf("a write to a full Redis: %v, want an OOM refusal", err)
	}
	l := limit.Limit{Rate: 10, Period: time.Hour, Burst: 10}
	out := make([]backend.Decision, 1)
	for i := range 20 {
		_, err := b.Decide(ctx, []backend.Request{{Key: "k" + strconv.Itoa(i), Limit: l, Cost: 1}}, out)
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("decision %d on a full Redis: %v, want unavailable", i, err)
		}
	}
	if !b.single.br.Allow() || !b.Healthy() {
		t.Fatal("the breaker opened on OOM replies: the node answered")
	}
	if got := b.single.oom.Load(); got < 20 {
		t.Fatalf("rls_redis_oom_total %d after 20 refused decisions", got)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := b.Decide(ctx, []backend.Request{{Key: "k", Limit: l, Cost: 1}}, out); !ok || err != nil {
		t.Fatalf("a decision once Redis has room: admitted=%v, %v", ok, err)
	}
}
