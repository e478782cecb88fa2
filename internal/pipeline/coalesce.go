// Package pipeline gathers the calls of concurrent callers into pipelines: a Coalescer hands
// what has queued, up to a number of calls, to a send function, one pipeline at a time per
// sender goroutine, and lets a lone caller send its own calls in its own goroutine (it leads).
// It knows nothing of what a call is, nor of what sends it.
package pipeline

import (
	"sync"
	"time"
)

// Coalescer runs the calls of concurrent callers in pipelines. A caller that finds nothing
// queued and no other caller leading leads: it sends its own calls as a pipeline, in its own
// goroutine, so that a lone caller costs one round trip and no hand-over to another goroutine
// and back. Callers that arrive meanwhile queue, and a fixed set of sender goroutines take what
// has queued (up to Max calls, at least one caller's) and run it through the send function as
// one pipeline: under load, callers that arrive while pipelines are in flight go out together in
// the next one, so the server pays a call's fixed cost once for many. At most one caller leads
// at a time, so leading adds at most one pipeline in flight to the senders' and never takes from
// them the callers they would batch.
//
// A caller never waits past its deadline: a call still queued then is dropped unsent (nothing
// ran), one in flight is abandoned to its sender. A sender's pipeline is handed the latest
// deadline of its callers: the send function should wait for a connection no longer than that,
// so that a call whose caller gave up is never sent late, and read the replies under its own
// timeout, not under callers' deadlines, so that a caller's short deadline never breaks the
// connection that carries the others' calls. A leader cannot abandon its pipeline, being the
// goroutine that reads it, so its send (lead set) must bound its read by the deadline instead:
// its pipeline carries only its own calls. Running out of time then is the leader's own, as for
// an abandoned call.
type Coalescer[T any] struct {
	send    Send[T]
	slow    func()        // called when a pipeline has been in flight for slowAfter (nil: never)
	after   time.Duration // slowAfter
	max     int           // calls per pipeline, but at least one caller's
	senders int

	mu      sync.Mutex
	cond    sync.Cond // signalled when the queue grows or the coalescer closes
	queue   []*Pending[T]
	idle    int  // senders waiting on cond
	leading bool // a caller leads (see Submit)
	closed  bool
	wg      sync.WaitGroup // the senders and the leader

	watch *time.Timer // the leader's pipeline's slowAfter, armed while it is in flight
}

// Send runs calls as one pipeline, setting each call's reply. lead: a leader's, whose reads
// and writes the send bounds by deadline too; it then reports whether it gave up at the
// deadline (ranOut), with no reply read.
type Send[T any] func(calls []T, deadline time.Time, lead bool) (ranOut bool)

// Options configures a Coalescer.
type Options struct {
	// Max is the most calls in a pipeline, but a pipeline carries at least one caller's.
	Max int
	// Senders is the number of sender goroutines.
	Senders int
	// Slow, when set, is called when a pipeline has been in flight for SlowAfter.
	Slow      func()
	SlowAfter time.Duration
}

// MinLead is the least budget a caller leads with: with less, the round trip would likely be
// cut short, breaking its connection, so the caller queues and is dropped unsent or abandoned as
// its budget ends.
const MinLead = time.Millisecond

// The states of a pending caller, guarded by Coalescer.mu.
const (
	stateIdle      = iota // not queued
	stateQueued           // waiting in the queue
	stateSent             // in a pipeline in flight
	stateDone             // replies in, wake signalled
	stateAbandoned        // its caller left while in flight: the sender drops it
)

// Pending is the calls of one caller, reusable from one Submit to the next once its Await
// returned Replied or Unsent.
type Pending[T any] struct {
	// Calls are the caller's calls, set before Submit.
	Calls []T
	// Multi: the caller's work is split across several pendings (other coalescers) that must be
	// in flight together. It never leads (see Submit).
	Multi bool

	wake     chan struct{} // buffered 1: signalled when state becomes stateDone
	timer    *time.Timer   // the caller's budget; stopped when idle
	state    int
	deadline time.Time // when its caller stops waiting
	lead     bool      // its caller leads (see Submit); touched by its caller only
}

// NewPending returns an empty pending.
func NewPending[T any]() *Pending[T] {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &Pending[T]{wake: make(chan struct{}, 1), timer: t}
}

// Leads reports whether p's caller leads: set by Submit, until Await returns.
func (p *Pending[T]) Leads() bool { return p.lead }

// New starts a coalescer that sends through send.
func New[T any](send Send[T], o Options) *Coalescer[T] {
	c := &Coalescer[T]{send: send, slow: o.Slow, after: o.SlowAfter, max: o.Max, senders: o.Senders}
	c.cond.L = &c.mu
	if c.slow != nil {
		c.watch = time.AfterFunc(time.Hour, c.slow)
		c.watch.Stop()
	}
	c.wg.Add(c.senders)
	for range c.senders {
		go c.run()
	}
	return c
}

// Result says how a wait ended.
type Result int

const (
	Replied  Result = iota // every call has its reply
	Unsent                 // deadline passed before the calls left: nothing sent
	InFlight               // deadline passed while the calls were in a pipeline
	Canceled               // the caller's done channel closed
)

func (r Result) String() string {
	return [...]string{"replied", "unsent", "inFlight", "canceled"}[r]
}

// Submit queues p's calls, to be answered by deadline; it returns false, queueing nothing, once
// the coalescer is closed. Await then waits for them. Between the two a caller may submit other
// pendings to other coalescers, so that they are in flight together. The deadline is absolute,
// fixed before the caller may wait for the lock: a budget counted from here would start late on
// a starved machine and outlast the caller's own deadline.
//
// When nothing is queued, no other caller leads and at least MinLead of the budget is left, the
// caller leads: Submit queues nothing and Await sends p's calls in the caller's goroutine.
// Leading happens in Await, not here, so that a caller's submits to several coalescers all
// return at once; but a caller awaits its pendings in turn, and a leader's pipeline leaves only
// in its Await, so two leading pendings of one caller would go one round trip after the other.
// A Multi pending therefore never leads: it queues, to be in flight with its others.
func (c *Coalescer[T]) Submit(p *Pending[T], deadline time.Time) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	p.deadline = deadline
	if len(c.queue) == 0 && !c.leading && len(p.Calls) > 0 && !p.Multi && time.Until(deadline) >= MinLead {
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

// Await waits until p's calls, submitted, are answered, their deadline has passed or done is
// closed. For any result but Replied and Unsent, p may still belong to its sender: the caller
// must not reuse it.
func (c *Coalescer[T]) Await(p *Pending[T], done <-chan struct{}) Result {
	if p.lead {
		return c.lead(p, done)
	}
	var res Result
	select {
	case <-p.wake:
		p.timer.Stop()
		p.state = stateIdle
		return Replied
	case <-p.timer.C:
		res = InFlight
	case <-done:
		p.timer.Stop()
		res = Canceled
		// The budget ends before the caller's deadline, but a goroutine scheduled late finds
		// both ready and select picks either: once the budget has passed, it ran out, whatever
		// else ended too.
		if !time.Now().Before(p.deadline) {
			res = InFlight
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch p.state {
	case stateQueued:
		c.queue = remove(c.queue, p)
		p.state = stateIdle
		if res == InFlight {
			res = Unsent
		}
		return res
	case stateSent:
		p.state = stateAbandoned
		return res
	}
	// stateDone: the replies came in as time ran out.
	<-p.wake
	p.state = stateIdle
	return Replied
}

// Do is Submit then Await.
func (c *Coalescer[T]) Do(p *Pending[T], deadline time.Time, done <-chan struct{}) Result {
	if !c.Submit(p, deadline) {
		return Unsent
	}
	return c.Await(p, done)
}

// lead sends p's calls as the leader's pipeline, in the caller's goroutine (see Submit), unless
// its budget passed or done was closed first: then nothing is sent. Once sent, done is not
// watched: the pipeline gives up at the deadline anyway.
func (c *Coalescer[T]) lead(p *Pending[T], done <-chan struct{}) Result {
	defer func() {
		p.lead = false
		c.mu.Lock()
		c.leading = false
		c.mu.Unlock()
		c.wg.Done()
	}()
	if !time.Now().Before(p.deadline) {
		return Unsent
	}
	select {
	case <-done:
		return Canceled
	default:
	}
	if c.watch != nil {
		c.watch.Reset(c.after)
	}
	ranOut := c.send(p.Calls, p.deadline, true)
	if c.watch != nil {
		c.watch.Stop()
	}
	if ranOut {
		return InFlight
	}
	return Replied
}

func remove[T any](q []*Pending[T], p *Pending[T]) []*Pending[T] {
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
func (c *Coalescer[T]) run() {
	defer c.wg.Done()
	var batch []*Pending[T]
	var calls []T
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
		// What has queued leaves now. A sender never yields to let more callers queue first
		// (runtime.Gosched): that puts it in the scheduler's global run queue, behind every
		// goroutine preempted there, and in a process short of CPU each yield then costs it
		// a turn of up to hundreds of milliseconds, during which every caller of its node
		// waits. Callers that arrive while its pipeline is in flight go out in the next one.
		batch, calls = batch[:0], calls[:0]
		var deadline time.Time
		k := 0
		for k < len(c.queue) && (k == 0 || len(calls)+len(c.queue[k].Calls) <= c.max) {
			p := c.queue[k]
			p.state = stateSent
			batch = append(batch, p)
			calls = append(calls, p.Calls...)
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
			watch.Reset(c.after)
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

// Close stops the senders once the queue is drained, and waits for the leader's pipeline;
// Submit refuses every caller from then on.
func (c *Coalescer[T]) Close() {
	c.mu.Lock()
	c.closed = true
	c.cond.Broadcast()
	c.mu.Unlock()
	c.wg.Wait()
	if c.watch != nil {
		c.watch.Stop()
	}
}
