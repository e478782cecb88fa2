package redis

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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
)

// fakeSend records the pipelines a coalescer sends, as they start, and answers each call with
// its position; hold, when set, keeps a pipeline in flight until it is closed. A leader's
// pipeline gives up at its deadline, as sendPipeline's does.
type fakeSend struct {
	mu        sync.Mutex
	pipelines [][]string // the first key of each call, per pipeline
	leads     []bool     // per pipeline: a leader's
	goids     []uint64   // per pipeline: the goroutine that ran it
	leading   int        // leaders' pipelines in flight
	maxLead   int        // the most of them in flight at once
	started   chan struct{}
	hold      chan struct{}
}

func (f *fakeSend) send(calls []*call, deadline time.Time, lead bool) bool {
	var keys []string
	for _, c := range calls {
		keys = append(keys, c.keys[0])
	}
	f.mu.Lock()
	f.pipelines = append(f.pipelines, keys)
	f.leads = append(f.leads, lead)
	f.goids = append(f.goids, goid())
	if lead {
		f.leading++
		f.maxLead = max(f.maxLead, f.leading)
	}
	f.mu.Unlock()
	defer func() {
		if lead {
			f.mu.Lock()
			f.leading--
			f.mu.Unlock()
		}
	}()
	if f.started != nil {
		f.started <- struct{}{}
	}
	if f.hold != nil {
		if !lead {
			<-f.hold
		} else {
			t := time.NewTimer(time.Until(deadline))
			defer t.Stop()
			select {
			case <-f.hold:
			case <-t.C:
				return true
			}
		}
	}
	for i, c := range calls {
		c.threshold = int64(i) // the reply: where it went
	}
	return false
}

// goid returns the id of the calling goroutine, as its stack trace's header gives it.
func goid() uint64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(b[:bytes.IndexByte(b, ' ')]), 10, 64)
	return id
}

// led marks c as led by some caller, so that every caller queues for the senders, as under
// load.
func led(c *coalescer) {
	c.mu.Lock()
	c.leading = true
	c.mu.Unlock()
}

func pendingFor(keys ...string) *pending {
	p := newPending()
	for _, k := range keys {
		p.calls = append(p.calls, &call{keys: []string{k}})
	}
	return p
}

// TestCoalescer: while a pipeline is in flight, callers queue (here none leads: the coalescer
// is marked led, as under load); the next pipeline takes them in order, up to max calls but at least one caller's; a caller whose budget passes while queued
// is dropped unsent, one in flight is abandoned and its pipeline still completes.
func TestCoalescer(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newCoalescer(f.send, nil, 3, 1)
	defer c.close()
	led(c)
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

// TestCoalescerAbandon: a caller (queued: the coalescer is marked led) whose budget passes while
// its call is in flight returns inFlight at once; the sender completes the pipeline and does
// not signal the abandoned caller. A canceled caller returns canceled.
func TestCoalescerAbandon(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newCoalescer(f.send, nil, 8, 1)
	defer c.close()
	led(c)
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
	led(c2)
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

// TestCoalescerLead: a lone caller sends its own pipeline, in its own goroutine, one after the
// other; a caller whose calls are part of a batch split across calls (a Cluster's slots) does
// not lead, nor does one whose budget is shorter than minLead. A leader whose budget passes or
// whose context ends before it sends sends nothing.
func TestCoalescerLead(t *testing.T) {
	f := &fakeSend{}
	c := newCoalescer(f.send, nil, 8, 1)
	defer c.close()
	me := goid()
	for i := range 5 {
		if res := c.do(pendingFor(fmt.Sprint("k", i)), time.Now().Add(time.Minute), nil); res != replied {
			t.Fatalf("lone caller %d: %v, want replied", i, res)
		}
	}
	multi := pendingFor("m")
	multi.calls[0].multi = true
	if res := c.do(multi, time.Now().Add(time.Minute), nil); res != replied {
		t.Fatalf("multi caller: %v, want replied", res)
	}
	if res := c.do(pendingFor("short"), time.Now().Add(minLead/2), nil); res != replied && res != unsent && res != inFlight {
		t.Fatalf("short caller: %v", res)
	}
	f.mu.Lock()
	for i := range 5 {
		if !f.leads[i] || f.goids[i] != me {
			f.mu.Unlock()
			t.Fatalf("lone caller %d: lead %v, sent by goroutine %d, want a leader's pipeline sent by the caller (%d)", i, f.leads[i], f.goids[i], me)
		}
	}
	for i := 5; i < len(f.leads); i++ {
		if f.leads[i] || f.goids[i] == me {
			f.mu.Unlock()
			t.Fatalf("pipeline %d (%v): lead %v, sent by goroutine %d, want a sender's", i, f.pipelines[i], f.leads[i], f.goids[i])
		}
	}
	n := len(f.pipelines)
	f.mu.Unlock()

	// Before it sends, a leader's budget that has passed drops its calls, and so does its end.
	p := pendingFor("late")
	if !c.submit(p, time.Now().Add(2*minLead)) || !p.lead {
		t.Fatal("a lone caller does not lead")
	}
	time.Sleep(3 * minLead)
	if res := c.await(p, nil); res != unsent {
		t.Fatalf("leader past its budget: %v, want unsent", res)
	}
	done := make(chan struct{})
	close(done)
	p = pendingFor("gone")
	if !c.submit(p, time.Now().Add(time.Minute)) || !p.lead {
		t.Fatal("a lone caller does not lead")
	}
	if res := c.await(p, done); res != canceled {
		t.Fatalf("leader canceled: %v, want canceled", res)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.pipelines) != n {
		t.Fatalf("a leader that gave up before sending sent %v", f.pipelines[n:])
	}
}

// TestCoalescerLeaderBatching: while a leader's pipeline is in flight, no other caller leads:
// callers queue, and the senders batch them as before. Under load, with many callers, pipelines
// carry several callers' calls, and at most one leader is ever in flight.
func TestCoalescerLeaderBatching(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newCoalescer(f.send, nil, 8, 1)
	defer c.close()
	results := make(chan waitResult, 10)
	do := func(key string) {
		results <- c.do(pendingFor(key), time.Now().Add(time.Minute), nil)
	}
	go do("a")
	<-f.started // a leads, held
	go do("b")
	<-f.started // b queued, and its sender took it, held
	for i, k := range []string{"c", "d", "e"} {
		go do(k)
		waitQueued(t, c, i+1)
	}
	close(f.hold)
	for range 5 {
		if res := <-results; res != replied {
			t.Fatalf("%v, want replied", res)
		}
	}
	f.mu.Lock()
	if want := "[[a] [b] [c d e]] [true false false]"; fmt.Sprint(f.pipelines, f.leads) != want {
		f.mu.Unlock()
		t.Fatalf("pipelines %v, leads %v, want %s", f.pipelines, f.leads, want)
	}
	f.mu.Unlock()

	// Under load.
	g := &fakeSend{}
	slow := func(calls []*call, deadline time.Time, lead bool) bool {
		time.Sleep(200 * time.Microsecond) // a round trip
		return g.send(calls, deadline, lead)
	}
	c2 := newCoalescer(slow, nil, 64, 1)
	defer c2.close()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			p := pendingFor(fmt.Sprint("k", i))
			for j := range 100 {
				if res := c2.do(p, time.Now().Add(time.Minute), nil); res != replied {
					t.Errorf("caller %d, decision %d: %v", i, j, res)
					return
				}
			}
		})
	}
	wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	most := 0
	for _, p := range g.pipelines {
		most = max(most, len(p))
	}
	if most < 2 || len(g.pipelines) >= 1600 || g.maxLead > 1 {
		t.Fatalf("1600 decisions of 16 callers: %d pipelines, the largest of %d calls, %d leaders at once; want batches and one leader at most",
			len(g.pipelines), most, g.maxLead)
	}
	t.Logf("1600 decisions of 16 callers: %d pipelines, the largest of %d calls", len(g.pipelines), most)
}

// TestCoalescerLeaderBudget: a leader whose pipeline hangs returns by its budget, reporting it
// in flight (its pipeline gives up at its deadline, as sendPipeline's does), and the next
// caller leads again; the slow-probe watch fires for a leader's pipeline in flight.
func TestCoalescerLeaderBudget(t *testing.T) {
	f := &fakeSend{hold: make(chan struct{})}
	c := newCoalescer(f.send, nil, 8, 1)
	defer c.close()
	if res := c.do(pendingFor("a"), time.Now().Add(20*time.Millisecond), nil); res != inFlight {
		t.Fatalf("leader past its budget: %v, want inFlight", res)
	}
	close(f.hold)
	if res := c.do(pendingFor("b"), time.Now().Add(time.Minute), nil); res != replied {
		t.Fatalf("after a leader ran out: %v, want replied", res)
	}
	f.mu.Lock()
	if fmt.Sprint(f.leads) != "[true true]" {
		f.mu.Unlock()
		t.Fatalf("leads %v, want [true true]", f.leads)
	}
	f.mu.Unlock()

	g := &fakeSend{started: make(chan struct{}, 1), hold: make(chan struct{})}
	probes := make(chan struct{}, 10)
	c2 := newCoalescer(g.send, func() { probes <- struct{}{} }, 8, 1)
	defer c2.close()
	res := make(chan waitResult, 1)
	go func() { res <- c2.do(pendingFor("a"), time.Now().Add(time.Minute), nil) }()
	<-g.started
	select {
	case <-probes:
	case <-time.After(10 * time.Second):
		t.Fatal("a leader's pipeline in flight for 10s kicked no probe")
	}
	close(g.hold)
	if r := <-res; r != replied {
		t.Fatalf("leader: %v, want replied", r)
	}
}

// TestCoalescerLeaderRedisHung: with Redis stopped (SIGSTOP), a lone caller, which leads, still
// answers within its budget: its pipeline's read gives up at its deadline, far before the
// socket timeout (1s). Its connection is dropped, and decisions succeed again once Redis
// answers.
func TestCoalescerLeaderRedisHung(t *testing.T) {
	b, r := newOwnBackend(t, Options{Coalesce: 64})
	co := b.single.co
	var leads atomic.Int64
	co.mu.Lock()
	send := co.send
	co.send = func(calls []*call, deadline time.Time, lead bool) bool {
		if lead {
			leads.Add(1)
		}
		return send(calls, deadline, lead)
	}
	co.mu.Unlock()
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

// TestCoalescerCloseWhileLeading: close waits for the leader's pipeline in flight, which
// completes; callers that come meanwhile are refused.
func TestCoalescerCloseWhileLeading(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newCoalescer(f.send, nil, 8, 2)
	res := make(chan waitResult, 1)
	go func() { res <- c.do(pendingFor("a"), time.Now().Add(time.Minute), nil) }()
	<-f.started
	closed := make(chan struct{})
	go func() { c.close(); close(closed) }()
	for {
		c.mu.Lock()
		done := c.closed
		c.mu.Unlock()
		if done {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if c.submit(pendingFor("b"), time.Now().Add(time.Minute)) {
		t.Fatal("a caller was taken after close")
	}
	select {
	case <-closed:
		t.Fatal("close returned with a leader's pipeline in flight")
	default:
	}
	close(f.hold)
	<-closed
	if r := <-res; r != replied {
		t.Fatalf("leader: %v, want replied", r)
	}
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
