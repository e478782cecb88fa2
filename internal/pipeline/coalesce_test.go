package pipeline

import (
	"bytes"
	"fmt"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
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

func (f *fakeSend) send(calls []*testCall, deadline time.Time, lead bool) bool {
	var keys []string
	for _, c := range calls {
		keys = append(keys, c.key)
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
		c.reply = i // the reply: where it went
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
func led(c *Coalescer[*testCall]) {
	c.mu.Lock()
	c.leading = true
	c.mu.Unlock()
}

func pendingFor(keys ...string) *Pending[*testCall] {
	p := NewPending[*testCall]()
	for _, k := range keys {
		p.Calls = append(p.Calls, &testCall{key: k})
	}
	return p
}

// TestCoalescer: while a pipeline is in flight, callers queue (here none leads: the coalescer
// is marked led, as under load); the next pipeline takes them in order, up to max calls but at least one caller's; a caller whose budget passes while queued
// is dropped Unsent, one in flight is abandoned and its pipeline still completes.
func TestCoalescer(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newTest(f.send, nil, 3, 1)
	defer c.Close()
	led(c)
	never := make(chan struct{})

	type result struct {
		name string
		res  Result
	}
	results := make(chan result, 10)
	do := func(name string, p *Pending[*testCall], budget time.Duration) {
		res := c.Do(p, time.Now().Add(budget), never)
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
	if res := c.Do(e, time.Now().Add(time.Millisecond), never); res != Unsent {
		t.Fatalf("queued past its budget: %v, want unsent", res)
	}
	close(f.hold)
	got := map[string]Result{}
	for range 4 {
		r := <-results
		got[r.name] = r.res
	}
	for name, res := range got {
		if res != Replied {
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

func waitQueued(t *testing.T, c *Coalescer[*testCall], n int) {
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
// its call is in flight returns InFlight at once; the sender completes the pipeline and does
// not signal the abandoned caller. A canceled caller returns Canceled.
func TestCoalescerAbandon(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newTest(f.send, nil, 8, 1)
	defer c.Close()
	led(c)
	p := pendingFor("a")
	if res := c.Do(p, time.Now().Add(20*time.Millisecond), nil); res != InFlight {
		t.Fatalf("in flight past the budget: %v, want inFlight", res)
	}
	close(f.hold)
	// The sender finishes the abandoned pipeline; the next caller goes out normally.
	q := pendingFor("b")
	if res := c.Do(q, time.Now().Add(time.Minute), nil); res != Replied {
		t.Fatalf("after an abandoned call: %v, want replied", res)
	}
	if len(p.wake) != 0 {
		t.Fatal("the abandoned caller was signalled")
	}

	done := make(chan struct{})
	f2 := &fakeSend{hold: make(chan struct{})}
	c2 := newTest(f2.send, nil, 8, 1)
	led(c2)
	go func() { time.Sleep(10 * time.Millisecond); close(done) }()
	if res := c2.Do(pendingFor("x"), time.Now().Add(time.Minute), done); res != Canceled {
		t.Fatalf("canceled caller: %v, want canceled", res)
	}
	close(f2.hold)
	c2.Close()
}

// TestCoalescerBudgetBeforeCancel: a caller whose budget has passed when its context also ended
// ran out of budget (overload), not Canceled, however select picks between the two.
func TestCoalescerBudgetBeforeCancel(t *testing.T) {
	f := &fakeSend{hold: make(chan struct{})}
	c := newTest(f.send, nil, 8, 1)
	defer func() { close(f.hold); c.Close() }()
	done := make(chan struct{})
	close(done)
	for i := range 200 {
		// A budget of 1ns has passed by the time do selects; done is ready from the start.
		if res := c.Do(pendingFor(fmt.Sprint("k", i)), time.Now().Add(time.Nanosecond), done); res == Canceled {
			t.Fatalf("call %d: Canceled, want its budget reported as run out", i)
		}
	}
}

// TestCoalescerReuse: a pending entry is reused across many decisions, as Decide's pooled jobs
// are, with no stale wake-up or timer firing into the next use.
func TestCoalescerReuse(t *testing.T) {
	f := &fakeSend{}
	c := newTest(f.send, nil, 4, 2)
	defer c.Close()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			p := pendingFor(fmt.Sprint("k", g))
			for i := range 500 {
				if res := c.Do(p, time.Now().Add(time.Minute), nil); res != Replied {
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
// not lead, nor does one whose budget is shorter than MinLead. A leader whose budget passes or
// whose context ends before it sends sends nothing.
func TestCoalescerLead(t *testing.T) {
	f := &fakeSend{}
	c := newTest(f.send, nil, 8, 1)
	defer c.Close()
	me := goid()
	for i := range 5 {
		if res := c.Do(pendingFor(fmt.Sprint("k", i)), time.Now().Add(time.Minute), nil); res != Replied {
			t.Fatalf("lone caller %d: %v, want replied", i, res)
		}
	}
	multi := pendingFor("m")
	multi.Multi = true
	if res := c.Do(multi, time.Now().Add(time.Minute), nil); res != Replied {
		t.Fatalf("multi caller: %v, want replied", res)
	}
	if res := c.Do(pendingFor("short"), time.Now().Add(MinLead/2), nil); res != Replied && res != Unsent && res != InFlight {
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
	if !c.Submit(p, time.Now().Add(2*MinLead)) || !p.Leads() {
		t.Fatal("a lone caller does not lead")
	}
	time.Sleep(3 * MinLead)
	if res := c.Await(p, nil); res != Unsent {
		t.Fatalf("leader past its budget: %v, want unsent", res)
	}
	done := make(chan struct{})
	close(done)
	p = pendingFor("gone")
	if !c.Submit(p, time.Now().Add(time.Minute)) || !p.Leads() {
		t.Fatal("a lone caller does not lead")
	}
	if res := c.Await(p, done); res != Canceled {
		t.Fatalf("leader canceled: %v, want canceled", res)
	}
	// Only leaders' pipelines count from here: the short caller above may have been taken by a
	// sender (InFlight) whose pipeline is recorded only once its send returns.
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := n; i < len(f.pipelines); i++ {
		if f.leads[i] {
			t.Fatalf("a leader that gave up before sending sent %v", f.pipelines[i])
		}
	}
}

// TestCoalescerLeaderBatching: while a leader's pipeline is in flight, no other caller leads:
// callers queue, and the senders batch them as before. Under load, with many callers, pipelines
// carry several callers' calls, and at most one leader is ever in flight.
func TestCoalescerLeaderBatching(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newTest(f.send, nil, 8, 1)
	defer c.Close()
	results := make(chan Result, 10)
	do := func(key string) {
		results <- c.Do(pendingFor(key), time.Now().Add(time.Minute), nil)
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
		if res := <-results; res != Replied {
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
	slow := func(calls []*testCall, deadline time.Time, lead bool) bool {
		time.Sleep(200 * time.Microsecond) // a round trip
		return g.send(calls, deadline, lead)
	}
	c2 := newTest(slow, nil, 64, 1)
	defer c2.Close()
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			p := pendingFor(fmt.Sprint("k", i))
			for j := range 100 {
				if res := c2.Do(p, time.Now().Add(time.Minute), nil); res != Replied {
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
	c := newTest(f.send, nil, 8, 1)
	defer c.Close()
	if res := c.Do(pendingFor("a"), time.Now().Add(20*time.Millisecond), nil); res != InFlight {
		t.Fatalf("leader past its budget: %v, want inFlight", res)
	}
	close(f.hold)
	if res := c.Do(pendingFor("b"), time.Now().Add(time.Minute), nil); res != Replied {
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
	c2 := newTest(g.send, func() { probes <- struct{}{} }, 8, 1)
	defer c2.Close()
	res := make(chan Result, 1)
	go func() { res <- c2.Do(pendingFor("a"), time.Now().Add(time.Minute), nil) }()
	<-g.started
	select {
	case <-probes:
	case <-time.After(10 * time.Second):
		t.Fatal("a leader's pipeline in flight for 10s kicked no probe")
	}
	close(g.hold)
	if r := <-res; r != Replied {
		t.Fatalf("leader: %v, want replied", r)
	}
}

// TestCoalescerCloseWhileLeading: close waits for the leader's pipeline in flight, which
// completes; callers that come meanwhile are refused.
func TestCoalescerCloseWhileLeading(t *testing.T) {
	f := &fakeSend{started: make(chan struct{}, 10), hold: make(chan struct{})}
	c := newTest(f.send, nil, 8, 2)
	res := make(chan Result, 1)
	go func() { res <- c.Do(pendingFor("a"), time.Now().Add(time.Minute), nil) }()
	<-f.started
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	for {
		c.mu.Lock()
		done := c.closed
		c.mu.Unlock()
		if done {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if c.Submit(pendingFor("b"), time.Now().Add(time.Minute)) {
		t.Fatal("a caller was taken after close")
	}
	select {
	case <-closed:
		t.Fatal("close returned with a leader's pipeline in flight")
	default:
	}
	close(f.hold)
	<-closed
	if r := <-res; r != Replied {
		t.Fatalf("leader: %v, want replied", r)
	}
}

// testCall is a call as the tests send it: its key, and the reply the fake send gives it.
type testCall struct {
	key   string
	reply int
}

// newTest starts a coalescer as a node starts its own, with a slowAfter of 20ms.
func newTest(send Send[*testCall], slow func(), max, senders int) *Coalescer[*testCall] {
	return New(send, Options{Max: max, Senders: senders, Slow: slow, SlowAfter: 20 * time.Millisecond})
}
