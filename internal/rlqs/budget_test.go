package rlqs

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestReportBudget: reports reserve their bytes up to the budget; one that does not fit waits
// for a release, in the order it came, or is refused when its wait ends, when its stream ends,
// when the reports already waiting hold a budget's worth, or when it is larger than the budget.
func TestReportBudget(t *testing.T) {
	ctx := context.Background()
	b := newReportBudget(100)
	if !b.acquire(ctx, 60, 0) || !b.acquire(ctx, 40, 0) {
		t.Fatal("100 bytes of a budget of 100 not reserved")
	}
	if b.acquire(ctx, 1, 0) {
		t.Fatal("a byte past the budget reserved without waiting")
	}
	if b.acquire(ctx, 101, time.Hour) {
		t.Fatal("a report larger than the budget reserved")
	}
	if b.acquire(ctx, 10, 20*time.Millisecond) {
		t.Fatal("reserved with nothing released")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if b.acquire(cctx, 10, time.Hour) {
		t.Fatal("reserved for a stream that ended")
	}

	// Two waiters, 70 then 30: the release of 60 is not enough for the first, and the second
	// does not pass it; the release of 40 grants both in turn.
	var order []int64
	var mu sync.Mutex
	var wg sync.WaitGroup
	waiting := func(n int64) {
		for start := time.Now(); ; time.Sleep(time.Millisecond) {
			b.mu.Lock()
			w := b.waiting
			b.mu.Unlock()
			if w == n {
				return
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%d bytes waiting, want %d", w, n)
			}
		}
	}
	for _, n := range []int64{70, 30} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if !b.acquire(ctx, n, time.Hour) {
				t.Errorf("%d bytes not reserved", n)
				return
			}
			mu.Lock()
			order = append(order, n)
			mu.Unlock()
		}()
		waiting(map[int64]int64{70: 70, 30: 100}[n])
	}
	// A budget's worth waits already: one more is refused at once.
	if b.acquire(ctx, 1, time.Hour) {
		t.Fatal("reserved past a budget's worth of waiting reports")
	}
	b.release(60)
	b.mu.Lock()
	queued, used := len(b.queue), b.used
	b.mu.Unlock()
	if queued != 2 || used != 40 {
		t.Fatalf("with 60 free and 70 at the head: %d queued, %d in use; want both queued (30 does not pass 70), 40", queued, used)
	}
	b.release(40)
	wg.Wait()
	if len(order) != 2 || b.inUse() != 100 {
		t.Fatalf("granted %v, %d in use; want 70 and 30, 100", order, b.inUse())
	}
	b.release(70)
	b.release(30)
	if b.inUse() != 0 || b.waiting != 0 || len(b.queue) != 0 {
		t.Fatalf("after every release: %d in use, %d waiting, %d queued", b.inUse(), b.waiting, len(b.queue))
	}
}

// TestReportBudgetConcurrent: many reports reserving and releasing at once, some giving up,
// never hold more than the budget, and leave nothing reserved or waiting.
func TestReportBudgetConcurrent(t *testing.T) {
	b := newReportBudget(1000)
	var held, most atomic.Int64
	var wg sync.WaitGroup
	for i := range 64 {
		wg.Go(func() {
			for j := range 50 {
				n := int64(1 + (i*37+j*11)%400)
				if !b.acquire(context.Background(), n, time.Duration(j%3)*time.Millisecond) {
					continue
				}
				h := held.Add(n)
				for m := most.Load(); h > m && !most.CompareAndSwap(m, h); m = most.Load() {
				}
				held.Add(-n)
				b.release(n)
			}
		})
	}
	wg.Wait()
	if most.Load() > 1000 {
		t.Errorf("%d bytes held at once, budget 1000", most.Load())
	}
	if b.inUse() != 0 || b.waiting != 0 || len(b.queue) != 0 {
		t.Errorf("at the end: %d in use, %d waiting, %d queued", b.inUse(), b.waiting, len(b.queue))
	}
}
