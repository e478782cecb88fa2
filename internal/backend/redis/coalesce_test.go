package redis

import (
	"context"
	"errors"
	"math"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/pipeline"
)

// The coalescer's own tests are internal/pipeline's; these are of a node's use of it.

// TestCoalescerLeaderRedisHung: with Redis stopped (SIGSTOP), a lone caller, which leads, still
// answers within its budget: its pipeline's read gives up at its deadline, far before the
// socket timeout (1s). Its connection is dropped, and decisions succeed again once Redis
// answers.
func TestCoalescerLeaderRedisHung(t *testing.T) {
	b, r := newOwnBackend(t, Options{Coalesce: 64})
	n := b.single
	var leads atomic.Int64
	// The node's coalescer again, counting leaders' pipelines.
	n.co.Close()
	n.co = pipeline.New(func(calls []*call, deadline time.Time, lead bool) bool {
		if lead {
			leads.Add(1)
		}
		return n.sendPipeline(calls, deadline, lead)
	}, pipeline.Options{Max: 64, Senders: 1, Slow: n.kickProbe, SlowAfter: slowAfter})
	l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
	decide := func(i int) (time.Duration, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 40*time.Millisecond)
		defer cancel()
		budget := b.Budget(ctx)
		start := time.Now()
		_, err := b.Decide(ctx, []backend.Request{{Key: "h" + strconv.Itoa(i), Limit: l, Cost: 1}}, make([]backend.Decision, 1))
		return time.Since(start) - budget, err
	}
	if _, err := decide(0); err != nil {
		t.Fatal(err)
	}
	if leads.Load() != 1 {
		t.Fatalf("a lone decision: %d leaders' pipelines, want 1", leads.Load())
	}
	if err := r.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	before := leads.Load()
	for i := 1; i <= 5 && b.Healthy(); i++ {
		over, err := decide(i)
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("Redis stopped: %v, want ErrUnavailable", err)
		}
		// A leader reading until the socket timeout would be 1s late; on a busy machine a
		// decision may wait a little for a CPU.
		if over > 500*time.Millisecond {
			t.Fatalf("Redis stopped: a lone decision answered %v past its budget", over)
		}
	}
	if leads.Load() == before {
		t.Fatal("no lone decision led with Redis stopped")
	}
	if err := r.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for i := 100; ; i++ {
		if _, err := decide(i); err == nil {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("5s after Redis came back: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStarved: a probe of timeout 1s is inconclusive when a tenth or more of the waits for a
// CPU during it lasted 100ms or longer, or one of them lasted 500ms or longer.
func TestStarved(t *testing.T) {
	h := func(counts ...uint64) *metrics.Float64Histogram {
		// Buckets: [0, 1ms), [1ms, 100ms), [100ms, 500ms), [500ms, +Inf).
		return &metrics.Float64Histogram{Counts: counts, Buckets: []float64{0, 0.001, 0.1, 0.5, math.Inf(1)}}
	}
	for _, tc := range []struct {
		before, after *metrics.Float64Histogram
		want          bool
	}{
		{h(10, 0, 0, 0), h(110, 0, 0, 0), false},    // all quick
		{h(10, 0, 0, 0), h(100, 9, 1, 0), false},    // 1 of 100 slow, none very slow
		{h(10, 0, 0, 0), h(100, 0, 10, 0), true},    // 10 of 100 slow
		{h(10, 0, 0, 0), h(10000, 0, 0, 1), true},   // 1 of 10,000 very slow: maybe the probe's
		{h(0, 0, 5, 1), h(0, 0, 5, 1), false},       // no waits between the samples
		{nil, h(0, 0, 5, 0), false},                 // no sample
		{h(0, 0, 5), h(0, 0, 9, 0), false},          // different shapes
		{h(1000, 0, 0, 0), h(1000, 0, 30, 0), true}, // only slow ones since
	} {
		if got := starved(tc.before, tc.after, time.Second); got != tc.want {
			t.Errorf("starved(%v, %v) = %v, want %v", tc.before, tc.after, got, tc.want)
		}
	}
	if schedLatencies() == nil {
		t.Error("the runtime reports no /sched/latencies:seconds")
	}
}

// TestBacklogged: goroutines still waiting for a CPU, which the histogram of waits cannot count
// yet, show in the depth of the run queues. (Without it, TestOverloadKeepsBreakerClosed took its
// saturated process, a thousand goroutines runnable on one P, for a slow Redis about one run in
// eight.)
func TestBacklogged(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var stop atomic.Bool
	var wg sync.WaitGroup
	var seen bool
	for range 3 * backlogPerP {
		wg.Go(func() {
			for !stop.Load() {
				runtime.Gosched()
			}
		})
	}
	// This goroutine waits behind the others too: a few turns are enough for all of them to be
	// runnable at once.
	for i := 0; i < 100 && !seen; i++ {
		runtime.Gosched()
		seen = backlogged()
	}
	if !seen {
		t.Errorf("%d goroutines runnable on one P: backlogged() = false", 3*backlogPerP)
	}
	stop.Store(true)
	wg.Wait()
	if backlogged() {
		t.Error("backlogged() = true with the goroutines gone")
	}
}
