package integration

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/redistest"
)

// hotRules: keys that lease under the tests' load: per minute for the killed replica (a lease
// of at most 33 hits under a 2s lifetime), per day for the give-back test (a lease of at most
// 115 hits under a 10s lifetime, and time restores one hit every 86.4ms).
const hotRules = `
domain: lease
descriptors:
  - key: minute
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: daily
    rate_limit: {unit: day, requests_per_unit: 1000000}
`

// drive sends requests on key=value to c from 4 goroutines, each pausing for pause after each
// request, until stop returns true, and returns how many were admitted.
func drive(t *testing.T, c rlsv3.RateLimitServiceClient, key, value string, pause time.Duration, stop func() bool) int64 {
	t.Helper()
	ctx := ctxT(t)
	var admitted atomic.Int64
	var done atomic.Bool
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for !done.Load() {
				resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "lease", Descriptors: oneDesc(d(key, value))})
				if err != nil {
					t.Error(err)
					done.Store(true)
					return
				}
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
					admitted.Add(1)
				}
				time.Sleep(pause)
			}
		})
	}
	deadline := time.Now().Add(20 * time.Second)
	for !stop() && !t.Failed() {
		if time.Now().After(deadline) {
			done.Store(true)
			wg.Wait()
			t.Fatal("the condition did not hold within 20s of load")
		}
		time.Sleep(5 * time.Millisecond)
	}
	done.Store(true)
	wg.Wait()
	return admitted.Load()
}

// holdLease drives key=value on p until, with the load stopped, p holds a lease on it, and
// returns the hits admitted and those held.
func holdLease(t *testing.T, p *rlsProc, key, value string, pause time.Duration) (admitted int64, held float64) {
	t.Helper()
	c := p.client(t)
	deadline := time.Now().Add(20 * time.Second)
	for held == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no lease held within 20s")
		}
		admitted += drive(t, c, key, value, pause, func() bool {
			return metric(t, p.HTTPAddr, "rls_redis_lease_hits_held", "") > 0
		})
		held = metric(t, p.HTTPAddr, "rls_redis_lease_hits_held", "")
	}
	return admitted, held
}

// leaseStatus sends one request on key=value to c and returns its status.
func leaseStatus(t *testing.T, c rlsv3.RateLimitServiceClient, key, value string) *rlsv3.RateLimitResponse_DescriptorStatus {
	t.Helper()
	resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "lease", Descriptors: oneDesc(d(key, value))})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("%s=%s: %v, want OK", key, value, resp.GetOverallCode())
	}
	return resp.GetStatuses()[0]
}

// TestLeaseKilledReplica: a replica killed (SIGKILL) while it holds a lease on a hot key never
// gives it back. The key (1000 a minute: a hit every 60ms) is driven on replica A far faster
// than its rate, so its state in Redis is exactly the hits charged, less what time restored:
// just after the kill, replica B sees the held hits missing, and the lease is no more than the
// rate restores in a lifetime, so its hits delay the key's reset by at most the lifetime.
func TestLeaseKilledReplica(t *testing.T) {
	url := redistest.URL(t, redistest.SingleEnv)
	rules := writeRules(t, map[string]string{"lease.yaml": hotRules})
	prefix := fmt.Sprintf("lease-kill-%d:", time.Now().UnixNano())
	const lifetime, burst, interval = 2 * time.Second, 1000, 60 * time.Millisecond
	args := []string{"--config", rules, "--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix, "--redis-timeout", "5s"}
	a := startRLS(t, nil, append(args, "--redis-lease-lifetime", lifetime.String())...)
	b := startRLS(t, nil, append(args, "--redis-leases=false")...)
	start := time.Now()
	admitted, held := holdLease(t, a, "minute", "k", 10*time.Millisecond)
	if max := float64(lifetime / interval); held > max {
		t.Fatalf("a lease of %v hits: more than the %v the rate restores in a lifetime", held, max)
	}
	a.Signal(t, syscall.SIGKILL)
	<-a.Done()
	st := leaseStatus(t, b.client(t), "minute", "k")
	restored := int64(time.Since(start)/interval) + 1
	reset := st.GetDurationUntilReset().AsDuration()
	t.Logf("killed holding %v hits after %d admitted: %d remaining, reset in %v, up to %d restored", held, admitted, st.GetLimitRemaining(), reset, restored)
	// Had the lease been given back, the remaining would be higher by the hits it held.
	if got, most := int64(st.GetLimitRemaining()), burst-1-admitted-int64(held)+restored; got > most {
		t.Fatalf("%d remaining just after the kill, want at most %d: the %v hits held are not missing", got, most, held)
	}
	if most := time.Duration(admitted+1)*interval + lifetime; reset > most {
		t.Fatalf("reset in %v after the kill: want at most the admitted hits' time and the lifetime, %v", reset, most)
	}
}

// TestLeaseGivenBackThroughRLS: a rule reload and a shutdown (SIGTERM) give back what the
// replica's leases hold: the metrics count it, and another replica then sees exactly the hits
// admitted, less what time restored since.
func TestLeaseGivenBackThroughRLS(t *testing.T) {
	url := redistest.URL(t, redistest.SingleEnv)
	rules := writeRules(t, map[string]string{"lease.yaml": hotRules})
	prefix := fmt.Sprintf("lease-back-%d:", time.Now().UnixNano())
	args := []string{"--config", rules, "--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix, "--redis-timeout", "5s"}
	a := startRLS(t, nil, append(args, "--redis-lease-lifetime", "10s")...)
	b := startRLS(t, nil, append(args, "--redis-leases=false")...)
	const burst = 1000000
	start := time.Now()
	var admitted int64
	// remaining checks what b sees against what was admitted: exact but for the hits time
	// restored since start (one per 86.4ms) and b's own.
	remaining := func(what string, want int64) {
		t.Helper()
		st := leaseStatus(t, b.client(t), "daily", "k")
		admitted++ // b's own
		restored := int64(time.Since(start)/(86400*time.Microsecond)) + 1
		got := int64(st.GetLimitRemaining())
		t.Logf("%s: %d remaining, want %d (less up to %d restored)", what, got, want-1, restored)
		if got < want-1 || got > want-1+restored {
			t.Fatalf("%s: %d remaining, want %d, or up to %d more restored by time", what, got, want-1, restored)
		}
	}
	// A give-back returns only the lease's hits still ahead of now (decide.lua's giveback): a
	// key holding just the lease and the few hits before it would have some restored by time
	// before a slow reload gives them back. A charge of 1000 hits (86s) first keeps every
	// hit of the test ahead, so that exactly the held hits go back.
	c := b.client(t)
	if resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "lease", Descriptors: oneDesc(d("daily", "k")), HitsAddend: 1000}); err != nil {
		t.Fatal(err)
	} else if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("a charge of 1000 hits: %v, want OK", resp.GetOverallCode())
	}
	admitted += 1000
	for round, end := range []string{"reload", "shutdown"} {
		n, held := holdLease(t, a, "daily", "k", 0)
		admitted += n
		returned := metric(t, a.HTTPAddr, "rls_redis_lease_hits_returned_total", "")
		remaining(fmt.Sprintf("round %d with %v hits leased", round, held), burst-admitted-int64(held))
		switch end {
		case "reload":
			gen := metric(t, a.HTTPAddr, "rls_config_loads_total", `{result="success"}`)
			if err := os.WriteFile(filepath.Join(rules, "lease.yaml"), []byte(hotRules+"  - key: other\n    rate_limit: {unit: day, requests_per_unit: "+strconv.Itoa(round+1)+"}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for metric(t, a.HTTPAddr, "rls_config_loads_total", `{result="success"}`) == gen ||
				metric(t, a.HTTPAddr, "rls_redis_lease_hits_held", "") != 0 {
				if time.Now().After(deadline) {
					t.Fatal("no reload giving back the leases within 10s")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if got := metric(t, a.HTTPAddr, "rls_redis_lease_hits_returned_total", "") - returned; got != held {
				t.Fatalf("reload gave back %v hits, want the %v held", got, held)
			}
		case "shutdown":
			a.Signal(t, syscall.SIGTERM)
			<-a.Done()
		}
		remaining(fmt.Sprintf("after the %s", end), burst-admitted)
	}
}
