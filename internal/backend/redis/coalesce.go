package redis

import (
	"context"
	"fmt"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// coalescer gathers the script calls of concurrent Decide calls into pipelines, with no goroutine
// of its own: while fewer than senders pipelines are in flight a caller sends its calls itself,
// at once; otherwise it queues. When a pipeline's replies are in, its sender hands whatever
// has queued meanwhile (up to max script calls) to the first queued caller, which sends it as
// the next pipeline. A lone caller thus pays nothing, and under load a caller waits at most one
// round trip to join a pipeline.
type coalescer struct {
	b       *Backend
	max     int
	senders int

	mu       sync.Mutex
	inflight int
	queue    []*pending
}

// The roles of a pending call.
const (
	queued  = iota // waiting in the queue
	taken          // in a batch that another caller sends
	leading        // must send batch
	replied        // its replies are in
)

// pending is one Decide call's script calls.
type pending struct {
	ctx  context.Context
	cmds []*goredis.Cmd
	wake chan struct{} // signalled when role becomes leading or replied

	role  int        // guarded by coalescer.mu
	batch []*pending // when leading
}

func newCoalescer(b *Backend, max, senders int) *coalescer {
	return &coalescer{b: b, max: max, senders: senders}
}

// do sends cmds, alone or with others', and waits for their replies or for ctx. When ctx ends
// first the replies are left to the sender: the caller must not read cmds then.
func (c *coalescer) do(ctx context.Context, cmds []*goredis.Cmd) error {
	p := &pending{ctx: ctx, cmds: cmds, wake: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.inflight < c.senders {
		c.inflight++
		c.mu.Unlock()
		c.lead([]*pending{p})
		return nil
	}
	c.queue = append(c.queue, p)
	c.mu.Unlock()
	select {
	case <-p.wake:
	case <-ctx.Done():
		c.mu.Lock()
		switch p.role {
		case queued:
			c.queue = remove(c.queue, p)
			c.mu.Unlock()
			return ctx.Err()
		case taken:
			c.mu.Unlock()
			return ctx.Err()
		}
		c.mu.Unlock()
		<-p.wake // leading or replied: the role is final and wake was sent
	}
	c.mu.Lock()
	role, batch := p.role, p.batch
	c.mu.Unlock()
	if role == leading {
		if ctx.Err() != nil {
			// The others in the batch still need it sent; this caller's time is up.
			go c.lead(batch)
			return ctx.Err()
		}
		c.lead(batch)
	}
	return nil
}

func remove(q []*pending, p *pending) []*pending {
	for i, x := range q {
		if x == p {
			return append(q[:i], q[i+1:]...)
		}
	}
	return q
}

// lead sends batch and then hands the queue, if any, to the next sender.
func (c *coalescer) lead(batch []*pending) {
	c.send(batch)
	c.mu.Lock()
	for _, p := range batch {
		if p.role != leading {
			p.role = replied
			p.wake <- struct{}{}
		}
	}
	if len(c.queue) == 0 {
		c.inflight--
		c.mu.Unlock()
		return
	}
	n, k := 0, 0
	for k < len(c.queue) && (k == 0 || n+len(c.queue[k].cmds) <= c.max) {
		n += len(c.queue[k].cmds)
		k++
	}
	next := append([]*pending(nil), c.queue[:k]...)
	c.queue = append(c.queue[:0], c.queue[k:]...)
	for _, p := range next[1:] {
		p.role = taken
	}
	next[0].role, next[0].batch = leading, next
	next[0].wake <- struct{}{}
	c.mu.Unlock()
}

// send runs the batch's live calls in one pipeline, under the latest of their deadlines: one
// caller's deadline must not fail the calls of the others.
func (c *coalescer) send(batch []*pending) {
	var cmds []*goredis.Cmd
	var live []*pending
	var deadline time.Time
	for _, p := range batch {
		if p.ctx.Err() != nil {
			continue // its caller has returned
		}
		if d, ok := p.ctx.Deadline(); ok && d.After(deadline) {
			deadline = d
		}
		live = append(live, p)
		cmds = append(cmds, p.cmds...)
	}
	if len(cmds) == 0 {
		return
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(c.b.timeout)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	if c.b.cluster || len(cmds) == 1 {
		c.b.exec(ctx, cmds)
	} else {
		c.b.execMerged(ctx, cmds)
	}
	cancel()
	k := 0
	for _, p := range live {
		// exec replaces the calls it sent again as EVAL.
		k += copy(p.cmds, cmds[k:k+len(p.cmds)])
	}
}

// execMerged runs the decide calls cmds of a single node as script calls that each decide
// several of them in order (op "m"), and gives each call its own reply. A script call has a
// fixed cost in Redis (argument conversion, reply, TIME) that this pays once per run of calls
// instead of once per call, with the same decisions as calls sent one after another.
// Consecutive calls are merged when they decide at the same instant (always, but in tests).
func (b *Backend) execMerged(ctx context.Context, cmds []*goredis.Cmd) {
	var merged []*goredis.Cmd
	var runs [][]*goredis.Cmd
	for i := 0; i < len(cmds); {
		j := i + 1
		for j < len(cmds) && decideNow(cmds[j]) == decideNow(cmds[i]) {
			j++
		}
		merged = append(merged, mergeDecides(cmds[i:j]))
		runs = append(runs, cmds[i:j])
		i = j
	}
	b.exec(ctx, merged)
	for k, m := range merged {
		splitReply(m, runs[k])
	}
}

// The positions of a decide call's arguments, after its n keys (see plan).
const (
	argNow       = 4 // evalsha, sha, n, keys..., "d", now
	argThreshold = 5
	argValues    = 7
)

func decideNow(c *goredis.Cmd) any {
	a := c.Args()
	return a[a[2].(int)+argNow]
}

// mergeDecides returns the script call that decides the calls cmds in order.
func mergeDecides(cmds []*goredis.Cmd) *goredis.Cmd {
	if len(cmds) == 1 {
		return cmds[0]
	}
	var keys, batches []any
	for _, c := range cmds {
		a := c.Args()
		n := a[2].(int)
		keys = append(keys, a[3:3+n]...)
		batches = append(batches, a[n+argThreshold], a[n+argValues])
	}
	args := make([]any, 0, 5+len(keys)+len(batches))
	args = append(args, "evalsha", script.Hash(), len(keys))
	args = append(args, keys...)
	args = append(args, "m", decideNow(cmds[0]))
	args = append(args, batches...)
	m := goredis.NewCmd(context.Background(), args...)
	m.SetFirstKeyPos(3)
	return m
}

// splitReply gives each of the calls cmds that m merged its part of m's reply, or m's error.
func splitReply(m *goredis.Cmd, cmds []*goredis.Cmd) {
	if len(cmds) == 1 && cmds[0] == m {
		return
	}
	vals, err := m.Slice()
	if err != nil {
		for _, c := range cmds {
			c.SetErr(err)
		}
		return
	}
	k := 0
	for _, c := range cmds {
		w := 1 + 4*c.Args()[2].(int)
		if k+w > len(vals) {
			c.SetErr(fmt.Errorf("script reply: %d values for merged calls, want more", len(vals)))
			continue
		}
		c.SetVal(vals[k : k+w])
		k += w
	}
}
