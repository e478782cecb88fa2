package redis

import (
	"runtime"
	"sync"
	"time"
)

// coalescer runs the script calls of concurrent Decide calls in pipelines. A caller that finds
// nothing queued and no other caller leading leads: it sends its own calls as a pipeline, in its
// own goroutine, so that a lone decision costs one round trip and no hand-over to another
// goroutine and back. Callers that arrive meanwhile queue, and a fixed set of sender goroutines
// take what has queued (up to max calls, at least one caller's) and run it through the send
// function as one pipeline: under load, callers that arrive while pipelines are in flight go out
// together in the next one, so Redis pays a script call's fixed cost once for many decisions.
// At most one caller leads at a time, so leading adds at most one pipeline in flight to the
// senders' and never takes from them the callers they would batch.
//
// A caller never waits past its budget: a call still queued then is dropped unsent (nothing was
// charged), one in flight is abandoned to its sender. A pipeline waits for a connection (or
// dials one) no longer than the latest budget of its callers, so a call whose caller gave up
// is never sent late; once written, a sender's pipeline has its replies read under the client's
// socket timeout, not under callers' deadlines, so a caller's short deadline never breaks the
// connection that carries the others' calls. A leader cannot abandon its pipeline, being the
// goroutine that reads it, so its read is bounded by its own deadline instead (send's lead): its
// pipeline carries only its own calls, and a read cut short breaks a connection that carried
// nothing else. Running out of time then is the leader's own, as for an abandoned call: the
// call may have been charged, and the node's breaker is not told (see node.sendPipeline).
type coalescer struct {
	// send runs calls as one pipeline, setting each call's reply or err. lead: a leader's, its
	// socket reads and writes bounded by deadline too; it then reports whether it gave up at
	// the deadline (ranOut), with no reply read.
	send    func(calls []*call, deadline time.Time, lead bool) (ranOut bool)
	slow    func() // called when a pipeline has been in flight for slowAfter (nil: never)
	max     int    // calls per pipeline, but at least one caller's
	senders int

	mu      sync.Mutex
	cond    sync.Cond // signalled when the queue grows or the coalescer closes
	queue   []*pending
	idle    int  // senders waiting on cond
	leading bool // a caller leads (see submit)
	noLead  bool // no caller leads: every call goes to the senders
	closed  bool
	wg      sync.WaitGroup // the senders and the leader

	watch *time.Timer // the leader's pipeline's slowAfter, armed while it is in flight
}

// minLead is the least budget a caller leads with: with less, the round trip would likely be
// cut short, breaking its connection, so the caller queues and is dropped unsent or abandoned as
// its budget ends.
const minLead = time.Millisecond

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
	lead     bool      // its caller leads (see submit); touched by its caller only
}

func newPending() *pending {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &pending{wake: make(chan struct{}, 1), timer: t}
}

func newCoalescer(send func([]*call, time.Time, bool) bool, slow func(), max, senders int) *coalescer {
	c := &coalescer{send: send, slow: slow, max: max, senders: senders}
	c.cond.L = &c.mu
	if slow != nil {
		c.watch = time.AfterFunc(time.Hour, slow)
		c.watch.Stop()
	}
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
//
// When nothing is queued, no other caller leads and at least minLead of the budget is left, the
// caller leads: submit queues nothing and await sends p's calls in the caller's goroutine.
// Leading happens in await, not here, so that a caller's submits to several coalescers all
// return at once; but a caller awaits its pendings in turn, and a leader's pipeline leaves only
// in its await, so two leading pendings of one decision would go one round trip after the
// other. The pendings of a decision whose batch is split across calls (multi: Cluster slots,
// which may be on several nodes) therefore never lead: they queue, to be in flight together.
func (c *coalescer) submit(p *pending, deadline time.Time) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	p.deadline = deadline
	if !c.noLead && len(c.queue) == 0 && !c.leading && len(p.calls) > 0 && !p.calls[0].multi && time.Until(deadline) >= minLead {
		c.leading = true
		c.wg.Add(1)
		c.mu.Unlock()
		p.lead = true
		return true
	}
	p.state = stateQueued
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
	if p.lead {
		return c.lead(p, done)
	}
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

// lead sends p's calls as the leader's pipeline, in the caller's goroutine (see submit), unless
// its budget passed or done was closed first: then nothing is sent. Once sent, done is not
// watched: the pipeline gives up at the deadline anyway.
func (c *coalescer) lead(p *pending, done <-chan struct{}) waitResult {
	defer func() {
		p.lead = false
		c.mu.Lock()
		c.leading = false
		c.mu.Unlock()
		c.wg.Done()
	}()
	if !time.Now().Before(p.deadline) {
		return unsent
	}
	select {
	case <-done:
		return canceled
	default:
	}
	if c.watch != nil {
		c.watch.Reset(slowAfter)
	}
	ranOut := c.send(p.calls, p.deadline, true)
	if c.watch != nil {
		c.watch.Stop()
	}
	if ranOut {
		return inFlight
	}
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
		c.send(calls, deadline, false)
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

// close stops the senders once the queue is drained, and waits for the leader's pipeline.
func (c *coalescer) close() {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	c.wg.Wait()
	if c.watch != nil {
		c.watch.Stop()
	}
}
