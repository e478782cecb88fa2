package integration

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/redistest"
	"github.com/rls-project/rls/internal/rlstest"
)

// startLoaded starts rls built without the race detector, whatever the tests run with: these
// tests hold admissions to a limit's bound under a load that must saturate the key, which
// three race-built replicas on two cores cannot be relied on to do.
func startLoaded(t *testing.T, args ...string) *rlsProc {
	t.Helper()
	for _, flag := range []string{"--grpc-addr", "--http-addr", "--debug-addr"} {
		args = append(args, flag, "127.0.0.1:0")
	}
	p := &rlsProc{rlstest.Launch(t, rlstest.BuildBinary(t, false), nil, args...)}
	p.WaitReady(t)
	return p
}

// admissions records, across replicas, when each admitted request was sent and answered, to
// hold the admitted count of every window to what the limit allows.
type admissions struct {
	mu      sync.Mutex
	sent    []time.Time
	replied []time.Time
	asked   int
}

// load sends requests on domain's key=value to c from workers goroutines until stop is closed,
// recording the admitted ones.
func (a *admissions) load(t *testing.T, c rlsv3.RateLimitServiceClient, domain, key, value string, workers int, stop <-chan struct{}) *sync.WaitGroup {
	t.Helper()
	var wg sync.WaitGroup
	req := &rlsv3.RateLimitRequest{Domain: domain, Descriptors: oneDesc(d(key, value))}
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				sent := time.Now()
				resp, err := c.ShouldRateLimit(ctx, req)
				cancel()
				if err != nil {
					t.Error(err)
					return
				}
				a.record(sent, resp)
			}
		})
	}
	return &wg
}

// once sends one request on domain's key=value to c, recording it if admitted.
func (a *admissions) once(t *testing.T, c rlsv3.RateLimitServiceClient, domain, key, value string) {
	t.Helper()
	sent := time.Now()
	resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: oneDesc(d(key, value))})
	if err != nil {
		t.Fatal(err)
	}
	a.record(sent, resp)
}

func (a *admissions) record(sent time.Time, resp *rlsv3.RateLimitResponse) {
	replied := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	a.asked++
	if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
		a.sent = append(a.sent, sent)
		a.replied = append(a.replied, replied)
	}
}

// worstWindow checks every window of admissions against burst + rate·T + 1 (GCRA's bound: a
// full burst, then what the rate restores in T, the +1 the hit at T's very end): for each
// admission i and the admissions sent within span after it, all of them were decided between
// i's send and the latest reply among them, a window of that length. It returns the largest
// excess over the bound (≤ 0: none) and a description of that window.
func (a *admissions) worstWindow(burst, rate float64, per, span time.Duration) (excess float64, where string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	idx := make([]int, len(a.sent))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(x, y int) int { return a.sent[x].Compare(a.sent[y]) })
	excess = -burst
	step := max(1, len(idx)/2000) // the windows from every step-th admission
	for i := 0; i < len(idx); i += step {
		start := a.sent[idx[i]]
		last := start
		for j := i; j < len(idx) && a.sent[idx[j]].Sub(start) <= span; j++ {
			if r := a.replied[idx[j]]; r.After(last) {
				last = r
			}
			n := float64(j - i + 1)
			T := last.Sub(start)
			if e := n - (burst + rate*T.Seconds()/per.Seconds() + 1); e > excess {
				excess, where = e, fmt.Sprintf("%d admitted in %v from %v on (bound %.0f)", j-i+1, T.Round(time.Millisecond), start.Format("15:04:05.000"), burst+rate*T.Seconds()/per.Seconds()+1)
			}
		}
	}
	return excess, where
}

func (a *admissions) count() (admitted, asked int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.sent), a.asked
}

// TestLeasesDuringARollout: three replicas, two with a key's new rule (500 a second) and one
// still on the old (50 a second), all leasing. The old replica's leases are given back while
// the others saturate the key: a give-back re-expressed under the old rule and capped at its
// burst erased hundreds of the others' charges each time, and the key admitted past what the
// larger rule allows (burst + rate·T in any window). Given back in the key's own terms, it
// admits no more than that.
func TestLeasesDuringARollout(t *testing.T) {
	url := redistest.URL(t, redistest.SingleEnv)
	const rate = 500
	newRules := writeRules(t, map[string]string{"r.yaml": fmt.Sprintf("domain: rollout\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", rate)})
	oldRules := writeRules(t, map[string]string{"r.yaml": "domain: rollout\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 50}\n"})
	prefix := fmt.Sprintf("rollout-%d:", time.Now().UnixNano())
	args := []string{"--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix, "--redis-timeout", "5s", "--redis-lease-lifetime", "1s"}
	a := startLoaded(t, append([]string{"--config", newRules}, args...)...)
	c := startLoaded(t, append([]string{"--config", newRules}, args...)...)
	b := startLoaded(t, append([]string{"--config", oldRules}, args...)...)
	ac, bc, cc := a.client(t), b.client(t), c.client(t)
	var adm admissions
	for round := range 4 {
		// The key refills; a few requests on the old replica, which leases on them and leaves
		// most of its lease unused; then the others saturate the key while that lease ends and
		// goes back.
		time.Sleep(1200 * time.Millisecond)
		for range 12 {
			adm.once(t, bc, "rollout", "k", "v")
		}
		stop := make(chan struct{})
		wa := adm.load(t, ac, "rollout", "k", "v", 16, stop)
		wc := adm.load(t, cc, "rollout", "k", "v", 16, stop)
		time.Sleep(1500 * time.Millisecond)
		close(stop)
		wa.Wait()
		wc.Wait()
		if t.Failed() {
			return
		}
		t.Logf("round %d: leases on the old replica %v, hits given back %v, expired %v", round,
			metric(t, b.HTTPAddr, "rls_redis_leases_total", ""), metric(t, b.HTTPAddr, "rls_redis_lease_hits_returned_total", ""),
			metric(t, b.HTTPAddr, "rls_redis_lease_hits_expired_total", ""))
	}
	admitted, asked := adm.count()
	excess, where := adm.worstWindow(rate, rate, time.Second, 1500*time.Millisecond)
	t.Logf("%d admitted of %d; worst window: %s", admitted, asked, where)
	if admitted == asked {
		t.Fatalf("every one of %d requests admitted: the load never saturated the key, so the test shows nothing", asked)
	}
	if metric(t, b.HTTPAddr, "rls_redis_leases_total", "") == 0 {
		t.Fatal("the old replica took no lease: the test shows nothing")
	}
	if excess > 0 {
		t.Fatalf("%v over what the larger rule allows: %s", excess, where)
	}
}

// TestLeaseOfAPausedReplica: a replica holding leases is paused (SIGSTOP: a CPU throttle or a
// long GC pause does the same) while the key refills and two others saturate it; resumed
// mid-load, its leases have long ended. A give-back it then sends must give nothing: time
// restored those hits already, and giving them again admitted past burst + rate·T.
func TestLeaseOfAPausedReplica(t *testing.T) {
	url := redistest.URL(t, redistest.SingleEnv)
	const rate = 300
	rules := writeRules(t, map[string]string{"r.yaml": fmt.Sprintf("domain: paused\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", rate)})
	prefix := fmt.Sprintf("paused-%d:", time.Now().UnixNano())
	args := []string{"--config", rules, "--backend", "redis", "--redis-url", url, "--redis-key-prefix", prefix, "--redis-timeout", "5s", "--redis-lease-lifetime", "1s"}
	a := startLoaded(t, args...)
	b := startLoaded(t, args...)
	c := startLoaded(t, args...)

	// A leases, and is paused holding them.
	var before admissions
	stop := make(chan struct{})
	wg := before.load(t, a.client(t), "paused", "k", "v", 4, stop)
	deadline := time.Now().Add(20 * time.Second)
	for metric(t, a.HTTPAddr, "rls_redis_lease_hits_held", "") < 20 {
		if time.Now().After(deadline) {
			close(stop)
			wg.Wait()
			t.Fatal("replica A held no lease of 20 hits within 20s")
		}
		time.Sleep(2 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if held := metric(t, a.HTTPAddr, "rls_redis_lease_hits_held", ""); held == 0 {
		t.Fatal("replica A's leases ended before it was paused")
	}
	a.Pause(t)
	// The key refills (a burst is 1 s of its rate).
	time.Sleep(1500 * time.Millisecond)

	var adm admissions
	stop = make(chan struct{})
	wb := adm.load(t, b.client(t), "paused", "k", "v", 12, stop)
	wc := adm.load(t, c.client(t), "paused", "k", "v", 12, stop)
	time.Sleep(1500 * time.Millisecond)
	a.Resume(t)
	time.Sleep(1500 * time.Millisecond)
	close(stop)
	wb.Wait()
	wc.Wait()
	admitted, asked := adm.count()
	excess, where := adm.worstWindow(rate, rate, time.Second, 4*time.Second)
	t.Logf("%d admitted of %d; A's give-backs: %v given, %v expired; worst window: %s", admitted, asked,
		metric(t, a.HTTPAddr, "rls_redis_lease_hits_returned_total", ""), metric(t, a.HTTPAddr, "rls_redis_lease_hits_expired_total", ""), where)
	if admitted == asked {
		t.Fatalf("every one of %d requests admitted: the load never saturated the key, so the test shows nothing", asked)
	}
	if excess > 0 {
		t.Fatalf("%v over burst + rate·T: %s", excess, where)
	}
}
