package integration

import (
	"fmt"
	"net/http"
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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const raceRules = `
domain: race
descriptors:
  - key: user
    rate_limit: {unit: day, requests_per_unit: 100}
`

// TestRedisRace is the race experiment: three rls processes share one Redis, and 8 concurrent
// clients, spread over them, send 400 requests on one key limited to 100. Exactly 100 are
// admitted, in each of 20 rounds with a fresh key; on a single Redis and on a Cluster.
func TestRedisRace(t *testing.T) {
	for _, tc := range []struct{ name, env string }{{"single", redistest.SingleEnv}, {"cluster", redistest.ClusterEnv}} {
		t.Run(tc.name, func(t *testing.T) {
			url := redistest.URL(t, tc.env)
			rules := writeRules(t, map[string]string{"race.yaml": raceRules})
			prefix := fmt.Sprintf("race-%d:", time.Now().UnixNano())
			var clients []rlsv3.RateLimitServiceClient
			for range 3 {
				p := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", url,
					"--redis-key-prefix", prefix, "--redis-timeout", "5s")
				clients = append(clients, p.client(t))
			}
			ctx := ctxT(t)
			for round := range 20 {
				user := "round-" + strconv.Itoa(round)
				var admitted, denied atomic.Int64
				var wg sync.WaitGroup
				for c := range 8 {
					client := clients[c%len(clients)]
					wg.Go(func() {
						for range 50 {
							resp, err := client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "race", Descriptors: oneDesc(d("user", user))})
							if err != nil {
								t.Errorf("round %d: %v", round, err)
								return
							}
							switch resp.GetOverallCode() {
							case rlsv3.RateLimitResponse_OK:
								admitted.Add(1)
							case rlsv3.RateLimitResponse_OVER_LIMIT:
								denied.Add(1)
							default:
								t.Errorf("round %d: overall code %v", round, resp.GetOverallCode())
							}
						}
					})
				}
				wg.Wait()
				if t.Failed() {
					return
				}
				if admitted.Load() != 100 || denied.Load() != 300 {
					t.Fatalf("round %d: admitted %d and denied %d of 400, want exactly 100 and 300", round, admitted.Load(), denied.Load())
				}
			}
		})
	}
}

// TestRedisClockOffset: two replicas whose clocks are 90 seconds apart decide as one, since the
// time comes from Redis. Deciding with its own clock, the replica ahead would see the other's
// usage of a 10-per-minute limit as long gone and admit ten more.
func TestRedisClockOffset(t *testing.T) {
	url := redistest.URL(t, redistest.SingleEnv)
	rules := writeRules(t, map[string]string{"clock.yaml": `
domain: clock
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
`})
	prefix := fmt.Sprintf("clock-%d:", time.Now().UnixNano())
	behind := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix,
		"--redis-timeout", "5s", "--clock-offset", "-45s").client(t)
	ahead := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix,
		"--redis-timeout", "5s", "--clock-offset", "45s").client(t)
	ctx := ctxT(t)
	for i := range 24 {
		c, name := behind, "behind"
		if i%2 == 1 {
			c, name = ahead, "ahead"
		}
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "clock", Descriptors: oneDesc(d("user", "u"))})
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()[0]
		wantOK := i < 10
		wantRemaining := uint32(0)
		if wantOK {
			wantRemaining = uint32(9 - i)
		}
		if (resp.GetOverallCode() == rlsv3.RateLimitResponse_OK) != wantOK || st.GetLimitRemaining() != wantRemaining {
			t.Fatalf("request %d (replica %s): %v remaining %d, want OK=%v remaining %d",
				i, name, resp.GetOverallCode(), st.GetLimitRemaining(), wantOK, wantRemaining)
		}
		// A denial says when the next slot frees: 6s after the first request, whoever is asked.
		if !wantOK {
			if w := st.GetDurationUntilReset().AsDuration(); w <= 0 || w > 6*time.Second {
				t.Fatalf("request %d (replica %s): retry in %v, want within (0, 6s]", i, name, w)
			}
		}
	}
}

func oneDesc(d *ratelimitv3.RateLimitDescriptor) []*ratelimitv3.RateLimitDescriptor {
	return []*ratelimitv3.RateLimitDescriptor{d}
}

// goroutines reads go_goroutines from the process's /metrics.
func goroutines(t *testing.T, p *rlsProc) int {
	t.Helper()
	n, err := strconv.ParseFloat(metricValues(t, p.HTTPAddr)["go_goroutines"], 64)
	if err != nil {
		t.Fatalf("go_goroutines in /metrics: %v", err)
	}
	return int(n)
}

// TestRedisKilledUnderLoad: Redis dies under load. Every answer follows the failure mode of its
// process (error: gRPC UNAVAILABLE; allow: OK) within the Redis timeout, no process dies and no
// goroutines pile up; Redis restarted empty, both recover by themselves and limit again.
func TestRedisKilledUnderLoad(t *testing.T) {
	r := redistest.Start(t)
	rules := writeRules(t, map[string]string{"kill.yaml": `
domain: kill
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
`})
	const timeout = 100 * time.Millisecond
	// Under the race detector on a small machine a gRPC round trip alone can take tens of ms.
	const slack = 700 * time.Millisecond
	procs := map[string]*rlsProc{}
	clients := map[string]rlsv3.RateLimitServiceClient{}
	for _, mode := range []string{"error", "allow"} {
		p := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", r.URL(),
			"--redis-timeout", timeout.String(), "--failure-mode", mode, "--redis-local-cache-size", "0")
		procs[mode], clients[mode] = p, p.client(t)
	}
	ctx := ctxT(t)
	ask := func(mode, user string) (rlsv3.RateLimitResponse_Code, codes.Code, time.Duration) {
		start := time.Now()
		resp, err := clients[mode].ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "kill", Descriptors: oneDesc(d("user", user))})
		return resp.GetOverallCode(), status.Code(err), time.Since(start)
	}
	// limits reports whether a fresh key gets exactly 5 admitted, shared by both processes.
	limits := func(user string) error {
		for i := range 7 {
			mode := []string{"error", "allow"}[i%2]
			got, code, _ := ask(mode, user)
			want := rlsv3.RateLimitResponse_OK
			if i >= 5 {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			if code != codes.OK || got != want {
				return fmt.Errorf("request %d to the %s process: %v %v, want %v", i, mode, code, got, want)
			}
		}
		return nil
	}
	if err := limits("before"); err != nil {
		t.Fatalf("Redis up: %v", err)
	}
	before := map[string]int{"error": goroutines(t, procs["error"]), "allow": goroutines(t, procs["allow"])}

	// Load on both processes, on fresh keys (nothing cached), while Redis dies.
	stop := make(chan struct{})
	type answer struct {
		mode  string
		code  codes.Code
		got   rlsv3.RateLimitResponse_Code
		took  time.Duration
		after bool // sent after the kill
	}
	var mu sync.Mutex
	var answers []answer
	var killed atomic.Bool
	var wg sync.WaitGroup
	for _, mode := range []string{"error", "allow"} {
		for w := range 4 {
			wg.Go(func() {
				for i := 0; i < 5000; i++ {
					select {
					case <-stop:
						return
					default:
					}
					after := killed.Load()
					got, code, took := ask(mode, fmt.Sprintf("load-%s-%d-%d", mode, w, i))
					mu.Lock()
					answers = append(answers, answer{mode, code, got, took, after})
					mu.Unlock()
				}
			})
		}
	}
	time.Sleep(300 * time.Millisecond)
	r.Kill()
	killed.Store(true)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wg.Wait()

	var during, slowest int
	var worst time.Duration
	for _, a := range answers {
		if !a.after {
			continue
		}
		during++
		want, wantCode := rlsv3.RateLimitResponse_OK, codes.OK
		if a.mode == "error" {
			want, wantCode = rlsv3.RateLimitResponse_UNKNOWN, codes.Unavailable
		}
		if a.code != wantCode || a.got != want {
			t.Errorf("Redis down, %s process: %v %v, want %v %v", a.mode, a.code, a.got, wantCode, want)
		}
		if a.took > worst {
			worst = a.took
		}
		if a.took > timeout+slack {
			slowest++
		}
	}
	if during < 50 {
		t.Fatalf("only %d answers while Redis was down", during)
	}
	if slowest > 0 {
		t.Errorf("%d of %d answers while Redis was down took longer than %v (slowest %v)", slowest, during, timeout+slack, worst)
	}
	t.Logf("%d answers while Redis was down, slowest %v", during, worst)
	for mode, p := range procs {
		select {
		case <-p.Done():
			t.Fatalf("the %s process died: %v\n%s", mode, p.ExitErr(), p.Output())
		default:
		}
	}

	// Redis back, empty: both recover by themselves and limit again.
	r.Start()
	deadline := time.Now().Add(15 * time.Second)
	for n := 0; ; n++ {
		err := limits("after-" + strconv.Itoa(n))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15s after Redis restarted: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The goroutines the outage started are gone.
	for mode, p := range procs {
		var n int
		for range 50 {
			if n = goroutines(t, p); n <= before[mode]+5 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if n > before[mode]+5 {
			t.Errorf("%s process: %d goroutines after recovery, %d before the outage", mode, n, before[mode])
		}
	}
}

// TestRedisRefusingEveryCall: Redis starts asking for a password rls does not have
// (requirepass set, rls's connections dropped), so every call fails with NOAUTH. rls must say
// so as it does when Redis is down: /readyz 503 with --failure-mode error, rls_backend_up 0,
// one log line; and come back by itself when the password is removed.
func TestRedisRefusingEveryCall(t *testing.T) {
	r := redistest.Start(t)
	rules := writeRules(t, map[string]string{"auth.yaml": `
domain: auth
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
`})
	p := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", r.URL(), "--redis-timeout", "1s",
		"--redis-local-cache-size", "0")
	c := p.client(t)
	ctx := ctxT(t)
	ask := func(i int) error {
		_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "auth", Descriptors: oneDesc(d("user", "u"+strconv.Itoa(i)))})
		return err
	}
	readyz := func() int {
		t.Helper()
		resp, err := http.Get("http://" + p.HTTPAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// await calls until cond holds, failing after 15s with what it last saw.
	await := func(what string, cond func() bool) {
		t.Helper()
		for i, deadline := 0, time.Now().Add(15*time.Second); !cond(); i++ {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 15s (/readyz %d, rls_backend_up %q)\n%s", what, readyz(), metricValues(t, p.HTTPAddr)["rls_backend_up"], p.Output())
			}
			_ = ask(i) // the backend learns Redis's state from calls too
			time.Sleep(20 * time.Millisecond)
		}
	}
	if err := ask(0); err != nil {
		t.Fatalf("Redis answering: %v", err)
	}
	if up := metricValues(t, p.HTTPAddr)["rls_backend_up"]; up != "1" || readyz() != 200 {
		t.Fatalf("Redis answering: rls_backend_up %q, /readyz %d; want 1 and 200", up, readyz())
	}

	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr(), Protocol: 2})
	defer admin.Close()
	if err := admin.ConfigSet(ctx, "requirepass", "s3cret").Err(); err != nil {
		t.Fatal(err)
	}
	// Connections authenticated before stay so: drop rls's (CLIENT KILL skips the caller's).
	if err := admin.Do(ctx, "CLIENT", "KILL", "TYPE", "normal").Err(); err != nil {
		t.Fatal(err)
	}
	await("NOAUTH on every call: /readyz 503 and rls_backend_up 0", func() bool {
		return readyz() == http.StatusServiceUnavailable && metricValues(t, p.HTTPAddr)["rls_backend_up"] == "0"
	})
	if err := ask(-1); status.Code(err) != codes.Unavailable {
		t.Errorf("a call while Redis refuses every call: %v, want UNAVAILABLE (--failure-mode error)", err)
	}
	if out := p.Output(); !strings.Contains(out, "backend unavailable; answering with the failure mode") {
		t.Errorf("the refusal was not logged:\n%s", out)
	}

	if err := admin.ConfigSet(ctx, "requirepass", "").Err(); err != nil {
		t.Fatal(err)
	}
	await("password removed: /readyz 200 and rls_backend_up 1", func() bool {
		return readyz() == http.StatusOK && metricValues(t, p.HTTPAddr)["rls_backend_up"] == "1"
	})
	if err := ask(-2); err != nil {
		t.Errorf("a call once Redis answers again: %v", err)
	}
	if out := p.Output(); !strings.Contains(out, "backend available again") {
		t.Errorf("the recovery was not logged:\n%s", out)
	}
}
