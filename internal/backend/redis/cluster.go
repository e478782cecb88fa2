package redis

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// job is one Decide's working state, pooled so that steady-state decisions allocate little:
// its script calls (one on a single node; one per slot on a Cluster) and the pending entry the
// coalescer queues.
type job struct {
	p     *pending
	calls []call  // backing store of p.calls
	slots []int   // per call: its Cluster slot
	idx   [][]int // per call: its requests' indices, in batch order

	// Cluster: the calls grouped by the node they go to, each group with its own pending
	// (pooled in pend), in flight together.
	groups []group
	pend   []*pending
}

func newJob() *job { return &job{p: newPending()} }

// plan decides the rate-0 requests of reqs into out and splits the others into script calls.
// It returns the requests' validation error, if any (a bug in the caller: not unavailability).
func (j *job) plan(b *Backend, reqs []backend.Request, out []backend.Decision) error {
	j.calls = j.calls[:0]
	j.slots = j.slots[:0]
	j.idx = j.idx[:0]
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
	j.p.calls = j.p.calls[:0]
	for k := range j.calls {
		j.p.calls = append(j.p.calls, &j.calls[k])
	}
	return nil
}

// newCall appends an empty call for slot s, reusing the buffers of an earlier decision.
func (j *job) newCall(s int) {
	if len(j.calls) < cap(j.calls) {
		j.calls = j.calls[:len(j.calls)+1]
		j.idx = j.idx[:len(j.idx)+1]
	} else {
		j.calls = append(j.calls, call{})
		j.idx = append(j.idx, nil)
	}
	j.calls[len(j.calls)-1].reset()
	j.idx[len(j.idx)-1] = j.idx[len(j.idx)-1][:0]
	j.slots = append(j.slots, s)
}

// settleCalls fills out from the calls' replies and returns whether the batch is admitted,
// undoing, across Cluster slots, the charges of a batch that one slot refused.
func (j *job) settleCalls(ctx context.Context, b *Backend, reqs []backend.Request, out []backend.Decision) (bool, error) {
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
		if multi {
			if uerr := j.undo(ctx, b, reqs); uerr != nil {
				errs = append(errs, uerr)
			}
		}
		return false, errors.Join(errs...)
	}
	admitted, charged := settle(reqs, out), backend.Charged(reqs, out)
	if !multi {
		if charged != j.calls[0].charged {
			return false, fmt.Errorf("redis backend: script charged=%v for a batch that is charged=%v", j.calls[0].charged, charged)
		}
		return admitted, nil
	}
	if charged {
		for k := range j.calls {
			if !j.calls[k].charged {
				return false, errors.New("redis backend: script refused a slot of a charged batch")
			}
		}
		return admitted, nil
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
	return false, j.undo(ctx, b, reqs)
}

// undo gives back what the charged calls of a refused batch wrote, on the nodes that charged
// them.
func (j *job) undo(ctx context.Context, b *Backend, reqs []backend.Request) error {
	return j.undoWhere(ctx, b, reqs, func(*call) bool { return true })
}

// undoWhere is undo of the calls that which picks.
func (j *job) undoWhere(ctx context.Context, b *Backend, reqs []backend.Request, which func(*call) bool) error {
	type nodeUndo struct {
		n    *node
		cmds []*goredis.Cmd
	}
	var undos []nodeUndo
	for k := range j.calls {
		c := &j.calls[k]
		if !which(c) || !c.charged || c.err != nil {
			continue
		}
		c.charged = false
		var keys []string
		var vals []byte
		for n, i := range j.idx[k] {
			var ok bool
			if vals, ok = c.appendUndo(vals, n, &reqs[i]); ok {
				keys = append(keys, c.keys[n])
			}
		}
		if len(keys) == 0 {
			continue
		}
		n := c.node
		if n == nil {
			n = b.single
		}
		u := slices.IndexFunc(undos, func(u nodeUndo) bool { return u.n == n })
		if u < 0 {
			undos = append(undos, nodeUndo{n: n})
			u = len(undos) - 1
		}
		undos[u].cmds = append(undos[u].cmds, newScriptCmd(undoArgs(script.Hash(), b.nowArg(), keys, vals)))
	}
	var wg sync.WaitGroup
	for _, u := range undos {
		wg.Go(func() { u.n.observe(u.n.exec(ctx, u.cmds, nil), u.cmds) })
	}
	wg.Wait()
	var err error
	for _, u := range undos {
		for _, c := range u.cmds {
			if cerr := c.Err(); cerr != nil && err == nil {
				err = classify(cerr)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("undoing the charges of a refused batch: %w", err)
	}
	return nil
}

// sendCluster sends j's calls to the masters of their slots, each node's in its own pipelines,
// all in flight together, and waits for their replies within budget. A call that finds its
// slot moved (MOVED, ASK: it ran nothing) is sent once more, to the node the reply names. The
// decision fails, sending nothing, when a node it needs is known to be down; when some node does
// not answer in time, it fails too, and the charges the others made are given back in the
// background. It puts j back in the pool when it is done with it.
func (b *Backend) sendCluster(ctx context.Context, j *job, reqs []backend.Request, now time.Time, budget time.Duration) error {
	t := b.topo.Load()
	if t == nil {
		b.jobs.Put(j)
		b.requestReload(reasonNoMap)
		return errNoSlotMap
	}
	if err := j.route(t); err != nil {
		b.jobs.Put(j)
		b.requestReload(reasonNodeDown)
		return err
	}
	for _, g := range j.groups {
		if !g.n.br.allow() {
			b.jobs.Put(j)
			return g.n.errOpen
		}
	}
	if budget <= 0 {
		b.jobs.Put(j)
		return errShed
	}
	deadline := now.Add(budget)
	for again := false; ; again = true {
		if err := j.sendGroups(ctx, b, reqs, deadline); err != nil {
			return err
		}
		if again || !j.redirected(b) {
			break
		}
	}
	return nil
}

// sendGroups sends the groups of j and waits for them; see sendCluster.
func (j *job) sendGroups(ctx context.Context, b *Backend, reqs []backend.Request, deadline time.Time) error {
	for i := range j.groups {
		g := &j.groups[i]
		g.res = replied
		if !g.n.co.submit(g.p, deadline) {
			g.res = unsent
		}
	}
	var err error
	abandoned := false
	for i := range j.groups {
		g := &j.groups[i]
		if g.res == replied {
			g.res = g.n.co.await(g.p, ctx.Done())
		}
		switch g.res {
		case replied:
			continue
		case inFlight, canceled:
			abandoned = true
		}
		if err != nil {
			continue
		}
		if g.res == canceled {
			err = fmt.Errorf("%w: %w", backend.ErrUnavailable, ctx.Err())
		} else {
			err = g.n.ranOut()
		}
	}
	if err == nil {
		return nil
	}
	// Only the replied calls are read: the others may belong to their senders still.
	out := map[*call]bool{}
	for _, g := range j.groups {
		if g.res == inFlight || g.res == canceled {
			for _, c := range g.p.calls {
				out[c] = true
			}
		}
	}
	charged := false
	for k := range j.calls {
		c := &j.calls[k]
		charged = charged || !out[c] && c.err == nil && c.charged
	}
	if !charged {
		if !abandoned {
			b.jobs.Put(j)
		}
		return err
	}
	// Some node charged its part of a decision that failed: give it back, out of the caller's
	// time.
	rs := append([]backend.Request(nil), reqs...)
	b.bgMu.Lock()
	if b.bgClosed {
		b.bgMu.Unlock()
		return err
	}
	b.bg.Add(1)
	b.bgMu.Unlock()
	go func() {
		defer b.bg.Done()
		ctx, cancel := context.WithTimeout(b.bgCtx, max(b.timeout, time.Second))
		defer cancel()
		if uerr := j.undoWhere(ctx, b, rs, func(c *call) bool { return !out[c] }); uerr != nil {
			b.log.Debug("redis: the charges of a failed decision were not given back", "err", uerr)
		}
	}()
	return err
}

// redirected regroups the calls of j that found their slot moved (MOVED or ASK: they ran
// nothing) to the nodes their replies name, and asks for the slot map again. It reports whether
// there were any.
func (j *job) redirected(b *Backend) bool {
	any := false
	for k := range j.calls {
		c := &j.calls[k]
		addr, ask, ok := redirect(c.err)
		if !ok {
			continue
		}
		if !any {
			j.groups = j.groups[:0]
			any = true
		}
		if ask {
			b.requestReload(reasonAsk)
		} else {
			b.requestReload(reasonMoved)
		}
		c.err, c.asking, c.node = nil, ask, b.nodeFor(addr)
		j.addToGroup(c.node, c)
	}
	return any
}

// settle returns whether the batch is admitted. The allowed requests under a rate of 0 (refunds)
// stay allowed in a refused batch, as backend.DecideBatch reports them.
func settle(reqs []backend.Request, out []backend.Decision) bool {
	return backend.Admitted(reqs, out)
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
