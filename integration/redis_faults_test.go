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
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/rlstest"
)

// seriesSum is the sum of the samples of metric name, whatever their labels, in vals (as
// metricValues returns them), and whether there was any.
func seriesSum(t *testing.T, vals map[string]string, name string) (float64, bool) {
	t.Helper()
	var sum float64
	var found bool
	for k, v := range vals {
		if k != name && !strings.HasPrefix(k, name+"{") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			t.Fatalf("%s %q: %v", k, v, err)
		}
		sum, found = sum+f, true
	}
	return sum, found
}

// metricNumber is the value of the sample key (name and labels, as /metrics writes them) in
// vals, 0 when it is missing.
func metricNumber(t *testing.T, vals map[string]string, key string) float64 {
	t.Helper()
	v, ok := vals[key]
	if !ok {
		return 0
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s %q: %v", key, v, err)
	}
	return f
}

// debugSleep blocks the Redis at addr for d with DEBUG SLEEP (the server must run with
// --enable-debug-command yes), returning once it answers again.
func debugSleep(t *testing.T, addr string, d time.Duration) {
	t.Helper()
	admin := redisAdmin(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), d+5*time.Second)
	defer cancel()
	if err := admin.Do(ctx, "debug", "sleep", strconv.FormatFloat(d.Seconds(), 'f', 3, 64)).Err(); err != nil {
		t.Fatalf("DEBUG SLEEP on %s: %v", addr, err)
	}
}

// TestRedisSlowCountedAsSlow: a Redis that stalls (DEBUG SLEEP 0.3, three times a second apart)
// under about 500 decisions a second, callers waiting up to 1 s, is counted as Redis slow
// (rls_redis_slow_total, per node) and as backend timeouts, not as rls overload
// (rls_overload_shed_total): rls itself was never short of time. Overload counts at most half
// as many as Redis slow.
func TestRedisSlowCountedAsSlow(t *testing.T) {
	r := redistest.StartWith(t, "--enable-debug-command", "yes")
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"charge.yaml": chargeRules}), "--backend", "redis",
		"--redis-url", r.URL(), "--redis-key-prefix", "slow:")
	client := p.client(t)
	before := metricValues(t, p.HTTPAddr)

	stop := make(chan struct{})
	var c *loadCounts
	loadDone := make(chan struct{})
	go func() { defer close(loadDone); c = runChargeLoad(t, client, "slow", 500, stop) }()
	time.Sleep(time.Second)
	for range 3 {
		debugSleep(t, r.Addr(), 300*time.Millisecond)
		time.Sleep(time.Second)
	}
	close(stop)
	<-loadDone
	after := metricValues(t, p.HTTPAddr)

	slowBefore, _ := seriesSum(t, before, "rls_redis_slow_total")
	slowAfter, slowFound := seriesSum(t, after, "rls_redis_slow_total")
	slow := slowAfter - slowBefore
	const timeoutKey = `rls_backend_errors_total{kind="timeout"}`
	timeouts := metricNumber(t, after, timeoutKey) - metricNumber(t, before, timeoutKey)
	shed := metricNumber(t, after, "rls_overload_shed_total") - metricNumber(t, before, "rls_overload_shed_total")
	t.Logf("%v; rls_redis_slow_total +%v (exposed: %v), %s +%v, rls_overload_shed_total +%v", c, slow, slowFound, timeoutKey, timeouts, shed)
	if c.sent.Load() < 1000 {
		t.Fatalf("only %d requests sent", c.sent.Load())
	}
	if failed := c.sent.Load() - c.answered(); failed < 20 {
		t.Fatalf("only %d decisions failed while Redis slept 0.9 s in all: the stalls did not bite", failed)
	}
	if slow <= 0 {
		t.Errorf("rls_redis_slow_total rose by %v while Redis slept: the stalls were not counted as Redis slow", slow)
	}
	if nodeKey := `rls_redis_slow_total{node="` + r.Addr() + `"}`; metricNumber(t, after, nodeKey)-metricNumber(t, before, nodeKey) != slow {
		t.Errorf("%s rose by %v, want all of rls_redis_slow_total's +%v: the node that slept", nodeKey,
			metricNumber(t, after, nodeKey)-metricNumber(t, before, nodeKey), slow)
	}
	if timeouts < slow {
		t.Errorf("%s rose by %v, less than rls_redis_slow_total (+%v): a slow decision is a backend timeout too", timeoutKey, timeouts, slow)
	}
	// A pipeline unanswered for 20 ms sends the probe, so only decisions that ran out of time
	// while this process looked starved of CPU count as overload (none on a quiet machine); the
	// bound leaves room for one stall in three on a busy one.
	if shed > slow/2 {
		t.Errorf("rls_overload_shed_total rose by %v beside rls_redis_slow_total +%v, want at most half of it: a slow Redis is reported as rls overload", shed, slow)
	}
}

// shortCounts are the answers callers with a 20 ms deadline got.
type shortCounts struct{ ok, over, deadline, other, over5ms atomic.Int64 }

func (c *shortCounts) String() string {
	return fmt.Sprintf("%d OK (failure mode), %d OVER_LIMIT (Redis), %d DEADLINE_EXCEEDED, %d other",
		c.ok.Load(), c.over.Load(), c.deadline.Load(), c.other.Load())
}

func (c *shortCounts) total() int64 {
	return c.ok.Load() + c.over.Load() + c.deadline.Load() + c.other.Load()
}

// startPlainRLS is startRLS with rls built without the race detector, whatever the tests run
// with.
func startPlainRLS(t *testing.T, args ...string) *rlsProc {
	t.Helper()
	args = append(args, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--debug-addr", "127.0.0.1:0")
	p := rlstest.Launch(t, rlstest.BuildBinary(t, false), nil, args...)
	p.WaitReady(t)
	return &rlsProc{p}
}

// The phases of TestShortDeadlineAnsweredByRLS.
const (
	phaseHealthy  = iota // Redis answers
	phaseStalled         // Redis sleeps
	phaseSettling        // Redis just woke: calls sent now are counted in neither
)

// TestShortDeadlineAnsweredByRLS: callers with a 20 ms deadline while Redis stalls (DEBUG SLEEP
// 0.3, eight times, 0.3 s apart) get rls's answer (OK from --failure-mode allow) before their
// deadline, not DEADLINE_EXCEEDED: at most 0.2% of the answers the failure mode owed them are
// missed, beyond as many as were missed in the same run between the stalls, with Redis healthy
// (a machine too busy to answer anyone within 20 ms; none on a quiet one). The key's one hit a
// day is spent first, so that Redis answers OVER_LIMIT and every OK is the failure mode's. rls
// runs as built for production, without the race detector: its instrumentation, several times
// the CPU of a call, would be measured against the deadline's margin instead of rls.
func TestShortDeadlineAnsweredByRLS(t *testing.T) {
	r := redistest.StartWith(t, "--enable-debug-command", "yes")
	p := startPlainRLS(t, "--config", writeRules(t, map[string]string{"short.yaml": `
domain: short
descriptors:
  - key: k
    rate_limit: {unit: day, requests_per_unit: 1}
`}), "--backend", "redis", "--redis-url", r.URL(), "--redis-key-prefix", "short:", "--failure-mode", "allow",
		"--redis-local-cache-size", "0")
	client := p.client(t)
	req := &rlsv3.RateLimitRequest{Domain: "short", Descriptors: oneDesc(d("k", "spent"))}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(ctxT(t), req)
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("request %d with Redis up: %v %v, want %v", i, resp.GetOverallCode(), err, want)
		}
	}

	// 8 callers, each calling with a 20 ms deadline and pausing 2 ms between calls (as a
	// proxy's callers come and go: 8 callers spinning on 2 CPUs would measure the machine's
	// starvation, not rls). A call sent while Redis stalls counts as stalled; one sent and
	// answered while Redis is healthy, as healthy; any other in neither.
	var phase atomic.Int32
	var healthy, stalled shortCounts
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				sent := phase.Load()
				start := time.Now()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				resp, err := client.ShouldRateLimit(ctx, req)
				took := time.Since(start)
				cancel()
				c := &stalled
				if sent != phaseStalled {
					if sent != phaseHealthy || phase.Load() != phaseHealthy {
						continue
					}
					c = &healthy
				}
				if took > 5*time.Millisecond {
					c.over5ms.Add(1)
				}
				switch {
				case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
					c.ok.Add(1)
				case err == nil && resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT:
					c.over.Add(1)
				case status.Code(err) == codes.DeadlineExceeded:
					c.deadline.Add(1)
				default:
					if c.other.Add(1) <= 5 {
						t.Errorf("answer %v %v", resp.GetOverallCode(), err)
					}
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	for range 8 {
		time.Sleep(300 * time.Millisecond)
		phase.Store(phaseStalled)
		debugSleep(t, r.Addr(), 300*time.Millisecond)
		phase.Store(phaseSettling)
		time.Sleep(30 * time.Millisecond)
		phase.Store(phaseHealthy)
	}
	close(stop)
	wg.Wait()

	owed := stalled.ok.Load() + stalled.deadline.Load() // the answers the failure mode owed: Redis did not decide
	missed := stalled.deadline.Load()
	// Misses as frequent as with Redis healthy are the machine's.
	machine := (healthy.deadline.Load()*stalled.total() + healthy.total() - 1) / max(healthy.total(), 1)
	t.Logf("Redis healthy: %v; Redis stalling: %v: %.3f%% of %d owed answers missed (with Redis healthy: %.3f%% of all missed, %.3f%% took over 5 ms)",
		&healthy, &stalled, 100*float64(missed)/float64(max(owed, 1)), owed,
		100*float64(healthy.deadline.Load())/float64(max(healthy.total(), 1)),
		100*float64(healthy.over5ms.Load())/float64(max(healthy.total(), 1)))
	if owed < 500 || healthy.total() < 500 {
		t.Fatalf("only %d decisions while Redis slept and %d while it was healthy", owed, healthy.total())
	}
	if allowed := owed/500 + machine; missed > allowed {
		t.Errorf("%d of %d callers (%.3f%%) whose decision Redis did not make saw DEADLINE_EXCEEDED, want at most %d (0.2%%, and %d as often as with Redis healthy): rls answered after their deadline",
			missed, owed, 100*float64(missed)/float64(owed), allowed, machine)
	}
}

// stateLossRules limit keys tightly, so that a Redis that lost its data visibly admits a fresh
// burst on every one of them.
const stateLossRules = `
domain: loss
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
`

// stateLossArgs run rls on url with its Redis health checked every 200 ms.
func stateLossArgs(t *testing.T, url string) []string {
	return []string{"--config", writeRules(t, map[string]string{"loss.yaml": stateLossRules}), "--backend", "redis",
		"--redis-url", url, "--redis-key-prefix", "loss:", "--redis-health-interval", "200ms", "--redis-local-cache-size", "0"}
}

// tightTraffic sends requests on 20 tight keys from 4 callers until the test ends, ignoring
// the answers (Redis goes away and comes back under it).
func tightTraffic(t *testing.T, client rlsv3.RateLimitServiceClient) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, _ = client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "loss", Descriptors: oneDesc(d("k", fmt.Sprint("tight-", (w*7+i)%20)))})
				cancel()
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// stateResets reads rls_redis_state_resets_total, failing the test when rls does not expose it.
func stateResets(t *testing.T, p *rlsProc) float64 {
	t.Helper()
	n, ok := seriesSum(t, metricValues(t, p.HTTPAddr), "rls_redis_state_resets_total")
	if !ok {
		t.Fatal("rls_redis_state_resets_total is not in /metrics")
	}
	return n
}

// lostLines counts the log lines saying Redis lost its data.
func lostLines(p *rlsProc) int { return strings.Count(p.Output(), "redis lost its data") }

// awaitResets waits up to within for rls_redis_state_resets_total to reach want, and fails the
// test when it does not, or passes it.
func awaitResets(t *testing.T, p *rlsProc, want float64, within time.Duration, what string) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		n := stateResets(t, p)
		if n > want {
			t.Fatalf("%s: rls_redis_state_resets_total is %v, want %v", what, n, want)
		}
		if n == want {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("%s: rls_redis_state_resets_total still %v after %v, want %v\n%s", what, n, within, want, p.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// holdResets checks for d that rls_redis_state_resets_total stays want and the log holds want
// lines saying Redis lost its data.
func holdResets(t *testing.T, p *rlsProc, want float64, d time.Duration, what string) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if n := stateResets(t, p); n != want {
			t.Fatalf("%s: rls_redis_state_resets_total is %v, want %v\n%s", what, n, want, p.Output())
		}
	}
	if n := lostLines(p); n != int(want) {
		t.Fatalf("%s: %d log lines say redis lost its data, want %v\n%s", what, n, want, p.Output())
	}
}

// awaitBackendUp waits until rls answers from Redis again (rls_backend_up 1) after an outage.
func awaitBackendUp(t *testing.T, p *rlsProc, within time.Duration) {
	t.Helper()
	for end := time.Now().Add(within); metricValues(t, p.HTTPAddr)["rls_backend_up"] != "1"; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("rls_backend_up not 1 within %v\n%s", within, p.Output())
		}
	}
}

// TestRedisStateLossNoticed: rls notices a Redis that lost its data, under traffic on tight
// keys: after FLUSHALL it logs "redis lost its data" once and counts it once
// (rls_redis_state_resets_total 1, not once per key), within about 3 s; a restart of Redis
// without persistence counts again (2). A Redis that kept its data is no alarm: several health
// intervals of traffic, a restart of rls, a restart of Redis from its saved data, and a
// Sentinel failover to a replica all leave the count at 0.
func TestRedisStateLossNoticed(t *testing.T) {
	const interval = 200 * time.Millisecond
	t.Run("flush and restart empty", func(t *testing.T) {
		r := redistest.Start(t)
		p := startRLS(t, nil, stateLossArgs(t, r.URL())...)
		tightTraffic(t, p.client(t))
		holdResets(t, p, 0, 4*interval, "Redis untouched")

		if err := redisAdmin(t, r.Addr()).FlushAll(ctxT(t)).Err(); err != nil {
			t.Fatal(err)
		}
		took := awaitResets(t, p, 1, 3*time.Second, "after FLUSHALL")
		t.Logf("FLUSHALL noticed after %v", took.Round(time.Millisecond))
		holdResets(t, p, 1, 4*interval, "after FLUSHALL")

		r.Kill()
		r.Start()
		took = awaitResets(t, p, 2, 5*time.Second, "after a restart without persistence")
		t.Logf("restart without persistence noticed after %v", took.Round(time.Millisecond))
		holdResets(t, p, 2, 4*interval, "after a restart without persistence")
	})

	t.Run("data kept", func(t *testing.T) {
		r := redistest.Start(t)
		args := stateLossArgs(t, r.URL())
		p := startRLS(t, nil, args...)
		tightTraffic(t, p.client(t))
		holdResets(t, p, 0, 4*interval, "Redis untouched")

		// rls restarts against a Redis that kept its data.
		p.Stop(t)
		q := startRLS(t, nil, args...)
		tightTraffic(t, q.client(t))
		holdResets(t, q, 0, 4*interval, "rls restarted")

		// Redis restarts from the data it saved.
		admin := redisAdmin(t, r.Addr())
		ctx := ctxT(t)
		_ = admin.Do(ctx, "shutdown", "save").Err() // the connection closes as Redis exits
		r.Kill()
		r.Start()
		if n := keysMatching(t, admin, "loss:*"); n == 0 {
			t.Fatal("Redis restarted without the keys it saved")
		}
		awaitBackendUp(t, q, 5*time.Second)
		holdResets(t, q, 0, 6*interval, "Redis restarted with its data")
	})

	t.Run("sentinel failover", func(t *testing.T) {
		s := redistest.StartSentinel(t)
		p := startRLS(t, nil, stateLossArgs(t, s.URL())...)
		tightTraffic(t, p.client(t))
		holdResets(t, p, 0, 4*interval, "Redis untouched")

		old := s.MasterAddr()
		s.ServerAt(old).Kill()
		promoted := s.WaitFailover(old, 20*time.Second)
		// rls answers from the promoted replica, which holds what the master held.
		admin := redisAdmin(t, promoted)
		before := nodeScriptRuns(t, admin)
		for end := time.Now().Add(10 * time.Second); nodeScriptRuns(t, admin) == before; time.Sleep(20 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("rls sent nothing to the promoted master %s within 10 s\n%s", promoted, p.Output())
			}
		}
		if n := keysMatching(t, admin, "loss:*"); n == 0 {
			t.Fatal("the promoted replica holds none of the master's keys")
		}
		holdResets(t, p, 0, 6*interval, "after a Sentinel failover")
	})
}

// With the default failure mode and Redis gone, every request answers UNAVAILABLE, whatever
// its number of descriptors, and the client never sees Redis's address.
func TestServiceBackendDownManyDescriptors(t *testing.T) {
	r := redistest.Start(t)
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"hard.yaml": svcRules}),
		"--backend", "redis", "--redis-url", r.URL(), "--redis-timeout", "100ms")
	c := p.client(t)
	ctx := ctxT(t)
	if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: []*ratelimitv3.RateLimitDescriptor{svcDesc("user", "u"), svcDesc("ip", "i")}}); err != nil {
		t.Fatalf("Redis up: %v", err)
	}
	r.Kill()
	for n := 1; n <= 3; n++ {
		ds := []*ratelimitv3.RateLimitDescriptor{svcDesc("user", "u"), svcDesc("ip", "i"), svcDesc("tenant", "t")}[:n]
		for i := range 3 {
			_, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "hard", Descriptors: ds})
			msg := status.Convert(err).Message()
			if status.Code(err) != codes.Unavailable || !strings.HasPrefix(msg, "rate limit backend unavailable") || strings.Contains(msg, "127.0.0.1") {
				t.Fatalf("%d descriptors, call %d: %v, want UNAVAILABLE without addresses", n, i+1, err)
			}
		}
	}
	if out := p.Output(); strings.Contains(out, "panic") {
		t.Fatalf("rls logged a panic:\n%s", out)
	}
}
