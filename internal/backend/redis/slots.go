package redis

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
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

// runSlots runs slots.lua for each request of reqs at idx, in order, in one pipeline. The
// replies it returns hold those of the calls that ran, even with an error.
func (b *Backend) runSlots(ctx context.Context, reqs []backend.Request, idx []int) ([]slotReply, error) {
	replies := make([]slotReply, len(idx))
	now := b.nowArg()
	args := func(r *backend.Request) []any {
		return []any{slotOp(r), now, r.Limit.Rate, r.Limit.PeriodMicros(), r.Slot}
	}
	cmds, err := b.pipeSlots(ctx, len(idx), func(k int) (string, []any) {
		r := &reqs[idx[k]]
		return storedKey(b.prefix, r.Key), args(r)
	})
	var first error
	for k, c := range cmds {
		vals, cerr := c.Int64Slice()
		if cerr != nil || len(vals) != 9 {
			if first == nil {
				first = cerr
				if first == nil {
					first = fmt.Errorf("redis: slots script replied %d values", len(vals))
				}
			}
			replies[k].prev = -1
			continue
		}
		replies[k] = slotReply{
			d: backend.Decision{Allowed: vals[0] == 1, Remaining: vals[1],
				RetryAfter: time.Duration(vals[2]) * time.Microsecond, ResetAfter: time.Duration(vals[3]) * time.Microsecond},
			freeBefore: vals[4], resetUS: vals[5], prev: vals[6], written: vals[7] == 1,
		}
		b.slotsExpired.Add(uint64(max(vals[8], 0)))
	}
	if err == nil {
		err = first
	}
	if err != nil {
		return replies, fmt.Errorf("redis backend: slots: %w", classify(err))
	}
	return replies, nil
}

// pipeSlots sends n calls of slots.lua, call(k) giving the k-th's key and arguments, in one
// pipeline by EVALSHA; calls that find the script not loaded are loaded and sent again, in
// order (they did not run).
func (b *Backend) pipeSlots(ctx context.Context, n int, call func(k int) (string, []any)) ([]*goredis.Cmd, error) {
	cmds := make([]*goredis.Cmd, n)
	if n == 1 {
		// One call, as most batches hold one slot: no pipeline; Run sends EVALSHA, and EVAL
		// when the script is not loaded.
		key, args := call(0)
		cmds[0] = slotsScript.Run(ctx, b.rdb, []string{key}, args...)
		return cmds, cmds[0].Err()
	}
	send := func(which []int) error {
		pipe := b.rdb.Pipeline()
		for _, k := range which {
			key, args := call(k)
			cmds[k] = slotsScript.EvalSha(ctx, pipe, []string{key}, args...)
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	all := make([]int, n)
	for k := range all {
		all[k] = k
	}
	err := send(all)
	if err == nil {
		return cmds, nil
	}
	var again []int
	for k, c := range cmds {
		if c.Err() != nil && strings.HasPrefix(c.Err().Error(), "NOSCRIPT") {
			again = append(again, k)
		}
	}
	if len(again) == 0 {
		return cmds, err
	}
	if lerr := slotsScript.Load(ctx, b.rdb).Err(); lerr != nil {
		return cmds, lerr
	}
	if cc, ok := b.rdb.(*goredis.ClusterClient); ok {
		// Load on every master: SCRIPT LOAD through a ClusterClient reaches one node.
		if lerr := cc.ForEachMaster(ctx, func(ctx context.Context, c *goredis.Client) error {
			return slotsScript.Load(ctx, c).Err()
		}); lerr != nil {
			return cmds, lerr
		}
	}
	return cmds, send(again)
}

// undoSlots undoes, before the decision answers and in reverse order, what the calls of a refused or
// failed batch wrote: an acquire's slot removed or its former expiry restored, a release's slot
// given back while there is room.
func (b *Backend) undoSlots(reqs []backend.Request, idx []int, replies []slotReply) {
	var todo []int
	for k := len(idx) - 1; k >= 0; k-- {
		if replies[k].written {
			todo = append(todo, k)
		}
	}
	if len(todo) == 0 {
		return
	}
	now := b.nowArg()
	ctx, cancel := context.WithTimeout(context.Background(), max(b.timeout, time.Second))
	defer cancel()
	_, err := b.pipeSlots(ctx, len(todo), func(k int) (string, []any) {
		r := &reqs[idx[todo[k]]]
		return storedKey(b.prefix, r.Key), []any{"u", now, r.Limit.Rate, r.Limit.PeriodMicros(), r.Slot, strconv.FormatInt(replies[todo[k]].prev, 10)}
	})
	if err != nil {
		b.warn.Warn("slots undo", "redis backend: undoing a refused batch's slots failed: they free themselves at their lifetime's end", "err", classify(err))
	}
}
