package redis

import (
	"context"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

// sendCtx is the context of one pipeline (sendPipeline): its callers' deadline, and whether it
// is a leader's (see leadHook). context.WithDeadline and WithValue cost five allocations a
// round trip (the context, its timer and its closure, the done channel go-redis asks for, the
// value); a sendCtx is taken from a pool and its timer and channel are reused, so a round trip
// allocates none of them. Its done channel closes at the deadline, as a deadline's must: a
// pipeline waiting for a connection stops waiting then.
//
// A sendCtx is valid from newSendCtx until release; nothing of go-redis keeps a command's
// context after the command returns.
type sendCtx struct {
	mu       sync.Mutex
	deadline time.Time
	lead     bool
	armed    bool          // between newSendCtx and release
	expired  bool          // done is closed: the deadline passed while armed
	done     chan struct{} // replaced after it closed
	timer    *time.Timer   // closes done at the deadline
	// Buffers of sendPipeline, reused with the context.
	cmds   []*goredis.Cmd
	asking []bool
}

var sendCtxs = sync.Pool{New: func() any { return new(sendCtx) }}

// newSendCtx returns a context with deadline, marked a leader's when lead is set.
func newSendCtx(deadline time.Time, lead bool) *sendCtx {
	c := sendCtxs.Get().(*sendCtx)
	c.mu.Lock()
	if c.done == nil || c.expired {
		c.done, c.expired = make(chan struct{}), false
	}
	c.deadline, c.lead, c.armed = deadline, lead, true
	d := time.Until(deadline)
	if c.timer == nil {
		c.timer = time.AfterFunc(d, c.expire)
	} else {
		c.timer.Reset(d)
	}
	c.mu.Unlock()
	return c
}

// expire closes done once the deadline has passed. A timer of an earlier use that fires late
// finds the current deadline ahead and does nothing.
func (c *sendCtx) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed && !c.expired && !time.Now().Before(c.deadline) {
		c.expired = true
		close(c.done)
	}
}

// release ends c's use and returns it to the pool.
func (c *sendCtx) release() {
	c.timer.Stop()
	c.mu.Lock()
	c.armed = false
	c.mu.Unlock()
	clear(c.cmds)
	c.cmds, c.asking = c.cmds[:0], c.asking[:0]
	sendCtxs.Put(c)
}

func (c *sendCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *sendCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

func (c *sendCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expired {
		return context.DeadlineExceeded
	}
	return nil
}

// Value holds one value: leadKey, set on a leader's pipeline.
func (c *sendCtx) Value(key any) any {
	if _, ok := key.(leadKey); ok && c.lead {
		return true
	}
	return nil
}
