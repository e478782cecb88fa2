package integration

import (
	"context"
	"errors"
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
)

const overloadRules = `domain: load
descriptors:
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1000000000, burst: 1000000000}
  - key: user
    # A year, not a day: at 1000 a day one request's worth comes back every 86 s, and a run
    # on a busy machine can last that long, so that remaining counts would not be exact.
    rate_limit: {unit: year, requests_per_unit: 1000}
`

func ovlRequest(key, value string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "load", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}}}
}

// ovlMetric returns the value of the first sample whose name and labels start with prefix.
func ovlMetric(t *testing.T, p *rlsProc, prefix string) float64 {
	t.Helper()
	for k, v := range metricValues(t, p.HTTPAddr) {
		if strings.HasPrefix(k, prefix) {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("%s %s: %v", k, v, err)
			}
			return f
		}
	}
	return 0
}

// TestOverloadIsNotARedisFailure saturates a real rls on one CPU (GOMAXPROCS=1) with far more
// clients than it can serve, each with Envoy's 20ms deadline, against a healthy Redis: what
// cannot be decided in time is answered by the failure mode and counted as overload, and the
// circuit breaker never opens. (Under the race detector most clients give up before any
// answer reaches them; what is checked is what rls counted and did.)
func TestOverloadIsNotARedisFailure(t *testing.T) {
	r := redistest.Start(t)
	rules := writeRules(t, map[string]string{"rules.yaml": overloadRules})
	p := startRLS(t, []string{"GOMAXPROCS=1"}, "--config", rules, "--backend", "redis", "--redis-url", r.URL())
	c := p.client(t)
	var ok, unavailable, other atomic.Int64
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := range 400 {
		wg.Go(func() {
			req := ovlRequest("api_key", "k"+strconv.Itoa(g))
			for time.Now().Before(stop) {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				_, err := c.ShouldRateLimit(ctx, req)
				cancel()
				switch status.Code(err) {
				case codes.OK:
					ok.Add(1)
				case codes.Unavailable:
					unavailable.Add(1)
				default:
					other.Add(1) // deadline exceeded on the client's side, mostly
				}
			}
		})
	}
	wg.Wait()
	shed := ovlMetric(t, p, "rls_overload_shed_total")
	canceled := ovlMetric(t, p, `rls_backend_errors_total{kind="canceled"}`)
	t.Logf("OK %d, UNAVAILABLE %d, other %d; rls_overload_shed_total %v, canceled %v", ok.Load(), unavailable.Load(), other.Load(), shed, canceled)
	if strings.Contains(p.Output(), "circuit breaker open") {
		t.Fatalf("the breaker opened with Redis healthy:\n%s", p.Output())
	}
	if up := ovlMetric(t, p, "rls_backend_up"); up != 1 {
		t.Fatalf("rls_backend_up %v after the run, want 1", up)
	}
	// Overload shows as decisions shed, or as callers that left first (their deadline passed
	// while the call waited in rls, before its budget did: the server's deadline runs from when
	// rls read the call), or as calls that never reached the backend: which of these a run
	// shows depends on scheduling. Never as the backend failing.
	for _, kind := range []string{"unavailable", "timeout", "other"} {
		if n := ovlMetric(t, p, `rls_backend_errors_total{kind="`+kind+`"}`); n != 0 {
			t.Fatalf("rls_backend_errors_total{kind=%q} = %v with Redis healthy (shed %v, canceled %v)", kind, n, shed, canceled)
		}
	}
	if other.Load() == 0 && shed == 0 {
		t.Fatal("no caller ran out of time and no decision was shed: the run did not overload rls")
	}
	// Once the load is gone, decisions are exact again. The backlog of calls the load left
	// (read before their callers gave up) may take a one-CPU, race-built rls a few seconds more
	// to clear: each try asks about a key of its own, so that one that timed out on this side
	// but was decided on rls's cannot change what the next one is told.
	for try := range 6 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := c.ShouldRateLimit(ctx, ovlRequest("user", "after-"+strconv.Itoa(try)))
		cancel()
		if status.Code(err) == codes.DeadlineExceeded && try < 5 {
			continue
		}
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 999 {
			t.Fatalf("after the load (try %d): %v %v, want OK with 999 remaining", try+1, resp, err)
		}
		break
	}
}

// TestTinyDeadlines: many clients whose deadlines are 1ms beside an ordinary one: they are shed
// without reaching Redis, the breaker stays closed, and the ordinary client is answered
// exactly every time.
func TestTinyDeadlines(t *testing.T) {
	r := redistest.Start(t)
	rules := writeRules(t, map[string]string{"rules.yaml": overloadRules})
	// A generous cap: the ordinary client must not fail for a CPU shared with the race detector.
	p := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", r.URL(), "--redis-timeout", "1s")
	c := p.client(t)
	// The ordinary caller is another client, on a connection of its own, as it would be.
	ordinary := p.client(t)
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			req := ovlRequest("api_key", "tiny"+strconv.Itoa(g))
			for {
				select {
				case <-done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
				_, _ = c.ShouldRateLimit(ctx, req)
				cancel()
			}
		})
	}
	var failed error
	for i := range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		resp, err := ordinary.ShouldRateLimit(ctx, ovlRequest("user", "ordinary"))
		cancel()
		if err == nil && (resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != uint32(999-i)) {
			err = errors.New(resp.String())
		}
		if err != nil {
			failed = err
			t.Errorf("ordinary call %d: %v, want OK with %d remaining", i, err, 999-i)
			break
		}
	}
	close(done)
	wg.Wait()
	if failed != nil {
		return
	}
	if strings.Contains(p.Output(), "circuit breaker open") {
		t.Fatalf("the breaker opened with Redis healthy:\n%s", p.Output())
	}
	if shed := ovlMetric(t, p, "rls_overload_shed_total"); shed == 0 {
		t.Fatal("no 1ms caller was counted as shed")
	}
}
