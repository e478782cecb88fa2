package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	goredis "github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/redistest"
)

// newKeysRules: ten an hour per user, whatever the user: every distinct value is a key of its
// own, which Redis holds for 6 minutes after one hit; the steady key, hit all along, is under
// its limit.
const newKeysRules = `
domain: newkeys
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: steady
    rate_limit: {unit: second, requests_per_unit: 1000}
`

// newKeysFlood is what 3 s of requests of 8 new values each made Redis hold.
type newKeysFlood struct {
	keys                int64 // keys under the prefix after the flood, the epoch key left out
	ok, refused, failed int64 // flood requests
	firstRefusal        time.Duration
	steadyOK, steadyBad int64 // requests on an already-seen key during the flood
	message             string
	failure             string // the first failed request's error
}

// floodNewKeys runs rls on the shared Redis with a prefix of its own and args, floods it from
// one client for 3 s with requests of 8 distinct new values, and counts the keys Redis holds.
func floodNewKeys(t *testing.T, args ...string) newKeysFlood {
	url := redistest.URL(t, redistest.SingleEnv)
	prefix := fmt.Sprintf("newkeys-%d-%d:", os.Getpid(), time.Now().UnixNano())
	rdb := goredis.NewClient(mustRedisOptions(t, url))
	t.Cleanup(func() {
		ctx := context.Background()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		rdb.Close()
	})
	p := startRLS(t, nil, append([]string{"--config", writeRules(t, map[string]string{"nk.yaml": newKeysRules}),
		"--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix, "--redis-timeout", "1s"}, args...)...)
	c := p.client(t)

	steady := &rlsv3.RateLimitRequest{Domain: "newkeys", Descriptors: oneDesc(d("steady", "s"))}
	if _, err := c.ShouldRateLimit(ctxT(t), steady); err != nil {
		t.Fatal(err)
	}

	var f newKeysFlood
	var n atomic.Int64
	var firstRefusal atomic.Int64
	var msg, failure atomic.Value
	start := time.Now()
	// The flood lasts 3 s; each request has a deadline of its own, so that none is cut short by
	// the flood's end (the server, timing the grpc-timeout it was sent, may answer
	// DeadlineExceeded a moment before the caller's own clock ends the context).
	ctx, cancel := context.WithDeadline(context.Background(), start.Add(3*time.Second))
	defer cancel()
	ask := func(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer rcancel()
		return c.ShouldRateLimit(rctx, req)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				i := n.Add(1)
				req := &rlsv3.RateLimitRequest{Domain: "newkeys"}
				for j := range 8 {
					req.Descriptors = append(req.Descriptors, &ratelimitv3.RateLimitDescriptor{
						Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("u%d-%d", i, j)}}})
				}
				_, err := ask(req)
				switch {
				case err == nil:
					atomic.AddInt64(&f.ok, 1)
				case status.Code(err) == codes.ResourceExhausted:
					if atomic.AddInt64(&f.refused, 1) == 1 {
						firstRefusal.Store(int64(time.Since(start)))
						msg.Store(status.Convert(err).Message())
					}
				default:
					if atomic.AddInt64(&f.failed, 1) == 1 {
						failure.Store(err.Error())
					}
				}
			}
		})
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			resp, err := ask(steady)
			switch {
			case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
				atomic.AddInt64(&f.steadyOK, 1)
			default:
				atomic.AddInt64(&f.steadyBad, 1)
				t.Errorf("a request on a seen key during the flood: %v, %v", resp.GetOverallCode(), err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	wg.Wait()
	f.firstRefusal = time.Duration(firstRefusal.Load())
	f.message, _ = msg.Load().(string)
	f.failure, _ = failure.Load().(string)

	sctx := ctxT(t)
	iter := rdb.Scan(sctx, 0, prefix+"*", 1000).Iterator()
	for iter.Next(sctx) {
		if !strings.HasPrefix(iter.Val(), prefix+"epoch") {
			f.keys++
		}
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return f
}

func mustRedisOptions(t *testing.T, url string) *goredis.Options {
	t.Helper()
	o, err := goredis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestMaxNewKeysPerCaller floods rls from one client with requests of 8 new values each for
// 3 s: without a bound every request creates its keys; with --max-new-keys-per-caller 200 the
// client is refused RESOURCE_EXHAUSTED within the first second and Redis holds at most about
// 200 × 3 + 200 (the burst) keys, while requests on an already-seen key are answered throughout.
func TestMaxNewKeysPerCaller(t *testing.T) {
	off := floodNewKeys(t)
	t.Logf("no bound: %d keys in 3 s (%d requests answered, %d failed: %s)", off.keys, off.ok, off.failed, off.failure)
	if off.refused != 0 {
		t.Fatalf("no bound: %d requests refused", off.refused)
	}

	const max = 200
	on := floodNewKeys(t, "--max-new-keys-per-caller", fmt.Sprint(max))
	t.Logf("--max-new-keys-per-caller %d: %d keys in 3 s (%d requests answered, %d refused, %d failed: %s; first refusal after %v); "+
		"seen key: %d answered OK, %d not", max, on.keys, on.ok, on.refused, on.failed, on.failure, on.firstRefusal, on.steadyOK, on.steadyBad)
	if on.refused == 0 || on.firstRefusal > time.Second {
		t.Fatalf("first refusal after %v (%d refused); want within the first second", on.firstRefusal, on.refused)
	}
	if want := fmt.Sprintf("caller 127.0.0.1 created more than %d new keys a second (--max-new-keys-per-caller)", max); on.message != want {
		t.Fatalf("refusal %q, want %q", on.message, want)
	}
	// 3 s at 200 a second plus the burst, one request's 8 keys of slack, and the steady key.
	if limit := int64(max*3 + max + 8 + 1); on.keys > limit {
		t.Fatalf("%d keys after 3 s; want at most %d", on.keys, limit)
	}
	if on.steadyOK == 0 || on.steadyBad != 0 {
		t.Fatalf("seen key: %d OK, %d not", on.steadyOK, on.steadyBad)
	}
}
