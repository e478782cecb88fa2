package backend

import (
	"math/bits"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// Decision is the outcome of one rate-limit check. The zero value denies.
type Decision struct {
	Allowed    bool
	Remaining  int64         // requests that would still be admitted now, after this one
	RetryAfter time.Duration // when denied: until this request would be admitted; zero when Allowed
	ResetAfter time.Duration // until the key is back to a full burst
}

// Tighter reports whether c answers for a descriptor rather than b, the one answering so far,
// among the decisions of one descriptor's limits: a denial over an admission, and among
// admissions the one with less remaining. (A response reports, per descriptor, the limit that
// denies it or else the one with least remaining.)
func Tighter(b, c *Decision) bool { return b.Allowed && (!c.Allowed || c.Remaining < b.Remaining) }

// State is the stored GCRA state of one key: the theoretical arrival time TAT, exactly
// TAT + Frac/Rate microseconds since the Unix epoch, and the Rate and Period it was computed
// under (so a changed limit can be applied at once). The zero value is a key never seen.
//
// The window algorithms use the same fields otherwise (see Alg): FixedWindow keeps the end of
// its window in TAT and its count in Frac; SlidingWindow the end of its current window in TAT,
// that window's count in Frac and the previous window's in Prev; SlidingLog its admitted hits
// in Log, TAT unused.
type State struct {
	TAT    int64 // microseconds
	Frac   int64 // in [0, Rate): the fraction of a microsecond, in units of 1/Rate µs
	Rate   int64
	Period int64 // microseconds
	// Alg is the algorithm that wrote the state; a state of another algorithm than the
	// limit's is no usage (a rule that changes algorithm starts afresh).
	Alg  limit.Algorithm
	Prev int64 // SlidingWindow: hits of the window before TAT's
	// Log is SlidingLog's record: (instant µs, hits) pairs, oldest first, one pair per instant
	// that admitted hits. Never modified once stored: a decision that changes it makes a copy.
	Log []int64
	// Slots are a Concurrency key's slots held (see DecideSlot); TAT is then the latest expiry.
	// Never modified once stored, as Log.
	Slots []Slot
}

// Fresh reports whether s holds no usage at time now: the key may be forgotten.
func (s State) Fresh(now int64) bool {
	if s.Alg != limit.GCRA {
		return windowFresh(&s, now)
	}
	return s.TAT < now || (s.TAT == now && s.Frac == 0)
}

// windowFresh is Fresh under a window algorithm, apart so that GCRA's Fresh is inlined.
//
//go:noinline
func windowFresh(s *State, now int64) bool { return s.Expiry() <= now }

// tick is an exact instant or span: us + frac/rate microseconds, 0 ≤ frac < rate.
type tick struct{ us, frac int64 }

func (a tick) less(b tick) bool { return a.us < b.us || (a.us == b.us && a.frac < b.frac) }

func add(a, b tick, rate int64) tick {
	t := tick{a.us + b.us, a.frac + b.frac}
	if t.frac >= rate {
		t.frac -= rate
		t.us++
	}
	return t
}

func sub(a, b tick, rate int64) tick {
	t := tick{a.us - b.us, a.frac - b.frac}
	if t.frac < 0 {
		t.frac += rate
		t.us--
	}
	return t
}

// interval returns n emission intervals, n×Period/Rate, exactly. n×Period/Rate must fit the
// bound Validate enforces (n ≤ Burst).
func interval(n int64, l limit.Limit) tick {
	hi, lo := bits.Mul64(uint64(n), uint64(l.PeriodMicros()))
	q, r := bits.Div64(hi, lo, uint64(l.Rate))
	return tick{int64(q), int64(r)}
}

// countCapped returns min(floor(d / T), most) for a span d ≥ 0 of any length.
func countCapped(d tick, l limit.Limit, most int64) int64 {
	hi, lo := bits.Mul64(uint64(d.us), uint64(l.Rate))
	lo, c := bits.Add64(lo, uint64(d.frac), 0)
	hi += c
	if hi >= uint64(l.PeriodMicros()) {
		return most
	}
	q, _ := bits.Div64(hi, lo, uint64(l.PeriodMicros()))
	return int64(min(q, uint64(most)))
}

// count returns floor(d / T) for a span d ≥ 0: how many emission intervals fit in d.
func count(d tick, l limit.Limit) int64 {
	hi, lo := bits.Mul64(uint64(d.us), uint64(l.Rate))
	lo, c := bits.Add64(lo, uint64(d.frac), 0)
	hi += c
	q, _ := bits.Div64(hi, lo, uint64(l.PeriodMicros()))
	return int64(q)
}

// ceilDuration rounds a span ≥ 0 up to whole microseconds.
func ceilDuration(d tick) time.Duration {
	us := d.us
	if d.frac > 0 {
		us++
	}
	if us < 0 {
		us = 0
	}
	return time.Duration(us) * time.Microsecond
}

// maxSpan is MaxTolerance as a span: how far past now a debt reaches at most.
var maxSpan = tick{us: int64(limit.MaxTolerance / time.Microsecond)}

// current returns the TAT of s under limit l at time now: never before now, and clamped so that
// a changed limit applies at once. State computed under another rate or period keeps the number
// of requests it holds (rounded up), re-expressed in l's emission interval, up to a full burst
// (a debt is forgiven when the rate or period changes); state under the same rate and period
// is capped at a full burst of l, or under overdraft at MaxTolerance (its debt is kept). A
// Shared limit keeps every request held, debt included, whatever changed.
func current(s State, l limit.Limit, now int64) tick {
	nowT := tick{us: now}
	if s.Fresh(now) {
		return nowT
	}
	var held tick
	if s.Rate == l.Rate && s.Period == l.PeriodMicros() {
		held = sub(tick{s.TAT, s.Frac}, nowT, l.Rate)
	} else {
		old := limit.Limit{Rate: s.Rate, Period: time.Duration(s.Period) * time.Microsecond, Burst: 1}
		if s.Rate <= 0 || s.Period <= 0 || s.Frac < 0 || s.Frac >= s.Rate {
			return nowT // not a state this package wrote: forget it rather than guess
		}
		d := sub(tick{s.TAT, s.Frac}, nowT, s.Rate)
		// A span of more than 2^33 intervals (a debt) holds more than any burst: no need to
		// count it exactly.
		n := countCapped(d, old, 1<<33)
		if n < 1<<33 {
			if rem := sub(d, interval(n, old), s.Rate); rem.us > 0 || rem.frac > 0 {
				n++
			}
		}
		switch {
		case l.Shared:
			// Every request held is kept, up to what MaxTolerance holds (so that the span
			// below fits).
			n = min(n, countCapped(maxSpan, l, 1<<33))
		case n > l.Burst:
			n = l.Burst
		}
		held = interval(n, l)
	}
	most := interval(l.Burst, l)
	if l.Overdraft || l.Shared {
		most = maxSpan
	}
	if most.less(held) {
		held = most
	}
	return add(nowT, held, l.Rate)
}

func (t tick) state(l limit.Limit) State {
	return State{TAT: t.us, Frac: t.frac, Rate: l.Rate, Period: l.PeriodMicros()}
}

// Decide applies GCRA: it charges cost requests to the key whose state is s, at time now
// (microseconds), and returns the new state and the decision. A denied decision describes the
// state s, which it returns, unless l.Overdraft (below). A cost of 0 only checks: it is
// admitted while the key is not past its limit, with exactly 0 remaining included. A cost above
// the burst can never be admitted: it is denied with Remaining and ResetAfter as for any denial
// and RetryAfter the time to a full burst (ResetAfter) plus one full burst span
// (Burst×Period/Rate, rounded up): never zero, so that no client reads it as "retry now". Under
// a Rate of 0 every request is denied with RetryAfter equal to the Period. l must be valid (see
// Limit.Validate).
//
// Under l.Overdraft a cost above 0 that does not fit is denied but charged all the same (up to
// MaxCharge, the debt saturating at now + MaxTolerance): the key goes into debt, its TAT past
// now plus a full burst. Its decision describes the key after the charge: Remaining 0,
// RetryAfter the time until the debt is repaid and ResetAfter the time until a full burst is
// back. While in debt Remaining is 0 and every request with a cost, and every check, is denied;
// a check's RetryAfter is then the time until the debt is repaid, when a check is admitted
// again.
func Decide(s State, l limit.Limit, now int64, cost int64) (State, Decision) {
	if l.Rate == 0 {
		return s, Decision{RetryAfter: l.Period}
	}
	if l.Algorithm == limit.Concurrency {
		return DecideSlot(s, &Request{Limit: l, Cost: cost}, now) // names no slot: only checks
	}
	if w := windowAlg(l.Algorithm); w != nil {
		return w.decide(s, l, now, cost)
	}
	if s.Alg != limit.GCRA {
		s = State{}
	}
	tat := current(s, l, now)
	nowT := tick{us: now}
	full := interval(l.Burst, l)
	// Remaining before this request: floor((now + full − tat) / T), 0 in debt.
	top := add(nowT, full, l.Rate)
	remaining := int64(0)
	if !top.less(tat) {
		remaining = count(sub(top, tat, l.Rate), l)
	}
	reset := ceilDuration(sub(tat, nowT, l.Rate))
	cost = l.ClampCost(cost)
	if cost > l.Burst {
		if l.Overdraft {
			return debt(tat, l, now, cost)
		}
		return s, Decision{Remaining: remaining, RetryAfter: ceilDuration(full) + reset, ResetAfter: reset}
	}
	newTAT := add(tat, interval(cost, l), l.Rate)
	allowAt := sub(newTAT, full, l.Rate)
	if nowT.less(allowAt) {
		if l.Overdraft && cost > 0 {
			return debt(tat, l, now, cost)
		}
		return s, Decision{
			Remaining:  remaining,
			RetryAfter: ceilDuration(sub(allowAt, nowT, l.Rate)),
			ResetAfter: reset,
		}
	}
	return newTAT.state(l), Decision{
		Allowed:    true,
		Remaining:  remaining - cost,
		ResetAfter: ceilDuration(sub(newTAT, nowT, l.Rate)),
	}
}

// windowOps is how a window algorithm decides and refunds: one entry point per algorithm for
// Decide and Refund both.
type windowOps struct {
	decide, refund func(State, limit.Limit, int64, int64) (State, Decision)
}

// windowAlgs holds each window algorithm's windowOps, by Algorithm.
var windowAlgs = [...]windowOps{
	limit.FixedWindow:   {decideFixed, refundFixed},
	limit.SlidingWindow: {decideSliding, refundSliding},
	limit.SlidingLog:    {decideLog, refundLog},
}

// windowAlg returns a's entry of windowAlgs; nil under GCRA (or an algorithm Validate refuses).
func windowAlg(a limit.Algorithm) *windowOps {
	if a == limit.GCRA || int(a) >= len(windowAlgs) {
		return nil
	}
	return &windowAlgs[a]
}

// debt is Decide for a denied charge of cost > 0 under l.Overdraft, charged all the same: the
// state after it, and a decision describing that state (in debt: 0 remaining, usable again
// once the debt is repaid, a full burst back at its TAT).
func debt(tat tick, l limit.Limit, now int64, cost int64) (State, Decision) {
	ns := overdrawn(tat, l, now, cost)
	t, nowT := tick{us: ns.TAT, frac: ns.Frac}, tick{us: now}
	return ns, Decision{
		RetryAfter: ceilDuration(sub(sub(t, interval(l.Burst, l), l.Rate), nowT, l.Rate)),
		ResetAfter: ceilDuration(sub(t, nowT, l.Rate)),
	}
}

// overdrawn returns the state after a denied charge of cost (0 < cost ≤ l.MaxCharge()) under
// l.Overdraft on the TAT tat: tat + cost×T, saturated at now + MaxTolerance.
func overdrawn(tat tick, l limit.Limit, now int64, cost int64) State {
	// room ≥ 0: current never reaches past now + MaxTolerance.
	room := sub(add(tick{us: now}, maxSpan, l.Rate), tat, l.Rate)
	if c := interval(cost, l); c.less(room) || c == room {
		return add(tat, c, l.Rate).state(l)
	}
	return add(tick{us: now}, maxSpan, l.Rate).state(l)
}

// Refund gives back cost requests to the key whose state is s (is_negative_hits), never beyond a
// full burst. It always allows.
//
// A state written under another rate or period (a rule edited since, or another replica's rule
// during a rollout) gets the requests back in its own terms: it is neither re-expressed under l
// nor capped at l's burst, which would take back other requests' charges with the refund's. The
// decision describes the result under l.
func Refund(s State, l limit.Limit, now int64, cost int64) (State, Decision) {
	if l.Rate == 0 {
		return s, Decision{Allowed: true}
	}
	if l.Algorithm == limit.Concurrency {
		return DecideSlot(s, &Request{Limit: l, Refund: true}, now) // names no slot: releases none
	}
	if w := windowAlg(l.Algorithm); w != nil {
		return w.refund(s, l, now, cost)
	}
	if s.Alg != limit.GCRA {
		s = State{}
	}
	nowT := tick{us: now}
	if cost > l.Burst {
		cost = l.Burst
	}
	var tat tick
	if ns, ok := refundOwn(s, l, now, cost); ok {
		s, tat = ns, current(ns, l, now)
	} else {
		tat = current(s, l, now)
		if cost > 0 {
			tat = sub(tat, interval(cost, l), l.Rate)
			if tat.less(nowT) {
				tat = nowT
			}
		}
		s = tat.state(l)
	}
	top := add(nowT, interval(l.Burst, l), l.Rate)
	remaining := int64(0)
	if !top.less(tat) {
		remaining = count(sub(top, tat, l.Rate), l)
	}
	return s, Decision{
		Allowed:    true,
		Remaining:  remaining,
		ResetAfter: ceilDuration(sub(tat, nowT, l.Rate)),
	}
}

// OwnTerms reports whether a refund under l gives back to s in s's own terms (see Refund): s
// holds usage written under another rate or period, in a form this package wrote.
func OwnTerms(s State, l limit.Limit, now int64) bool {
	return s.Alg == limit.GCRA && !s.Fresh(now) && (s.Rate != l.Rate || s.Period != l.PeriodMicros()) &&
		s.Rate > 0 && s.Period > 0 && s.Frac >= 0 && s.Frac < s.Rate
}

// refundOwn gives cost (at most 2^32) requests back to s in its own terms when OwnTerms holds;
// ok is false otherwise.
func refundOwn(s State, l limit.Limit, now, cost int64) (State, bool) {
	if !OwnTerms(s, l, now) {
		return s, false
	}
	if cost <= 0 {
		return s, true
	}
	nowT := tick{us: now}
	own := limit.Limit{Rate: s.Rate, Period: time.Duration(s.Period) * time.Microsecond, Burst: 1}
	if cost > countCapped(sub(tick{s.TAT, s.Frac}, nowT, s.Rate), own, 1<<33) {
		// More than every request the state holds (a span of more than 2^33 intervals holds
		// more than any cost): none is left.
		return nowT.state(own), true
	}
	return sub(tick{s.TAT, s.Frac}, interval(cost, own), s.Rate).state(own), true
}
