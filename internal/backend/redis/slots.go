package redis

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/pipeline"
)

// Limits on requests in flight (backend.DecideSlot). A Concurrency key is a sorted set of its
// slots (member the slot id, score the instant it frees itself), written only by slots.lua, one
// call per request: an acquire costs one script call of O(log N) on its key, as does a release.
// A batch that holds slots is decided in two steps, all or nothing as backend.DecideBatch says:
// first its slots, one pipeline of script calls (on a Cluster each goes to its key's master);
// then, when no slot refused it, its rates as any batch is decided. A batch that its rates (or
// a slot) refuse has what its slots wrote undone in a second pipeline; one a slot refused has
// its rates decided as refused, charging nothing. In between, a refused batch's slot is held
// for one round trip: others may be refused for it, never admitted past N.

//go:embed slots.lua
var slotsSource string

var slotsScript = goredis.NewScript(slotsSource)

// slotReply is slots.lua's reply to one request.
type slotReply struct {
	d          backend.Decision
	freeBefore int64
	resetUS    int64 // before the call
	prev       int64 // the slot's score before the call; -1: not held
	written    bool
}

// decideSlots decides reqs, a batch with requests under Concurrency limits, into out.
func (b *Backend) decideSlots(ctx context.Context, reqs []backend.Request, out []backend.Decision) (bool, error) {
	var slotIdx, rateIdx []int
	for i := range reqs {
		if err := reqs[i].Limit.Validate(); err != nil {
			return false, fmt.Errorf("redis backend: request %d: %w", i, err)
		}
		if reqs[i].Limit.Algorithm == limit.Concurrency {
			slotIdx = append(slotIdx, i)
		} else {
			rateIdx = append(rateIdx, i)
		}
	}
	if !b.Healthy() {
		return false, errOpen
	}
	ctx, cancel := context.WithTimeout(ctx, b.Budget(ctx))
	defer cancel()
	replies, err := b.runSlots(ctx, reqs, slotIdx)
	if err != nil {
		// Some calls may have run: undo what they say they wrote, out of the caller's time.
		b.undoSlots(reqs, slotIdx, replies)
		return false, err
	}
	slotsOK := true
	for k, i := range slotIdx {
		out[i] = replies[k].d
		if !out[i].Allowed && reqs[i].Mode != backend.Shadow {
			slotsOK = false
		}
	}
	rates := make([]backend.Request, len(rateIdx), len(rateIdx)+1)
	for k, i := range rateIdx {
		rates[k] = reqs[i]
	}
	rateOut := make([]backend.Decision, len(rates)+1)
	admitted := slotsOK
	if len(rates) > 0 {
		if !slotsOK {
			// Decided as a refused batch: a rate of 0 refuses it, and nothing is charged.
			rates = append(rates, backend.Request{Limit: limit.Limit{Period: time.Second}, Cost: 1})
		}
		if b.leases != nil {
			admitted, err = b.leases.Decide(ctx, rates, rateOut[:len(rates)])
		} else {
			admitted, err = b.core.Decide(ctx, rates, rateOut[:len(rates)])
		}
		if err != nil {
			b.undoSlots(reqs, slotIdx, replies)
			return false, err
		}
		for k, i := range rateIdx {
			out[i] = rateOut[k]
		}
		admitted = admitted && slotsOK
	}
	if !admitted {
		b.undoSlots(reqs, slotIdx, replies)
		// Allowed slots of a refused batch report a check of the key as the batch found it.
		for k, i := range slotIdx {
			if !out[i].Allowed {
				continue
			}
			first := k
			for j := 0; j < k; j++ {
				if reqs[slotIdx[j]].Key == reqs[i].Key {
					first = j
					break
				}
			}
			r := &replies[first]
			out[i] = backend.Decision{Allowed: true, Remaining: max(r.freeBefore, 0), ResetAfter: time.Duration(max(r.resetUS, 0)) * time.Microsecond}
		}
	}
	return backend.Admitted(reqs, out), nil
}

// SlotsExpired implements backend.SlotStats: the expired slots the scripts dropped.
func (b *Backend) SlotsExpired() uint64 { return b.slotsExpired.Load() }

var _ backend.SlotStats = (*Backend)(nil)

// slotOp is the script's operation for r.
func slotOp(r *backend.Request) string {
	switch {
	case r.Refund:
		return "r"
	case r.Cost <= 0:
		return "c"
	}
	return "a"
}

// slotCall is one call of slots.lua: its key and arguments, and once sent its reply.
type slotCall struct {
	key  string
	args []any
	cmd  *goredis.Cmd
}

// runSlots runs slots.lua for each request of reqs at idx, in order, in one pipeline, gathered
// with concurrent decisions' calls (slotPipe). The replies it returns hold those of the calls
// that ran, even with an error; a decision that ran out of time while its calls were in flight
// knows none, and the slots they may have taken free themselves at their lifetime's end.
func (b *Backend) runSlots(ctx context.Context, reqs []backend.Request, idx []int) ([]slotReply, error) {
	replies := make([]slotReply, len(idx))
	for k := range replies {
		replies[k].prev = -1
	}
	now := b.nowArg()
	calls := make([]slotCall, len(idx))
	p := slotPendings.Get().(*pipeline.Pending[*slotCall])
	p.Calls = p.Calls[:0]
	for k, i := range idx {
		r := &reqs[i]
		calls[k] = slotCall{key: storedKey(b.prefix, r.Key), args: []any{slotOp(r), now, r.Limit.Rate, r.Limit.PeriodMicros(), r.Slot}}
		p.Calls = append(p.Calls, &calls[k])
	}
	sp := b.slotsPipe()
	if sp == nil {
		return replies, errOpen // closed
	}
	deadline, _ := ctx.Deadline()
	res := sp.Do(p, deadline, ctx.Done())
	if res == pipeline.Replied || res == pipeline.Unsent {
		// Any other result may leave p with its sender: never reused then.
		clear(p.Calls)
		slotPendings.Put(p)
	}
	switch res {
	case pipeline.Replied:
	case pipeline.Unsent:
		return replies, errShed
	default:
		if err := ctx.Err(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
			return replies, fmt.Errorf("redis backend: slots: %w", err)
		}
		return replies, errShed
	}
	var first error
	for k := range calls {
		vals, cerr := calls[k].cmd.Int64Slice()
		if cerr != nil || len(vals) != 9 {
			if first == nil {
				first = cerr
				if first == nil {
					first = fmt.Errorf("redis: slots script replied %d values", len(vals))
				}
			}
			continue
		}
		replies[k] = slotReply{
			d: backend.Decision{Allowed: vals[0] == 1, Remaining: vals[1],
				RetryAfter: time.Duration(vals[2]) * time.Microsecond, ResetAfter: time.Duration(vals[3]) * time.Microsecond},
			freeBefore: vals[4], resetUS: vals[5], prev: vals[6], written: vals[7] == 1,
		}
		b.slotsExpired.Add(uint64(max(vals[8], 0)))
	}
	if first != nil {
		return replies, fmt.Errorf("redis backend: slots: %w", classify(first))
	}
	return replies, nil
}

// slotPendings holds the pendings of slot calls that came back whole.
var slotPendings = sync.Pool{New: func() any { return pipeline.NewPending[*slotCall]() }}

// slotsPipe is the coalescer of slot calls, started on first use; nil once the backend closed.
func (b *Backend) slotsPipe() *pipeline.Coalescer[*slotCall] {
	b.slotPipeOnce.Do(func() {
		b.slotPipe = pipeline.New(b.sendSlots, pipeline.Options{Max: 64, Senders: 1})
	})
	return b.slotPipe
}

// sendSlots is slotPipe's send: calls in one pipeline by EVALSHA, a leader's bounded by its
// deadline, a sender's by the backend's own timeout; calls that find the script not loaded are
// loaded and sent again, in order (they did not run).
func (b *Backend) sendSlots(calls []*slotCall, deadline time.Time, lead bool) (ranOut bool) {
	ctx, cancel := context.WithTimeout(context.Background(), max(b.timeout, time.Second))
	if lead {
		cancel()
		ctx, cancel = context.WithDeadline(context.Background(), deadline)
	}
	defer cancel()
	send := func(which []*slotCall) {
		pipe := b.rdb.Pipeline()
		for _, c := range which {
			c.cmd = slotsScript.EvalSha(ctx, pipe, []string{c.key}, c.args...)
		}
		_, _ = pipe.Exec(ctx) // each call's error is its own
	}
	send(calls)
	if lead && ctx.Err() != nil {
		return true
	}
	var again []*slotCall
	for _, c := range calls {
		if goredis.HasErrorPrefix(c.cmd.Err(), "NOSCRIPT") {
			again = append(again, c)
		}
	}
	if len(again) == 0 {
		return false
	}
	if err := b.loadSlots(ctx); err != nil {
		return false // the calls keep their NOSCRIPT error
	}
	send(again)
	return lead && ctx.Err() != nil
}

// loadSlots loads slots.lua on the node, or on every master of a Cluster.
func (b *Backend) loadSlots(ctx context.Context) error {
	if cc, ok := b.rdb.(*goredis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return slotsScript.Load(ctx, c).Err()
		})
	}
	return slotsScript.Load(ctx, b.rdb).Err()
}

// undoSlots undoes, before the decision answers and in reverse order, what the calls of a
// refused or failed batch wrote: an acquire's slot removed or its former expiry restored, a
// release's slot given back while there is room.
func (b *Backend) undoSlots(reqs []backend.Request, idx []int, replies []slotReply) {
	now := b.nowArg()
	var calls []*slotCall
	for k := len(idx) - 1; k >= 0; k-- {
		if !replies[k].written {
			continue
		}
		r := &reqs[idx[k]]
		calls = append(calls, &slotCall{key: storedKey(b.prefix, r.Key),
			args: []any{"u", now, r.Limit.Rate, r.Limit.PeriodMicros(), r.Slot, strconv.FormatInt(replies[k].prev, 10)}})
	}
	if len(calls) == 0 {
		return
	}
	b.sendSlots(calls, time.Time{}, false)
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil {
			b.warn.Warn("slots undo", "redis backend: undoing a refused batch's slots failed: they free themselves at their lifetime's end", "err", classify(err))
			return
		}
	}
}
