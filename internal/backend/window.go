package backend

import (
	"slices"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// Expiry is the instant from which s holds no usage (µs since the epoch); ≤ now when Fresh.
func (s State) Expiry() int64 {
	switch s.Alg {
	case limit.FixedWindow:
		if s.Frac > 0 {
			return s.TAT
		}
		return 0
	case limit.SlidingWindow:
		switch {
		case s.Frac > 0:
			return s.TAT + s.Period
		case s.Prev > 0:
			return s.TAT
		}
		return 0
	case limit.Concurrency:
		return s.TAT
	case limit.SlidingLog:
		if n := len(s.Log); n >= 2 {
			return s.Log[n-2] + s.Period
		}
		return 0
	}
	if s.Frac > 0 {
		return s.TAT + 1
	}
	return s.TAT
}

func since(t, now int64) time.Duration { return time.Duration(max(t-now, 0)) * time.Microsecond }

// fixedCount returns the hits s counts in the window ending at end.
func fixedCount(s State, l limit.Limit, end int64) int64 {
	if s.Alg != limit.FixedWindow || s.TAT != end || s.Period != l.PeriodMicros() {
		return 0
	}
	return s.Frac
}

func fixedState(l limit.Limit, end, count int64) State {
	return State{TAT: end, Frac: count, Rate: l.Rate, Period: l.PeriodMicros(), Alg: limit.FixedWindow}
}

// decideFixed is Decide under FixedWindow: admitted while the window's count plus cost stays
// within Rate. Denied hits are not counted, but under overdraft. RetryAfter is the window's
// end, ResetAfter too while the window holds hits.
func decideFixed(s State, l limit.Limit, now, cost int64) (State, Decision) {
	_, end := l.Bounds(now)
	count := fixedCount(s, l, end)
	cost = l.ClampCost(cost)
	reset := time.Duration(0)
	if count > 0 {
		reset = since(end, now)
	}
	if count+cost <= l.Rate {
		n := count + cost
		d := Decision{Allowed: true, Remaining: l.Rate - n}
		if n > 0 {
			d.ResetAfter = since(end, now)
		}
		return fixedState(l, end, n), d
	}
	if l.Overdraft && cost > 0 {
		// Denied and charged all the same: the answer describes the window after the charge,
		// spent until it ends.
		return fixedState(l, end, min(count+cost, limit.MaxWindowCount)), Decision{RetryAfter: since(end, now), ResetAfter: since(end, now)}
	}
	d := Decision{Remaining: max(l.Rate-count, 0), RetryAfter: since(end, now), ResetAfter: reset}
	if cost > l.Rate {
		d.RetryAfter += l.Period // never admitted: no sooner than a window after the reset
	}
	return s, d
}

func refundFixed(s State, l limit.Limit, now, cost int64) (State, Decision) {
	_, end := l.Bounds(now)
	n := max(fixedCount(s, l, end)-l.ClampCost(cost), 0)
	d := Decision{Allowed: true, Remaining: max(l.Rate-n, 0)}
	if n > 0 {
		d.ResetAfter = since(end, now)
	}
	return fixedState(l, end, n), d
}

// slidingCounts returns the hits s counts in the window [start, end) and in the one before.
func slidingCounts(s State, l limit.Limit, start, end int64) (cur, prev int64) {
	if s.Alg != limit.SlidingWindow || s.Period != l.PeriodMicros() {
		return 0, 0
	}
	switch s.TAT {
	case end:
		return s.Frac, s.Prev
	case start:
		return 0, s.Frac
	}
	return 0, 0
}

// slidingUsed is the estimate rounded up: cur + ⌈prev × (p − e) / p⌉ with p the period and e
// the time elapsed in the window, both in whole milliseconds. Validate keeps prev × p ≤ 2^52.
func slidingUsed(l limit.Limit, cur, prev, start, now int64) int64 {
	p := int64(l.Period / time.Millisecond)
	e := (now - start) / 1000
	w := prev * (p - e)
	return cur + (w+p-1)/p
}

func slidingState(l limit.Limit, end, cur, prev int64) State {
	return State{TAT: end, Frac: cur, Prev: prev, Rate: l.Rate, Period: l.PeriodMicros(), Alg: limit.SlidingWindow}
}

// decideSliding is Decide under SlidingWindow.
func decideSliding(s State, l limit.Limit, now, cost int64) (State, Decision) {
	start, end := l.Bounds(now)
	cur, prev := slidingCounts(s, l, start, end)
	used := slidingUsed(l, cur, prev, start, now)
	cost = l.ClampCost(cost)
	if used+cost <= l.Rate {
		ns := slidingState(l, end, cur+cost, prev)
		return ns, Decision{Allowed: true, Remaining: l.Rate - used - cost, ResetAfter: since(ns.Expiry(), now)}
	}
	reset := since(slidingState(l, end, cur, prev).Expiry(), now)
	d := Decision{Remaining: max(l.Rate-used, 0), ResetAfter: reset}
	p := int64(l.Period / time.Millisecond)
	switch x := l.Rate - cur - cost; {
	case cost > l.Rate:
		d.RetryAfter = reset + l.Period
	case x >= 0: // prev > 0: admitted once its weight has decayed enough in this window
		d.RetryAfter = since(start+(p-x*p/prev)*1000, now)
	default: // cur > 0: admitted in the next window, once cur, then previous, has decayed
		d.RetryAfter = since(end+(p-(l.Rate-cost)*p/cur)*1000, now)
	}
	return s, d
}

func refundSliding(s State, l limit.Limit, now, cost int64) (State, Decision) {
	start, end := l.Bounds(now)
	cur, prev := slidingCounts(s, l, start, end)
	cur = max(cur-l.ClampCost(cost), 0)
	ns := slidingState(l, end, cur, prev)
	used := slidingUsed(l, cur, prev, start, now)
	return ns, Decision{Allowed: true, Remaining: max(l.Rate-used, 0), ResetAfter: since(ns.Expiry(), now)}
}

// liveLog returns the entries of s's log still within the last period at now, and their hits.
func liveLog(s State, l limit.Limit, now int64) ([]int64, int64) {
	if s.Alg != limit.SlidingLog || s.Period != l.PeriodMicros() {
		return nil, 0
	}
	log := s.Log
	for len(log) >= 2 && log[0] <= now-s.Period {
		log = log[2:]
	}
	n := int64(0)
	for i := 1; i < len(log); i += 2 {
		n += log[i]
	}
	return log, n
}

func logState(l limit.Limit, log []int64) State {
	return State{Rate: l.Rate, Period: l.PeriodMicros(), Alg: limit.SlidingLog, Log: log}
}

// decideLog is Decide under SlidingLog.
func decideLog(s State, l limit.Limit, now, cost int64) (State, Decision) {
	log, n := liveLog(s, l, now)
	cost = l.ClampCost(cost)
	if n+cost <= l.Rate {
		if cost > 0 {
			// Appending never changes what s holds: its elements stay as they are.
			log = append(log[:len(log):len(log)], now, cost)
		}
		ns := logState(l, log)
		return ns, Decision{Allowed: true, Remaining: l.Rate - n - cost, ResetAfter: since(ns.Expiry(), now)}
	}
	reset := since(logState(l, log).Expiry(), now)
	d := Decision{Remaining: max(l.Rate-n, 0), ResetAfter: reset}
	if cost > l.Rate {
		d.RetryAfter = reset + l.Period
		return s, d
	}
	// Admitted once enough of the oldest hits have left the period.
	need := n + cost - l.Rate
	for i := 0; i < len(log); i += 2 {
		need -= log[i+1]
		if need <= 0 {
			d.RetryAfter = since(log[i]+l.PeriodMicros(), now)
			break
		}
	}
	return s, d
}

// refundLog gives back cost hits, the most recent first.
func refundLog(s State, l limit.Limit, now, cost int64) (State, Decision) {
	log, n := liveLog(s, l, now)
	cost = l.ClampCost(cost)
	if cost > 0 && len(log) > 0 {
		log = append([]int64(nil), log...)
		for cost > 0 && len(log) > 0 {
			k := len(log) - 1
			take := min(cost, log[k])
			log[k] -= take
			cost -= take
			n -= take
			if log[k] == 0 {
				log = log[:k-1]
			}
		}
	}
	ns := logState(l, log)
	return ns, Decision{Allowed: true, Remaining: max(l.Rate-n, 0), ResetAfter: since(ns.Expiry(), now)}
}

// Equal reports whether s and o are the same state.
func (s State) Equal(o State) bool {
	return s.TAT == o.TAT && s.Frac == o.Frac && s.Rate == o.Rate && s.Period == o.Period &&
		s.Alg == o.Alg && s.Prev == o.Prev && slices.Equal(s.Log, o.Log) && slices.Equal(s.Slots, o.Slots)
}
