package redis

import (
	"fmt"
	"math"
	"runtime/metrics"
	"sync"
	"testing"
	"time"
)

// fakeSend records the pipelines a coalescer sends and answers each call with its position;
// hold, when set, keeps a pipeline in flight until it is closed.
type fakeSend struct {
	mu        sync.Mutex
	pipelines [][]string // the first key of each call, per pipeline
	started   chan struct{}
	hold      chan struct{}
}

func (f *fakeSend) send(calls []*call, _ time.Time) {
	if f.started != nil {
		f.started <- struct{}{}
	}
	if f.hold != nil {
		<-f.hold
	}
	var keys []string
	for i, c := range calls {
		keys = append(keys, c.keys[0])
		c.threshold = int64(i) // the reply: where it went
	}
	f.mu.Lock()
	f.pipelines = append(f.pipelines, keys)
	f.mu.Unlock()
}

func pendingFor(keys ...string) *pending {
	p := newPending()
	for _, k := range keys {
		p.calls = append(p.calls, &call{keys: []string{k}})
	}
	return p
}

// TestCoalescer: while a pipeline is in flight, callers queue; the next pipeline takes them in
// order, up to max calls but at least one caller's; a caller whose budget passes while queued
// is dropped unsent, one in flight is abandoned and its pipeline still completes.
func TestCoalescer(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newCoalescer(f.send, nil, 3, 1)
	defer c.close()
	never := make(chan struct{})

	type result struct {
		name string
		res  waitResult
	}
	results := make(chan result, 10)
	do := func(name string, p *pending, budget time.Duration) {
		res := c.do(p, time.Now().Add(budget), never)
		results <- result{name, res}
	}
	go do("first", pendingFor("a"), time.Minute)
	<-f.started // "first" is in flight, held

	// Queued behind it: b (2 calls), c (1), d (2), and e with a tiny budget.
	for i, x := range []struct {
		name string
		keys []string
	}{{"b", []string{"b1", "b2"}}, {"c", []string{"c1"}}, {"d", []string{"d1", "d2"}}} {
		go do(x.name, pendingFor(x.keys...), time.Minute)
		waitQueued(t, c, i+1) // so that they queue in this order
	}
	e := pendingFor("e1")
	if res := c.do(e, time.Now().Add(time.Millisecond), never); res != unsent {
		t.Fatalf("queued past its budget: %v, want unsent", res)
	}
	close(f.hold)
	got := map[string]waitResult{}
	for range 4 {
		r := <-results
		got[r.name] = r.res
	}
	for name, res := range got {
		if res != replied {
			t.Fatalf("%s: %v, want replied", name, res)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	// b and c fit in 3 calls; d goes next, alone; e never leaves.
	if want := "[[a] [b1 b2 c1] [d1 d2]]"; fmt.Sprint(f.pipelines) != want {
		t.Fatalf("pipelines %v, want %s", f.pipelines, want)
	}
}

func waitQueued(t *testing.T, c *coalescer, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c.mu.Lock()
		q := len(c.queue)
		c.mu.Unlock()
		if q >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue holds %d callers, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCoalescerAbandon: a caller whose budget passes while its call is in flight returns
// inFlight at once; the sender completes the pipeline and does
// not signal the abandoned caller. A canceled caller returns canceled.
func TestCoalescerAbandon(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newCoalescer(f.send, nil, 8, 1)
	defer c.close()
	p := pendingFor("a")
	if res := c.do(p, time.Now().Add(20*time.Millisecond), nil); res != inFlight {
		t.Fatalf("in flight past the budget: %v, want inFlight", res)
	}
	close(f.hold)
	// The sender finishes the abandoned pipeline; the next caller goes out normally.
	q := pendingFor("b")
	if res := c.do(q, time.Now().Add(time.Minute), nil); res != replied {
		t.Fatalf("after an abandoned call: %v, want replied", res)
	}
	if len(p.wake) != 0 {
		t.Fatal("the abandoned caller was signalled")
	}

	done := make(chan struct{})
	f2 := &fakeSend{hold: make(chan struct{})}
	c2 := newCoalescer(f2.send, nil, 8, 1)
	go func() { time.Sleep(10 * time.Millisecond); close(done) }()
	if res := c2.do(pendingFor("x"), time.Now().Add(time.Minute), done); res != canceled {
		t.Fatalf("canceled caller: %v, want canceled", res)
	}
	close(f2.hold)
	c2.close()
}

// TestCoalescerBudgetBeforeCancel: a caller whose budget has passed when its context also ended
// ran out of budget (overload), not canceled, however select picks between the two.
func TestCoalescerBudgetBeforeCancel(t *testing.T) {
	f := &fakeSend{hold: make(chan struct{})}
	c := newCoalescer(f.send, nil, 8, 1)
	defer func() { close(f.hold); c.close() }()
	done := make(chan struct{})
	close(done)
	for i := range 200 {
		// A budget of 1ns has passed by the time do selects; done is ready from the start.
		if res := c.do(pendingFor(fmt.Sprint("k", i)), time.Now().Add(time.Nanosecond), done); res == canceled {
			t.Fatalf("call %d: canceled, want its budget reported as run out", i)
		}
	}
}

// TestCoalescerReuse: a pending entry is reused across many decisions, as Decide's pooled jobs
// are, with no stale wake-up or timer firing into the next use.
func TestCoalescerReuse(t *testing.T) {
	f := &fakeSend{}
	c := newCoalescer(f.send, nil, 4, 2)
	defer c.close()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			p := pendingFor(fmt.Sprint("k", g))
			for i := range 500 {
				if res := c.do(p, time.Now().Add(time.Minute), nil); res != replied {
					t.Errorf("caller %d, use %d: %v", g, i, res)
					return
				}
				if len(p.wake) != 0 {
					t.Errorf("caller %d, use %d: a stale wake-up", g, i)
					return
				}
			}
		})
	}
	wg.Wait()
}

func (r waitResult) String() string {
	return [...]string{"replied", "unsent", "inFlight", "canceled"}[r]
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

// do is submit then await, as a decision on one node does them: it queues p's calls and waits until they are answered, deadline has passed or done is closed.
// For any result but replied and unsent, p may still belong to its sender: the caller must not
// reuse it. The deadline is absolute, fixed before the caller may wait for the lock: a budget
// counted from here would start late on a starved machine and outlast the caller's own
// deadline.
func (c *coalescer) do(p *pending, deadline time.Time, done <-chan struct{}) waitResult {
	if !c.submit(p, deadline) {
		return unsent
	}
	return c.await(p, done)
}
