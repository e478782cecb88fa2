package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestBreaker: threshold consecutive failures open it (a success between them starts the count
// over), the probe runs every cooldown while it fails, its first success closes the breaker,
// and onChange hears each change once, with the failure that opened it.
func TestBreaker(t *testing.T) {
	var probes atomic.Int64
	var up atomic.Bool
	var mu sync.Mutex
	var changes []string
	br := New(3, 5*time.Millisecond, func(ctx context.Context) error {
		probes.Add(1)
		if _, ok := ctx.Deadline(); !ok {
			t.Error("a probe without a deadline")
		}
		if up.Load() {
			return nil
		}
		return errors.New("still down")
	}, func(healthy bool, cause error) {
		mu.Lock()
		changes = append(changes, fmt.Sprint(healthy, cause))
		mu.Unlock()
	})
	defer br.Close()
	boom := errors.New("boom")
	br.Failure(boom)
	br.Failure(boom)
	br.Success()
	br.Failure(boom)
	br.Failure(boom)
	if !br.Allow() {
		t.Fatal("open after 2 consecutive failures, want closed below 3")
	}
	br.Failure(boom)
	if br.Allow() {
		t.Fatal("closed after 3 consecutive failures, want open")
	}
	br.Trip(errors.New("again")) // open already: no second change
	waitFor(t, func() bool { return probes.Load() >= 3 })
	if br.Allow() {
		t.Fatal("closed while the probe fails")
	}
	up.Store(true)
	waitFor(t, br.Allow)
	br.Failure(boom) // the count started over when it closed
	if !br.Allow() {
		t.Fatal("open after one failure following a recovery")
	}
	mu.Lock()
	defer mu.Unlock()
	if got, want := fmt.Sprint(changes), "[false boom true <nil>]"; got != want {
		t.Fatalf("changes %s, want %s", got, want)
	}
}

// TestBreakerClose: Close stops a probe that never succeeds, and waits for it; a Trip after
// Close opens nothing and starts no probe.
func TestBreakerClose(t *testing.T) {
	var probes atomic.Int64
	br := New(1, time.Millisecond, func(context.Context) error { probes.Add(1); return errors.New("down") }, nil)
	br.Failure(errors.New("down"))
	waitFor(t, func() bool { return probes.Load() > 0 })
	br.Close()
	n := probes.Load()
	time.Sleep(20 * time.Millisecond)
	if probes.Load() != n {
		t.Fatal("the probe ran after Close")
	}
	br2 := New(1, time.Millisecond, func(context.Context) error { probes.Add(1); return nil }, nil)
	br2.Close()
	br2.Trip(errors.New("down"))
	if !br2.Allow() {
		t.Fatal("a breaker closed for good opened")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("not within 10s")
		}
		time.Sleep(time.Millisecond)
	}
}
