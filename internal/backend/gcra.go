package backend

import (
	"errors"
	"fmt"
	"math/bits"
	"time"
)

// MaxTolerance bounds Burst×Period/Rate, the longest time a key's state can reach into the
// future. It keeps every intermediate value of the arithmetic inside int64 microseconds.
const MaxTolerance = 100 * 365 * 24 * time.Hour

// Limit is a rate limit: Rate requests per Period, admitting up to Burst requests at once after
// a quiet period. A Rate of 0 denies everything. The zero value is a limit that denies everything.
type Limit struct {
	Rate   int64         // requests per Period; 0 denies every request
	Period time.Duration // whole microseconds, > 0
	Burst  int64         // the GCRA tolerance in requests; > 0 when Rate > 0
}

// ErrInvalidLimit is returned for a limit that cannot be decided exactly.
var ErrInvalidLimit = errors.New("invalid limit")

// Validate reports whether l can be decided.
func (l Limit) Validate() error {
	switch {
	case l.Rate < 0:
		return fmt.Errorf("%w: rate %d < 0", ErrInvalidLimit, l.Rate)
	case l.Rate > 1<<32:
		return fmt.Errorf("%w: rate %d too large", ErrInvalidLimit, l.Rate)
	case l.Period < time.Microsecond || l.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: period %v must be a positive whole number of microseconds", ErrInvalidLimit, l.Period)
	case l.Period > MaxTolerance:
		return fmt.Errorf("%w: period %v longer than %v", ErrInvalidLimit, l.Period, MaxTolerance)
	case l.Rate == 0:
		return nil
	case l.Burst <= 0:
		return fmt.Errorf("%w: burst %d must be > 0", ErrInvalidLimit, l.Burst)
	case l.Burst > 1<<32:
		return fmt.Errorf("%w: burst %d too large", ErrInvalidLimit, l.Burst)
	}
	hi, lo := bits.Mul64(uint64(l.Burst), uint64(l.Period/time.Microsecond))
	if hi >= uint64(l.Rate) {
		return fmt.Errorf("%w: burst %d × period %v / rate %d exceeds %v", ErrInvalidLimit, l.Burst, l.Period, l.Rate, MaxTolerance)
	}
	q, _ := bits.Div64(hi, lo, uint64(l.Rate))
	if q > uint64(MaxTolerance/time.Microsecond) {
		return fmt.Errorf("%w: burst %d × period %v / rate %d exceeds %v", ErrInvalidLimit, l.Burst, l.Period, l.Rate, MaxTolerance)
	}
	return nil
}

func (l Limit) periodMicros() int64 { return int64(l.Period / time.Microsecond) }

// Decision is the outcome of one rate-limit check. The zero value denies.
type Decision struct {
	Allowed    bool
	Remaining  int64         // requests that would still be admitted now, after this one
	RetryAfter time.Duration // when denied: until this request would be admitted; zero when Allowed
	ResetAfter time.Duration // until the key is back to a full burst
}

// State is the stored GCRA state of one key: the theoretical arrival time TAT, exactly
// TAT + Frac/Rate microseconds since the Unix epoch, and the Rate and Period it was computed
// under (so a changed limit can be applied at once). The zero value is a key never seen.
type State struct {
	TAT    int64 // microseconds
	Frac   int64 // in [0, Rate): the fraction of a microsecond, in units of 1/Rate µs
	Rate   int64
	Period int64 // microseconds
}

// Fresh reports whether s holds no usage at time now: the key may be forgotten.
func (s State) Fresh(now int64) bool { return s.TAT < now || (s.TAT == now && s.Frac == 0) }

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
func interval(n int64, l Limit) tick {
	hi, lo := bits.Mul64(uint64(n), uint64(l.periodMicros()))
	q, r := bits.Div64(hi, lo, uint64(l.Rate))
	return tick{int64(q), int64(r)}
}

// count returns floor(d / T) for a span d ≥ 0: how many emission intervals fit in d.
func count(d tick, l Limit) int64 {
	hi, lo := bits.Mul64(uint64(d.us), uint64(l.Rate))
	lo, c := bits.Add64(lo, uint64(d.frac), 0)
	hi += c
	q, _ := bits.Div64(hi, lo, uint64(l.periodMicros()))
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

// current returns the TAT of s under limit l at time now: never before now, and clamped so that
// a changed limit applies at once. State computed under another rate or period keeps the number
// of requests it holds (rounded up), re-expressed in l's emission interval; any state is capped
// at a full burst of l.
func current(s State, l Limit, now int64) tick {
	nowT := tick{us: now}
	if s.Fresh(now) {
		return nowT
	}
	var held tick
	if s.Rate == l.Rate && s.Period == l.periodMicros() {
		held = sub(tick{s.TAT, s.Frac}, nowT, l.Rate)
	} else {
		old := Limit{Rate: s.Rate, Period: time.Duration(s.Period) * time.Microsecond, Burst: 1}
		if s.Rate <= 0 || s.Period <= 0 || s.Frac < 0 || s.Frac >= s.Rate {
			return nowT // not a state this package wrote: forget it rather than guess
		}
		d := sub(tick{s.TAT, s.Frac}, nowT, s.Rate)
		n := count(d, old)
		if rem := sub(d, interval(n, old), s.Rate); rem.us > 0 || rem.frac > 0 {
			n++
		}
		if n > l.Burst {
			n = l.Burst
		}
		held = interval(n, l)
	}
	if full := interval(l.Burst, l); full.less(held) {
		held = full
	}
	return add(nowT, held, l.Rate)
}

func (t tick) state(l Limit) State {
	return State{TAT: t.us, Frac: t.frac, Rate: l.Rate, Period: l.periodMicros()}
}

// Decide applies GCRA: it charges cost requests to the key whose state is s, at time now
// (microseconds), and returns the new state and the decision. A denied decision leaves the state
// unchanged: the returned state is s. A cost of 0 only checks. A cost above the burst can never
// be admitted: it is denied without touching the state, with Remaining and ResetAfter as for any
// denial and RetryAfter the time to a full burst (ResetAfter) plus one full burst span
// (Burst×Period/Rate, rounded up): never zero, so that no client reads it as "retry now". Under
// a Rate of 0 every request is denied with RetryAfter equal to the Period. l must be valid (see
// Limit.Validate).
func Decide(s State, l Limit, now int64, cost int64) (State, Decision) {
	if l.Rate == 0 {
		return s, Decision{RetryAfter: l.Period}
	}
	tat := current(s, l, now)
	nowT := tick{us: now}
	full := interval(l.Burst, l)
	// Remaining before this request: floor((now + full − tat) / T).
	headroom := sub(add(nowT, full, l.Rate), tat, l.Rate)
	if cost > l.Burst {
		reset := ceilDuration(sub(tat, nowT, l.Rate))
		return s, Decision{Remaining: count(headroom, l), RetryAfter: ceilDuration(full) + reset, ResetAfter: reset}
	}
	if cost < 0 {
		cost = 0
	}
	newTAT := add(tat, interval(cost, l), l.Rate)
	allowAt := sub(newTAT, full, l.Rate)
	if nowT.less(allowAt) {
		return s, Decision{
			Remaining:  count(headroom, l),
			RetryAfter: ceilDuration(sub(allowAt, nowT, l.Rate)),
			ResetAfter: ceilDuration(sub(tat, nowT, l.Rate)),
		}
	}
	return newTAT.state(l), Decision{
		Allowed:    true,
		Remaining:  count(headroom, l) - cost,
		ResetAfter: ceilDuration(sub(newTAT, nowT, l.Rate)),
	}
}

// Refund gives back cost requests to the key whose state is s (is_negative_hits), never beyond a
// full burst. It always allows.
func Refund(s State, l Limit, now int64, cost int64) (State, Decision) {
	if l.Rate == 0 {
		return s, Decision{Allowed: true}
	}
	tat := current(s, l, now)
	nowT := tick{us: now}
	if cost > l.Burst {
		cost = l.Burst
	}
	if cost > 0 {
		tat = sub(tat, interval(cost, l), l.Rate)
		if tat.less(nowT) {
			tat = nowT
		}
	}
	full := interval(l.Burst, l)
	return tat.state(l), Decision{
		Allowed:    true,
		Remaining:  count(sub(add(nowT, full, l.Rate), tat, l.Rate), l),
		ResetAfter: ceilDuration(sub(tat, nowT, l.Rate)),
	}
}
