package redis

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/pipeline"
)

// This file is one decision, in the order it runs: the local cache, the plan (the script
// calls), the send (through route.go's groups: one on a single node, one per master on a
// Cluster), the settle (the replies into decisions, under the batch rule), the undo (of what a
// refused or failed batch charged), and what the cache learns. The calls' encoding is
// codec.go's (the records of contract.go); their pipelines are their nodes' (node.go, send.go).

// core decides batches in Redis, without leases: the local cache of denials, the plan, the
// route to the nodes (the single node's, or the topology's), the send, the settle, the undo.
// The leases layer (lease.go) sits over it when leases are on.
type core struct {
	prefix    string
	cluster   bool
	timeout   time.Duration
	now       func() time.Time // this process's clock: the cache's, and calendar windows'
	log       *slog.Logger
	single    *node        // single node and Sentinel
	topo      *clusterTopo // Cluster
	work      *background  // undos out of the caller's time
	cache     *denials     // nil when disabled
	cacheHits atomic.Uint64
	jobs      sync.Pool // *job

	testHooks // zero but in tests
}

// testHooks are set by tests only (see export_test.go); they are zero in production.
type testHooks struct {
	scriptNow func() int64 // the instant the script decides at instead of Redis TIME
}

// hasCore is what a plan reads its settings from: the core, or the Backend around it.
type hasCore interface{ decisions() *core }

func (c *core) decisions() *core { return c }

// Decide decides reqs into out (as long as reqs), without leases.
func (c *core) Decide(ctx context.Context, reqs []backend.Request, out []backend.Decision) (bool, error) {
	return c.decideAt(ctx, reqs, out, nil)
}

// decideAt is Decide that also reports, in at when it is not nil, the instant (µs, Redis's
// clock) each request sent to Redis was decided at; a request decided without Redis keeps 0.
func (b *core) decideAt(ctx context.Context, reqs []backend.Request, out []backend.Decision, at []int64) (bool, error) {

	// The cache: a batch it knows to be denied is answered here.
	var sent time.Time
	cached := false // the cache may hold a denial of some key of the batch
	if b.cache != nil {
		sent = b.now()
		var answered bool
		if answered, cached = b.fromCache(reqs, out, sent); answered {
			b.cacheHits.Add(1)
			return backend.Admitted(reqs, out), nil
		}
	}

	// The plan: rate 0 decided here, the rest as script calls.
	j := b.jobs.Get().(*job)
	if err := j.plan(b, reqs, out); err != nil {
		b.jobs.Put(j)
		return false, err
	}
	if len(j.calls) == 0 {
		b.jobs.Put(j)
		return backend.Admitted(reqs, out), nil
	}

	// The send, within the budget.
	now := time.Now()
	if err := b.send(ctx, j, now, b.budgetAt(ctx, now)); err != nil {
		if !b.undoFailed(j, reqs) && !j.abandoned {
			b.jobs.Put(j)
		}
		return false, err
	}

	// The settle, and the undo of a batch refused across slots.
	admitted, undo, err := j.settle(reqs, out)
	if at != nil && err == nil {
		for k := range j.calls {
			for _, i := range j.idx[k] {
				at[i] = j.calls[k].now
			}
		}
	}
	if undo {
		if uerr := j.undo(ctx, b, reqs, nil); uerr != nil && err == nil {
			err = uerr
		} else if uerr != nil {
			err = errors.Join(err, uerr)
		}
	}
	b.jobs.Put(j)
	if err != nil {
		return false, err
	}

	// What the cache learns.
	if b.cache != nil {
		for i := range reqs {
			if reqs[i].Limit.Rate > 0 && !repeated(reqs, i) && (cached || !out[i].Allowed) {
				b.cache.learn(&reqs[i], out[i], sent)
			}
		}
	}
	return admitted, nil
}

// job is one Decide's working state, pooled so that steady-state decisions allocate little:
// its script calls (one on a single node; one per slot on a Cluster) and their groups, one per
// node they go to, each with the pending entry its node's coalescer queues.
type job struct {
	calls []call  // the script calls
	slots []int   // per call: its Cluster slot
	idx   [][]int // per call: its requests' indices, in batch order

	groups []group
	pend   []*pipeline.Pending[*call] // backing store of the groups' pendings

	// After a failed send: some group may still belong to its sender (abandoned), and the calls
	// whose replies must not be read (unread).
	abandoned bool
	unread    map[*call]bool
}

func newJob() *job { return &job{} }

// group is the calls of a decision that go to one node.
type group struct {
	n    *node
	p    *pipeline.Pending[*call]
	res  pipeline.Result
	gone bool // its node refused it: closed (see node.close)
}

// fromCache answers the batch when the cache knows every request of it is denied. held
// reports whether the cache may hold an entry for some key of the batch: an admitted decision
// must then drop it (its remaining and reset are stale), and only then, so that the common
// admitted decision on an uncached key does not take the cache's lock again.
func (b *core) fromCache(reqs []backend.Request, out []backend.Decision, now time.Time) (answered, held bool) {
	for i := range reqs {
		r := &reqs[i]
		if r.Limit.Rate == 0 {
			out[i] = decideRateZero(r)
			continue
		}
		d, ok, present := b.cache.lookup(r, now)
		if !ok {
			// Keys after this one were not looked up: they may be held.
			return false, present || i < len(reqs)-1
		}
		out[i] = d
	}
	return true, true
}

// plan decides the rate-0 requests of reqs into out and splits the others into script calls:
// one on a single node, one per slot on a Cluster. It sets each call's quota threshold: this is
// where the batch rule (backend.Charged) is cut into the parts each call can apply alone, as
// decide.lua's charges applies it. It returns the requests' validation error, if any (a bug in
// the caller: not unavailability).
func (j *job) plan(h hasCore, reqs []backend.Request, out []backend.Decision) error {
	b := h.decisions()
	j.calls = j.calls[:0]
	j.slots = j.slots[:0]
	j.idx = j.idx[:0]
	j.groups = j.groups[:0]
	j.abandoned, j.unread = false, nil
	refused := false
	quota, quotaKnown, quotaKnownAllowed := 0, 0, 0
	calNow := int64(0) // this process's instant, for calendar windows: read once, when needed
	for i := range reqs {
		r := &reqs[i]
		if err := r.Limit.Validate(); err != nil {
			return fmt.Errorf("redis backend: request %d: %w", i, err)
		}
		if r.Mode == backend.Quota {
			quota++
		}
		if r.Limit.Rate == 0 {
			out[i] = decideRateZero(r)
			switch {
			case r.Mode == backend.Enforce && !out[i].Allowed && !r.OverdraftCharge():
				refused = true
			case r.Mode == backend.Quota:
				quotaKnown++
				if out[i].Allowed || r.OverdraftCharge() {
					quotaKnownAllowed++
				}
			}
			continue
		}
		key := storedKey(b.prefix, r.Key)
		k := 0
		if b.cluster {
			s := slot(key)
			for k < len(j.slots) && j.slots[k] != s {
				k++
			}
			if k == len(j.slots) {
				j.newCall(s)
			}
		} else if len(j.calls) == 0 {
			j.newCall(0)
		}
		if r.Limit.Window.Calendar != limit.NoCalendar && calNow == 0 {
			calNow = b.now().UnixMicro()
		}
		j.calls[k].add(key, r, calNow)
		j.idx[k] = append(j.idx[k], i)
	}
	if quota > 0 && quota == quotaKnown && quotaKnownAllowed == 0 {
		refused = true // every quota request is under a rate of 0
	}
	multi := len(j.calls) > 1
	for k := range j.calls {
		c := &j.calls[k]
		c.multi = multi
		// A call may refuse the batch for its quota requests only when it holds every one whose
		// outcome is not known yet, and no known one is allowed.
		switch {
		case refused:
			c.threshold = -1
		case quota > 0 && quotaKnownAllowed == 0:
			local := 0
			for _, i := range j.idx[k] {
				if reqs[i].Mode == backend.Quota {
					local++
				}
			}
			if local == quota-quotaKnown {
				c.threshold = int64(local)
			}
		}
	}
	return nil
}

// newCall appends an empty call for slot s, reusing the buffers of an earlier decision.
func (j *job) newCall(s int) {
	// The two grow apart: append rounds each capacity to its own element size.
	if len(j.calls) < cap(j.calls) {
		j.calls = j.calls[:len(j.calls)+1]
	} else {
		j.calls = append(j.calls, call{})
	}
	if len(j.idx) < cap(j.idx) {
		j.idx = j.idx[:len(j.idx)+1]
	} else {
		j.idx = append(j.idx, nil)
	}
	j.calls[len(j.calls)-1].reset()
	j.idx[len(j.idx)-1] = j.idx[len(j.idx)-1][:0]
	j.slots = append(j.slots, s)
}

// decideRateZero decides a request under a rate of 0, which needs no state.
func decideRateZero(r *backend.Request) backend.Decision {
	if r.Refund {
		_, d := backend.Refund(backend.State{}, r.Limit, 0, r.Cost)
		return d
	}
	_, d := backend.Decide(backend.State{}, r.Limit, 0, r.Cost)
	return d
}

// Budget returns how long a decision asked with ctx may take: the caller's deadline less a
// margin (half of what is left, at least 2ms: time for the failure mode's answer to reach the
// caller before its deadline on a busy machine), capped by Options.Timeout.
func (b *core) Budget(ctx context.Context) time.Duration { return b.budgetAt(ctx, time.Now()) }

// budgetAt is Budget at the instant now.
func (b *core) budgetAt(ctx context.Context, now time.Time) time.Duration {
	d, ok := ctx.Deadline()
	if !ok {
		return b.timeout
	}
	left := d.Sub(now)
	return min(b.timeout, left-max(left/2, 2*time.Millisecond))
}

// send sends j's calls in their groups (see route), each node's in its own pipelines, all in
// flight together, and waits for their replies within budget. A call that finds its slot moved
// (MOVED, ASK on a Cluster: it ran nothing) is sent once more, to the node the reply names. The
// decision fails, sending nothing, when a node it needs is known to be down; when some node
// does not answer in time, it fails too (see undoFailed).
func (b *core) send(ctx context.Context, j *job, now time.Time, budget time.Duration) error {
	if err := b.route(j); err != nil {
		return err
	}
	for _, g := range j.groups {
		if !g.n.br.Allow() {
			return g.n.errOpen
		}
	}
	if budget <= 0 {
		return errShed
	}
	deadline := now.Add(budget)
	for again := false; ; again = true {
		if err := j.sendGroups(ctx, deadline); err != nil {
			return err
		}
		if again || !b.rerouted(j) {
			return nil
		}
	}
}

// sendGroups sends the groups of j and waits for them; see send. When it fails, it records in
// j which calls may still belong to their senders.
func (j *job) sendGroups(ctx context.Context, deadline time.Time) error {
	for i := range j.groups {
		g := &j.groups[i]
		g.res, g.gone = pipeline.Replied, false
		if !g.n.co.Submit(g.p, deadline) {
			g.res, g.gone = pipeline.Unsent, true
		}
	}
	var err error
	for i := range j.groups {
		g := &j.groups[i]
		if g.res == pipeline.Replied {
			g.res = g.n.co.Await(g.p, ctx.Done())
		}
		switch g.res {
		case pipeline.Replied:
			continue
		case pipeline.InFlight, pipeline.Canceled:
			j.abandoned = true
		}
		if err != nil {
			continue
		}
		switch {
		case g.gone:
			err = errGone
		case g.res == pipeline.Canceled:
			err = fmt.Errorf("%w: %w", backend.ErrUnavailable, ctx.Err())
		default:
			err = g.n.ranOut()
		}
	}
	if err != nil && j.abandoned {
		// Only the replied calls are read: the others may belong to their senders still.
		j.unread = map[*call]bool{}
		for _, g := range j.groups {
			if g.res == pipeline.InFlight || g.res == pipeline.Canceled {
				for _, c := range g.p.Calls {
					j.unread[c] = true
				}
			}
		}
	}
	return err
}

// settle fills out from the calls' replies and returns whether the batch is admitted, and
// whether the charges the calls made must be undone: when one Cluster slot refused the batch,
// or failed, while others charged it.
func (j *job) settle(reqs []backend.Request, out []backend.Decision) (admitted, undo bool, err error) {
	var errs []error
	for k := range j.calls {
		c := &j.calls[k]
		if c.err != nil {
			errs = append(errs, c.err)
			continue
		}
		for n, i := range j.idx[k] {
			out[i] = c.dec[n]
		}
	}
	multi := len(j.calls) > 1
	if len(errs) > 0 {
		return false, multi, errors.Join(errs...)
	}
	admitted, charged := backend.Admitted(reqs, out), backend.Charged(reqs, out)
	if !multi {
		if charged != j.calls[0].charged {
			return false, false, fmt.Errorf("redis backend: script charged=%v for a batch that is charged=%v", j.calls[0].charged, charged)
		}
		return admitted, false, nil
	}
	if charged {
		for k := range j.calls {
			if !j.calls[k].charged {
				return false, false, errors.New("redis backend: script refused a slot of a charged batch")
			}
		}
		return admitted, false, nil
	}
	// Refused by some slot: report every allowed decision as the check of the unchanged state,
	// as it will be once the charges are undone.
	for k := range j.calls {
		c := &j.calls[k]
		if !c.charged {
			continue
		}
		for n, i := range j.idx[k] {
			if out[i].Allowed {
				out[i].Remaining = c.check[2*n]
				out[i].ResetAfter = time.Duration(c.check[2*n+1]) * time.Microsecond
			}
		}
	}
	return false, true, nil
}

// repeated reports whether the key of reqs[i] occurs elsewhere in reqs: the cache learns
// nothing of it (its decision depends on the other occurrences).
func repeated(reqs []backend.Request, i int) bool {
	for j := range reqs {
		if j != i && reqs[j].Key == reqs[i].Key {
			return true
		}
	}
	return false
}

// nowArg is the instant the script decides at: 0 for Redis TIME.
func (b *core) nowArg() int64 {
	if b.scriptNow != nil {
		return b.scriptNow()
	}
	return 0
}
