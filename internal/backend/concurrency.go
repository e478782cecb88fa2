package backend

import (
	"slices"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// A limit of algorithm limit.Concurrency holds at most Rate slots at once. A request acquires
// the slot its Slot names (Cost > 0), releases it (Refund) or checks (Cost 0); a slot not
// released is freed Period after it was last acquired. Acquiring a slot already held renews it
// (a retry, or a long stream keeping its slot) and counts once. A release of a slot not held
// (unknown, expired, released already, or another key's) changes nothing: releases are
// idempotent. An acquire without a slot id is denied: what holds nothing could not be released.
//
// Its State is Alg Concurrency and Slots, the slots held (at most Rate, with their expiries),
// in the order they were first acquired, TAT the latest expiry, Rate and Period the limit's.

// Slot is one slot of a Concurrency key: its id and the instant it frees itself (µs).
type Slot struct {
	ID     string
	Expiry int64
}

// slotBytes is what a slot costs in memory beyond its id's bytes: its Slot in the slice.
const slotBytes = 24

// liveSlots returns the slots of s still held at now.
func liveSlots(s State, now int64) []Slot {
	if s.Alg != limit.Concurrency {
		return nil
	}
	for i, sl := range s.Slots {
		if sl.Expiry <= now {
			// Rare: copy out the live ones.
			live := slices.Clone(s.Slots[:i])
			for _, sl := range s.Slots[i+1:] {
				if sl.Expiry > now {
					live = append(live, sl)
				}
			}
			return live
		}
	}
	return s.Slots
}

// slotState is the State holding live under l.
func slotState(l limit.Limit, live []Slot) State {
	s := State{Alg: limit.Concurrency, Rate: l.Rate, Period: l.PeriodMicros(), Slots: live}
	for _, sl := range live {
		s.TAT = max(s.TAT, sl.Expiry)
	}
	return s
}

// DecideSlot decides r, a request under a Concurrency limit, on s at now: the state after it and
// the decision. Remaining is the slots free after it; ResetAfter the time until every slot held
// has freed itself; a denied acquire's RetryAfter the time until the first held slot frees itself
// unless released sooner.
func DecideSlot(s State, r *Request, now int64) (State, Decision) {
	l := r.Limit
	live := liveSlots(s, now)
	i := slices.IndexFunc(live, func(sl Slot) bool { return sl.ID == r.Slot })
	switch {
	case r.Refund:
		if i >= 0 {
			live = slices.Delete(slices.Clone(live), i, i+1)
		}
	case r.Cost <= 0:
		ns := slotState(l, live)
		return ns, slotDecision(ns, l, now, i >= 0 || int64(len(live)) < l.Rate)
	case r.Slot != "" && i >= 0:
		live = slices.Clone(live)
		live[i].Expiry = now + l.PeriodMicros()
	case r.Slot != "" && int64(len(live)) < l.Rate:
		live = append(slices.Clip(live), Slot{ID: r.Slot, Expiry: now + l.PeriodMicros()})
	default:
		ns := slotState(l, live)
		return ns, slotDecision(ns, l, now, false)
	}
	ns := slotState(l, live)
	return ns, slotDecision(ns, l, now, true)
}

// slotDecision describes the state s under l.
func slotDecision(s State, l limit.Limit, now int64, allowed bool) Decision {
	d := Decision{Allowed: allowed, Remaining: max(l.Rate-int64(len(s.Slots)), 0), ResetAfter: since(s.TAT, now)}
	if !allowed {
		first := s.TAT
		for _, sl := range s.Slots {
			first = min(first, sl.Expiry)
		}
		d.RetryAfter = max(since(first, now), time.Microsecond)
	}
	return d
}

// checkSlot is the decision a check (cost 0) of s under l reports, the state unchanged.
func checkSlot(s State, r *Request, now int64) Decision {
	c := *r
	c.Refund, c.Cost = false, 0
	_, d := DecideSlot(s, &c, now)
	return d
}

// HoldsSlots reports whether reqs has a request under a Concurrency limit.
func HoldsSlots(reqs []Request) bool {
	for i := range reqs {
		if reqs[i].Limit.Algorithm == limit.Concurrency {
			return true
		}
	}
	return false
}
