package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/redistest"
)

// memRules: ten a day per user, whatever the user: every distinct value is a key of its own.
const memRules = `
domain: mem
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 10}
`

// memFlood is what a flood of distinct keys did beside a spent victim key.
type memFlood struct {
	policy      string
	sent        int64 // flood requests
	unavailable int64 // flood requests answered UNAVAILABLE (the failure mode is error)
	victimOK    int   // of 10 requests on the spent victim key, afterwards, from a fresh replica
	evicted     int64 // Redis's own evicted_keys
	keys, used  int64 // keys Redis held after, and its used_memory
	counted     float64
	resets      float64
	oom         float64
	lostLogs    int
	epochLogs   int // "redis evicted rls's epoch key" lines
	oomLogs     int
	breakerLogs int
}

func (f memFlood) String() string {
	return fmt.Sprintf("%s: %d flood requests (%d UNAVAILABLE); victim admitted %d more of 10; Redis holds %d keys in %d bytes, evicted_keys %d, "+
		"rls_redis_evicted_keys_total %v; rls_redis_state_resets_total %v (%d \"redis lost its data\" lines, %d \"evicted rls's epoch key\"); "+
		"rls_redis_oom_total %v (%d \"redis out of memory\" lines); %d breaker-open lines",
		f.policy, f.sent, f.unavailable, f.victimOK, f.keys, f.used, f.evicted, f.counted, f.resets, f.lostLogs, f.epochLogs, f.oom, f.oomLogs, f.breakerLogs)
}

// memArgs runs rls on r with memRules, the epoch checked every health, UNAVAILABLE for a
// decision that failed, and a budget of 1 s: decisions fail where Redis refuses them, not
// where a busy machine is slow.
func memArgs(t *testing.T, r *redistest.Server, health time.Duration) []string {
	return []string{"--config", writeRules(t, map[string]string{"mem.yaml": memRules}), "--backend", "redis",
		"--redis-url", r.URL(), "--redis-key-prefix", "mem:", "--redis-health-interval", health.String(),
		"--failure-mode", "error", "--redis-timeout", "1s"}
}

// spendVictim uses up the victim's ten a day, and checks the eleventh is over the limit.
func spendVictim(t *testing.T, c rlsv3.RateLimitServiceClient) {
	t.Helper()
	for i := range 11 {
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "mem", Descriptors: oneDesc(d("user", "victim"))})
		if err != nil {
			t.Fatal(err)
		}
		if want := i < 10; (resp.GetOverallCode() == rlsv3.RateLimitResponse_OK) != want {
			t.Fatalf("victim request %d: %v", i, resp.GetOverallCode())
		}
	}
}

// victimAdmits sends ten requests on the victim key through c and counts those admitted (a
// failed decision, the failure mode error, admits nothing).
func victimAdmits(t *testing.T, c rlsv3.RateLimitServiceClient) int {
	t.Helper()
	ok := 0
	for range 10 {
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "mem", Descriptors: oneDesc(d("user", "victim"))})
		if err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
			ok++
		}
	}
	return ok
}

// redisInfoInt reads one integer field of INFO from the Redis behind c.
func redisInfoInt(t *testing.T, c *goredis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatalf("INFO %s: %s", section, line)
			}
			return n
		}
	}
	t.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// flood sends requests of 8 descriptors, each on a user never seen before (of about 200
// bytes), from 8 callers for dur and until full says Redis is full or a request failed, while a ninth keeps asking for the victim; it returns the requests sent and those
// answered UNAVAILABLE.
func flood(t *testing.T, c rlsv3.RateLimitServiceClient, dur time.Duration, full func() bool) (sent, unavailable int64) {
	t.Helper()
	var seq, nsent, nunav atomic.Int64
	var wg sync.WaitGroup
	var filled atomic.Bool
	stop := make(chan struct{})
	go func() {
		// Past dur, on until Redis is full (or a request failed), at most 15 s more: a busy
		// machine may make fewer keys than 2 MB holds in dur.
		late := time.Now().Add(dur + 15*time.Second)
		for !filled.Load() && time.Now().Before(late) {
			filled.Store(nunav.Load() > 0 || full())
			time.Sleep(100 * time.Millisecond)
		}
		close(stop)
	}()
	deadline := time.Now().Add(dur)
	pad := strings.Repeat("p", 200)
	for w := range 9 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					if !time.Now().Before(deadline) {
						return
					}
				default:
				}
				var ds []*ratelimitv3.RateLimitDescriptor
				if w == 8 {
					ds = oneDesc(d("user", "victim"))
				} else {
					for range 8 {
						ds = append(ds, d("user", "flood-"+strconv.FormatInt(seq.Add(1), 10)+pad))
					}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "mem", Descriptors: ds})
				cancel()
				if w == 8 {
					continue
				}
				nsent.Add(1)
				if err != nil {
					nunav.Add(1)
				}
			}
		})
	}
	wg.Wait()
	<-stop
	return nsent.Load(), nunav.Load()
}

// runMemFlood starts a redis-server with maxmemory 2 MB and policy, rls on it, spends the
// victim key, floods distinct keys for 3 s, and then asks a second, fresh replica of rls (no
// denial cache) for the victim.
func runMemFlood(t *testing.T, policy string, health time.Duration) (memFlood, *redistest.Server, *rlsProc) {
	t.Helper()
	r := redistest.StartWith(t, "--maxmemory", "2mb", "--maxmemory-policy", policy)
	args := memArgs(t, r, health)
	p := startRLS(t, nil, args...)
	c := p.client(t)
	spendVictim(t, c)
	time.Sleep(health + 200*time.Millisecond) // the epoch known
	f := memFlood{policy: policy}
	admin := redisAdmin(t, r.Addr())
	f.sent, f.unavailable = flood(t, c, 3*time.Second, func() bool {
		info, _ := admin.Info(context.Background(), "stats").Result()
		return !strings.Contains(info, "evicted_keys:0\r\n")
	})
	time.Sleep(health + 200*time.Millisecond) // a health check after the flood
	f.victimOK = victimAdmits(t, startRLS(t, nil, args...).client(t))
	vals := metricValues(t, p.HTTPAddr)
	f.evicted = redisInfoInt(t, admin, "stats", "evicted_keys")
	f.keys = admin.DBSize(context.Background()).Val()
	f.used = redisInfoInt(t, admin, "memory", "used_memory")
	f.counted, _ = seriesSum(t, vals, "rls_redis_evicted_keys_total")
	f.resets, _ = seriesSum(t, vals, "rls_redis_state_resets_total")
	f.oom, _ = seriesSum(t, vals, "rls_redis_oom_total")
	out := p.Output()
	f.lostLogs = strings.Count(out, "redis lost its data")
	f.epochLogs = strings.Count(out, "redis evicted rls's epoch key")
	f.oomLogs = strings.Count(out, "redis out of memory")
	f.breakerLogs = strings.Count(out, "circuit breaker open")
	t.Log(f)
	return f, r, p
}

// TestRedisMemoryRecommendedPolicy: under docs/redis.md's recommended maxmemory-policy,
// volatile-ttl, a flood of distinct keys that fills Redis (2 MB) evicts the keys nearest
// their expiry and keeps the spent victim spent; rls counts the evictions and raises no false
// data-loss alarm (the epoch key has no expiry, so volatile-ttl never evicts it).
func TestRedisMemoryRecommendedPolicy(t *testing.T) {
	f, _, _ := runMemFlood(t, "volatile-ttl", 100*time.Millisecond)
	if f.evicted == 0 {
		t.Fatalf("Redis evicted nothing: the flood did not fill it (%v)", f)
	}
	if f.victimOK != 0 {
		t.Errorf("the spent victim admitted %d more after the flood, want 0", f.victimOK)
	}
	if f.resets != 0 || f.lostLogs != 0 {
		t.Errorf("rls_redis_state_resets_total %v, %d \"redis lost its data\" lines: evictions taken for a data loss", f.resets, f.lostLogs)
	}
	if f.counted == 0 || f.counted > float64(f.evicted) {
		t.Errorf("rls_redis_evicted_keys_total %v, want more than 0 and at most Redis's evicted_keys %d", f.counted, f.evicted)
	}
}

// TestRedisMemoryAllKeysEviction: under allkeys-lru (which evicts keys without an expiry too,
// the epoch key among them) the flood raises no false data-loss alarm, and the evictions are
// counted; a FLUSHALL and a restart without persistence afterwards are each still found as a
// loss, once.
func TestRedisMemoryAllKeysEviction(t *testing.T) {
	f, r, p := runMemFlood(t, "allkeys-lru", time.Second)
	if f.evicted == 0 {
		t.Fatalf("Redis evicted nothing: the flood did not fill it (%v)", f)
	}
	if f.resets != 0 || f.lostLogs != 0 {
		t.Errorf("rls_redis_state_resets_total %v, %d \"redis lost its data\" lines: evictions taken for a data loss", f.resets, f.lostLogs)
	}
	if f.counted == 0 || f.counted > float64(f.evicted) {
		t.Errorf("rls_redis_evicted_keys_total %v, want more than 0 and at most Redis's evicted_keys %d", f.counted, f.evicted)
	}
	resets := func() float64 {
		v, _ := seriesSum(t, metricValues(t, p.HTTPAddr), "rls_redis_state_resets_total")
		return v
	}
	waitResets := func(what string, want float64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for resets() < want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: rls_redis_state_resets_total %v after 5 s, want %v", what, resets(), want)
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(300 * time.Millisecond)
		if got := resets(); got != want {
			t.Fatalf("%s: rls_redis_state_resets_total %v, want %v", what, got, want)
		}
	}
	base := resets()
	if err := redisAdmin(t, r.Addr()).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	waitResets("FLUSHALL", base+1)
	r.Kill()
	r.Start()
	waitResets("a restart without persistence", base+2)
}

// TestRedisMemoryNoEviction: under noeviction a full Redis refuses rls's writes ("OOM command
// not allowed"). rls answers those decisions by the failure mode, says in its log that Redis
// is out of memory and counts them in rls_redis_oom_total; the node answered, so its circuit
// breaker stays closed.
func TestRedisMemoryNoEviction(t *testing.T) {
	f, _, _ := runMemFlood(t, "noeviction", 100*time.Millisecond)
	if f.unavailable == 0 {
		t.Fatalf("no flood request failed: Redis did not fill (%v)", f)
	}
	if f.oom == 0 || f.oomLogs == 0 {
		t.Errorf("rls_redis_oom_total %v, %d \"redis out of memory\" lines: an OOM not reported as such", f.oom, f.oomLogs)
	}
	if f.breakerLogs != 0 {
		t.Errorf("%d \"circuit breaker open\" lines: a Redis that answers OOM is not down", f.breakerLogs)
	}
	if f.victimOK != 0 {
		t.Errorf("the spent victim admitted %d more, want 0", f.victimOK)
	}
	if f.resets != 0 {
		t.Errorf("rls_redis_state_resets_total %v, want 0", f.resets)
	}
}

// TestRedisMemoryVolatileLRU is a record, not a promise: under volatile-lru the spent victim,
// answered from the denial cache and so never read in Redis, is the least recently used of
// the keys and is evicted. docs/redis.md says so.
func TestRedisMemoryVolatileLRU(t *testing.T) {
	f, _, _ := runMemFlood(t, "volatile-lru", 100*time.Millisecond)
	if f.resets != 0 {
		t.Errorf("rls_redis_state_resets_total %v, want 0: volatile-lru never evicts the epoch key", f.resets)
	}
	if f.counted == 0 {
		t.Errorf("rls_redis_evicted_keys_total %v, Redis evicted %d: evictions not counted", f.counted, f.evicted)
	}
}
