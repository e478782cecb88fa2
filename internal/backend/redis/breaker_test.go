package redis

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/redistest"
)

// TestBreaker: with Redis killed every call fails with ErrUnavailable within the timeout, the
// breaker opens and fails fast; with Redis back (empty) it closes by itself and limits again.
func TestBreaker(t *testing.T) {
	for _, tc := range []struct {
		name     string
		coalesce int
	}{{"direct", 0}, {"coalesced", 16}} {
		t.Run(tc.name, func(t *testing.T) { testBreaker(t, tc.coalesce) })
	}
}

func testBreaker(t *testing.T, coalesce int) {
	r := redistest.Start(t)
	var changes []bool
	var mu sync.Mutex
	target, err := ParseURL("redis://" + r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(context.Background(), Options{Target: target, Timeout: time.Second, Coalesce: coalesce,
		BreakerFailures: 3, BreakerCooldown: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b.SubscribeHealth(func(h bool) { mu.Lock(); changes = append(changes, h); mu.Unlock() })
	defer b.Close()
	ctx := context.Background()
	l := limit.Limit{Rate: 3, Period: time.Hour, Burst: 3}
	decide := func() (bool, error) {
		out := make([]backend.Decision, 1)
		return b.Decide(ctx, []backend.Request{{Key: "k", Limit: l, Cost: 1}}, out)
	}
	for range 3 {
		if ok, err := decide(); !ok || err != nil {
			t.Fatalf("Redis up: admitted=%v err=%v", ok, err)
		}
	}
	r.Kill()
	for i := range 10 {
		start := time.Now()
		_, err := decide()
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("call %d with Redis down: err %v, want ErrUnavailable", i, err)
		}
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Fatalf("call %d with Redis down took %v, want within the 1s timeout", i, d)
		}
	}
	if b.Healthy() {
		t.Fatal("Healthy after 10 failures, want the breaker open")
	}
	if _, err := decide(); !errors.Is(err, errOpen) {
		t.Fatalf("breaker open: err %v, want %v", err, errOpen)
	}
	r.Start()
	deadline := time.Now().Add(5 * time.Second)
	for !b.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("breaker still open 5s after Redis came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Redis came back empty: the key has its full burst again, and is limited again.
	for i := range 4 {
		ok, err := decide()
		if err != nil || ok != (i < 3) {
			t.Fatalf("request %d after recovery: admitted=%v err=%v, want admitted=%v", i, ok, err, i < 3)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(changes) != "[false true]" {
		t.Fatalf("health changes %v, want [false true]", changes)
	}
}

// TestStalledRedis: a Redis that accepts commands but does not answer (stopped with SIGSTOP)
// costs each of many concurrent calls its timeout and no more, coalesced or not, leaves no
// goroutine behind, and once Redis answers again calls succeed.
func TestStalledRedis(t *testing.T) {
	for _, tc := range []struct {
		name     string
		coalesce int
	}{{"direct", 0}, {"coalesced", 4}} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.Start(t)
			target, _ := ParseURL("redis://" + r.Addr())
			const timeout = 50 * time.Millisecond
			b, err := New(context.Background(), Options{Target: target, Timeout: timeout, Coalesce: tc.coalesce,
				BreakerFailures: 1 << 20}) // keep calling Redis: the timeouts are under test
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
			call := func(i int) (time.Duration, error) {
				start := time.Now()
				out := make([]backend.Decision, 1)
				_, err := b.Decide(context.Background(), []backend.Request{{Key: "k" + strconv.Itoa(i), Limit: l, Cost: 1}}, out)
				return time.Since(start), err
			}
			if _, err := call(0); err != nil {
				t.Fatal(err)
			}
			goroutines := runtime.NumGoroutine()
			if err := r.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var slow, ok atomic.Int64
			for g := range 16 {
				wg.Go(func() {
					for i := range 5 {
						took, err := call(g*10 + i)
						if !errors.Is(err, backend.ErrUnavailable) {
							ok.Add(1)
						}
						if took > timeout+250*time.Millisecond {
							slow.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if err := r.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if ok.Load() > 0 || slow.Load() > 0 {
				t.Fatalf("Redis stalled: %d of 80 calls did not fail with ErrUnavailable, %d took longer than %v", ok.Load(), slow.Load(), timeout+250*time.Millisecond)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				if _, err := call(1000); err == nil {
					break
				} else if time.Now().After(deadline) {
					t.Fatalf("Redis answering again, but: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			for n := runtime.NumGoroutine(); n > goroutines+2; n = runtime.NumGoroutine() {
				if time.Now().After(deadline) {
					t.Fatalf("%d goroutines after the stall, %d before", n, goroutines)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func TestStartsWithRedisDown(t *testing.T) {
	r := redistest.Start(t)
	r.Kill()
	target, _ := ParseURL("redis://" + r.Addr())
	b, err := New(context.Background(), Options{Target: target, Timeout: 100 * time.Millisecond, BreakerCooldown: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("New with Redis down: %v, want a backend that waits for Redis", err)
	}
	defer b.Close()
	if b.Healthy() {
		t.Fatal("Healthy with Redis down")
	}
	out := make([]backend.Decision, 1)
	if _, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: limit.Limit{Rate: 1, Period: time.Second, Burst: 1}, Cost: 1}}, out); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("Decide with Redis down: %v, want ErrUnavailable", err)
	}
	r.Start()
	deadline := time.Now().Add(5 * time.Second)
	for !b.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("not healthy 5s after Redis started")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
