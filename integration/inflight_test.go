package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
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

const inflightRules = `
domain: llm
descriptors:
  - key: user
    concurrency: {max_in_flight: 10, slot_lifetime: 1500ms}
  - key: tenant
    concurrency: {max_in_flight: 10, slot_lifetime: 1m}
`

const (
	inflightN        = 10
	inflightLifetime = 1500 * time.Millisecond
)

// slotDesc is the descriptor of key=value's slot id, a release when release is set.
func slotDesc(key, value, id string, release bool) []*ratelimitv3.RateLimitDescriptor {
	ds := d(key, value, "rls_slot", id)
	if release {
		ds.Entries = append(ds.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "rls_release", Value: "1"})
	}
	return oneDesc(ds)
}

// TestInFlight: three replicas on one Redis (single, then Cluster) and 200 callers holding
// slots of one key (a 1.5 s lifetime) for random times, a fifth of their releases dropped. The callers' own count
// of slots acquired and not released (a dropped release counted until its lifetime could have
// ended) never exceeds N; once the callers stop, the dropped slots free themselves within the
// lifetime and N admissions follow. Then, on keys of a 1-minute lifetime, the releases that
// must free nothing (twice, another's id, never acquired), and a hostile client with random
// ids, which holds N slots at most: the key's sorted set never has more than N members.
func TestInFlight(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, env string }{{"single", redistest.SingleEnv}, {"cluster", redistest.ClusterEnv}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := redistest.URL(t, tc.env)
			rules := writeRules(t, map[string]string{"llm.yaml": inflightRules})
			prefix := fmt.Sprintf("inflight-%d:", time.Now().UnixNano())
			var clients []rlsv3.RateLimitServiceClient
			for range 3 {
				p := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", url,
					"--redis-key-prefix", prefix, "--redis-timeout", "5s")
				clients = append(clients, p.client(t))
			}
			ctx := ctxT(t)
			// ask asks for a slot of user (1.5 s lifetime), or of a tenant (1 minute) when user
			// begins with "tenant:".
			ask := func(c int, user, id string, release bool) bool {
				key, value := "user", user
				if v, ok := strings.CutPrefix(user, "tenant:"); ok {
					key, value = "tenant", v
				}
				resp, err := clients[c%3].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: slotDesc(key, value, id, release)})
				if err != nil {
					t.Error(err)
					return false
				}
				return resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
			}

			// The load: 200 callers for 2 s. The recorder counts, at each admission, the slots
			// its callers hold: those acquired and not released yet, and those whose release
			// they dropped until their lifetime could have ended, counted from the acquire's
			// sending (rls dates the slot later), without a timer that could fire late.
			var mu sync.Mutex
			var explicit, most int
			var dropped []time.Time
			var admitted, refused atomic.Int64
			acquired := func() {
				mu.Lock()
				defer mu.Unlock()
				explicit++
				n, now := explicit, time.Now()
				for _, d := range dropped {
					if d.After(now) {
						n++
					}
				}
				most = max(most, n)
			}
			stop := time.Now().Add(2 * time.Second)
			var wg sync.WaitGroup
			for c := range 200 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(c), 1))
					for i := 0; time.Now().Before(stop) && !t.Failed(); i++ {
						id := fmt.Sprintf("c%d-%d", c, i)
						sent := time.Now()
						if !ask(c, "load", id, false) {
							refused.Add(1)
							time.Sleep(time.Duration(rng.IntN(5)) * time.Millisecond)
							continue
						}
						admitted.Add(1)
						acquired()
						time.Sleep(time.Duration(10+rng.IntN(40)) * time.Millisecond)
						mu.Lock()
						explicit--
						if rng.IntN(5) == 0 {
							dropped = append(dropped, sent.Add(inflightLifetime))
							mu.Unlock()
							continue
						}
						mu.Unlock()
						ask(c+1, "load", id, true)
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			if most > inflightN || most < 1 || refused.Load() == 0 {
				t.Fatalf("callers held at most %d slots at once and were refused %d times, want 1 to %d, and refusals", most, refused.Load(), inflightN)
			}
			t.Logf("%d admitted, %d refused, %d releases dropped, at most %d held", admitted.Load(), refused.Load(), len(dropped), most)

			// The dropped releases' slots free themselves within the lifetime.
			time.Sleep(inflightLifetime + 100*time.Millisecond)
			start := time.Now()
			for i := range inflightN {
				if !ask(i, "load", fmt.Sprint("after-", i), false) {
					t.Fatalf("admission %d after the lifetime refused: lost releases still hold slots", i)
				}
			}
			if ask(0, "load", "after-extra", false) && time.Since(start) < inflightLifetime {
				t.Fatal("an admission past N")
			}

			// Releases that free nothing, on a key whose slots outlive the test.
			for i := range inflightN {
				ask(i, "tenant:r", fmt.Sprint("r-", i), false)
			}
			ask(0, "tenant:r", "r-0", true)
			ask(1, "tenant:r", "r-0", true) // the second release of r-0
			ask(2, "tenant:r", "someone-else", true)
			ask(0, "tenant:other", "r-1", true)
			if !ask(1, "tenant:r", "new-1", false) {
				t.Fatal("r-0's release freed no slot")
			}
			if ask(2, "tenant:r", "new-2", false) {
				t.Fatal("a release twice, of another id or of another key's slot freed a slot")
			}

			// A hostile client: random ids, 50 at once.
			var hostile atomic.Int64
			for c := range 50 {
				wg.Go(func() {
					for i := range 10 {
						if ask(c, "tenant:hostile", fmt.Sprintf("%x-%d-%d", rand.Uint64(), c, i), false) {
							hostile.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if h := hostile.Load(); h != inflightN {
				t.Fatalf("hostile client holds %d slots, want %d", h, inflightN)
			}
			if n := zcard(t, url, prefix+"3:llm6:tenant7:hostile#c"); n != inflightN {
				t.Fatalf("the hostile key's sorted set has %d members, want %d", n, inflightN)
			}
		})
	}
}

// zcard reads the size of a sorted set in the Redis at url.
func zcard(t *testing.T, url, key string) int64 {
	t.Helper()
	var c goredis.UniversalClient
	if addrs, ok := strings.CutPrefix(url, "redis-cluster://"); ok {
		c = goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	} else {
		opts, err := goredis.ParseURL(url)
		if err != nil {
			t.Fatal(err)
		}
		c = goredis.NewClient(opts)
	}
	defer c.Close()
	n, err := c.ZCard(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
