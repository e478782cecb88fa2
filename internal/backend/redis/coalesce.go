package redis

import (
	"runtime"
	"sync"
	"time"
)

// coalescer runs the script calls of concurrent Decide calls in pipelines, on a fixed set of
// sender goroutines: a caller queues its calls and waits for their replies or for its budget;
// a sender takes what has queued (up to max calls, at least one caller's) and runs it through
// the send function as one pipeline. A lone caller's calls leave at once; under load, callers
// that arrive while a pipeline is in flight go out together in the next one, so Redis pays a
// script call's fixed cost once for many decisions.
//
// A caller never waits past its budget: a call still queued then is dropped unsent (nothing was
// charged), one in flight is abandoned to its sender. A pipeline waits for a connection (or
// dials one) no longer than the latest budget of its callers, so a call whose caller gave up
// is never sent late; once written, its replies are read under the client's socket timeout, not
// under callers' deadlines, so a caller's short deadline never breaks the connection that
// carries the others' calls.
type coalescer struct {
	send    func(calls []*call, deadline time.Time) // runs calls as one pipeline, setting each call's reply or err
	slow    func()                                  // called when a pipeline has been in flight for slowAfter (nil: never)
	max     int                                     // calls per pipeline, but at least one caller's
	senders int

	mu     sync.Mutex
	cond   sync.Cond // signalled when the queue grows or the coalescer closes
	queue  []*pending
	idle   int // senders waiting on cond
	closed bool
	wg     sync.WaitGroup
}

// lingerYields is how many times a sender yields the CPU to callers ready to queue before it
// sends what has queued.
const lingerYields = 3

// The states of a pending caller, guarded by coalescer.mu.
const (
	stateIdle      = iota // not queued
	stateQueued           // waiting in the queue
	stateSent             // in a pipeline in flight
	stateDone             // replies in, wake signalled
	stateAbandoned        // its caller left while in flight: the sender drops it
)

// pending is the script calls of one Decide that go to one node, reused across decisions (see
// job and its groups).
type pending struct {
	calls    []*call
	wake     chan struct{} // buffered 1: signalled when state becomes stateDone
	timer    *time.Timer   // the caller's budget; stopped when idle
	state    int
	deadline time.Time // when its caller stops waiting
}

func newPending() *pending {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &pending{wake: make(chan struct{}, 1), timer: t}
}

func newCoalescer(send func([]*call, time.Time), slow func(), max, senders int) *coalescer {
	c := &coalescer{send: send, slow: slow, max: max, senders: senders}
	c.cond.L = &c.mu
	c.wg.Add(senders)
	for range senders {
		go c.run()
	}
	return c
}

// waitResult says how a wait ended.
type waitResult int

const (
	replied  waitResult = iota // every call has its reply or err
	unsent                     // budget over before the calls left: nothing sent
	inFlight                   // budget over while the calls were in a pipeline
	canceled                   // the caller's context ended
)

// submit queues p's calls, to be answered by deadline; it returns false, queueing nothing, once
// the coalescer is closed. await then waits for them. Between the two a caller may submit other
// pendings to other coalescers (the nodes of a Cluster), so that they are in flight together.
// The deadline is absolute, fixed before the caller may wait for the lock: a budget counted
// from here would start late on a starved machine and outlast the caller's own deadline.
func (c *coalescer) submit(p *pending, deadline time.Time) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	p.state = stateQueued
	p.deadline = deadline
	c.queue = append(c.queue, p)
	if c.idle > 0 {
		c.cond.Signal()
	}
	c.mu.Unlock()
	p.timer.Reset(time.Until(deadline))
	return true
}

// await waits until p's calls, submitted, are answered, their deadline has passed or done is
// closed. For any result but replied and unsent, p may still belong to its sender: the caller
// must not reuse it.
func (c *coalescer) await(p *pending, done <-chan struct{}) waitResult {
	var res waitResult
	select {
	case <-p.wake:
		p.timer.Stop()
		p.state = stateIdle
		return replied
	case <-p.timer.C:
		res = inFlight
	case <-done:
		p.timer.Stop()
		res = canceled
		// The budget ends before the caller's deadline, but a goroutine scheduled late finds
		// both ready and select picks either: once the budget has passed, it ran out, whatever
		// else ended too.
		if !time.Now().Before(p.deadline) {
			res = inFlight
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch p.state {
	case stateQueued:
		c.queue = remove(c.queue, p)
		p.state = stateIdle
		if res == inFlight {
			res = unsent
		}
		return res
	case stateSent:
		p.state = stateAbandoned
		return res
	}
	// stateDone: the replies came in as time ran out.
	<-p.wake
	p.state = stateIdle
	return replied
}

func remove(q []*pending, p *pending) []*pending {
	for i, x := range q {
		if x == p {
			copy(q[i:], q[i+1:])
			q[len(q)-1] = nil
			return q[:len(q)-1]
		}
	}
	return q
}

// run is a sender: it takes queued calls and sends them until the coalescer closes.
func (c *coalescer) run() {
	defer c.wg.Done()
	var batch []*pending
	var calls []*call
	// One timer per sender, armed while its pipeline is in flight.
	var watch *time.Timer
	if c.slow != nil {
		watch = time.AfterFunc(time.Hour, c.slow)
		watch.Stop()
		defer watch.Stop()
	}
	for {
		c.mu.Lock()
		for len(c.queue) == 0 && !c.closed {
			c.idle++
			c.cond.Wait()
			c.idle--
		}
		if len(c.queue) == 0 {
			c.mu.Unlock()
			return
		}
		// Let the callers that are ready to run queue too before the pipeline leaves: on a busy
		// machine there are some, and one pipeline then carries their decisions at the fixed
		// cost of one (syscalls here, a script call in Redis). An idle machine has none, and
		// yielding then costs nothing.
		for i := 0; i < lingerYields && len(c.queue) < c.max && !c.closed; i++ {
			c.mu.Unlock()
			runtime.Gosched()
			c.mu.Lock()
		}
		batch, calls = batch[:0], calls[:0]
		var deadline time.Time
		k := 0
		for k < len(c.queue) && (k == 0 || len(calls)+len(c.queue[k].calls) <= c.max) {
			p := c.queue[k]
			p.state = stateSent
			batch = append(batch, p)
			calls = append(calls, p.calls...)
			if p.deadline.After(deadline) {
				deadline = p.deadline
			}
			k++
		}
		n := copy(c.queue, c.queue[k:])
		clear(c.queue[n:])
		c.queue = c.queue[:n]
		c.mu.Unlock()

		if watch != nil {
			watch.Reset(slowAfter)
		}
		c.send(calls, deadline)
		if watch != nil {
			watch.Stop()
		}

		c.mu.Lock()
		for _, p := range batch {
			if p.state == stateSent {
				p.state = stateDone
				p.wake <- struct{}{}
			}
		}
		c.mu.Unlock()
		clear(batch)
		clear(calls)
	}
}

// close stops the senders once the queue is drained.
func (c *coalescer) close() {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	c.wg.Wait()
}
