package limit

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
	// Overdraft charges a request's cost even when it does not fit: the key goes into debt
	// (its TAT past now + Burst×Period/Rate, up to now + MaxTolerance) and every request but a
	// refund is denied until the sustained rate has repaid it. For costs known only after the
	// fact (tokens of a response). See backend.Decide.
	Overdraft bool
	// Shared marks one region's share of a limit enforced across regions (package regions):
	// when the share changes, the key keeps every request it holds, a debt included, instead
	// of being capped at the new burst; nothing else differs. GCRA only. (Rules never make a
	// shared limit with overdraft: a charge past a region's share would take what the other
	// regions hold. The regions' own charges that move a share's tokens are such charges.)
	Shared bool
	// Algorithm decides how requests are counted (default GCRA). Under the window algorithms
	// Burst must equal Rate: Rate requests per window.
	Algorithm Algorithm
	// Window aligns FixedWindow's windows (zero: Period-long windows from the Unix epoch, UTC).
	Window Window
}

// ErrInvalid is returned, wrapped, for a limit that cannot be decided exactly.
var ErrInvalid = errors.New("invalid limit")

// Validate reports whether l can be decided. Its refusals are *Error, naming the field at
// fault: the rule files' loader and the service point their users at what they wrote from it.
func (l Limit) Validate() error {
	if l.Shared && l.Algorithm != GCRA {
		return &Error{Field: SharedField, Reason: fmt.Sprintf("applies to algorithm gcra only, not %v: only GCRA's state can move between regions' shares exactly", l.Algorithm)}
	}
	if l.Algorithm == Concurrency {
		return l.validateConcurrency()
	}
	if l.Algorithm != GCRA {
		return l.validateWindow()
	}
	if l.Window != (Window{}) {
		return &Error{Field: WindowField, Reason: "applies to algorithm fixed_window only, not gcra"}
	}
	if err := l.validateRatePeriod(); err != nil || l.Rate == 0 {
		return err
	}
	switch {
	case l.Burst <= 0:
		return &Error{Field: BurstField, Value: fmt.Sprint(l.Burst), Reason: "must be > 0"}
	case l.Burst > 1<<32:
		return &Error{Field: BurstField, Value: fmt.Sprint(l.Burst), Reason: "is above 2^32"}
	}
	hi, lo := bits.Mul64(uint64(l.Burst), uint64(l.Period/time.Microsecond))
	if hi < uint64(l.Rate) {
		if q, _ := bits.Div64(hi, lo, uint64(l.Rate)); q <= uint64(MaxTolerance/time.Microsecond) {
			return nil
		}
	}
	return &Error{Reason: fmt.Sprintf("burst %d × period %v / rate %d exceeds %v", l.Burst, l.Period, l.Rate, MaxTolerance)}
}

// validateRatePeriod checks what every algorithm asks of Rate and Period.
func (l Limit) validateRatePeriod() error {
	switch {
	case l.Rate < 0:
		return &Error{Field: RateField, Value: fmt.Sprint(l.Rate), Reason: "must not be negative"}
	case l.Rate > 1<<32:
		return &Error{Field: RateField, Value: fmt.Sprint(l.Rate), Reason: "is above 2^32"}
	case l.Period <= 0:
		return &Error{Field: PeriodField, Value: l.Period.String(), Reason: "must be > 0"}
	case l.Period%time.Microsecond != 0:
		return &Error{Field: PeriodField, Value: l.Period.String(), Reason: "must be a whole number of microseconds"}
	case l.Period > MaxTolerance:
		return &Error{Field: PeriodField, Value: l.Period.String(),
			Reason: fmt.Sprintf("is longer than the longest supported, %d days", MaxTolerance/(24*time.Hour))}
	}
	return nil
}

// PeriodMicros is l's Period in microseconds.
func (l Limit) PeriodMicros() int64 { return int64(l.Period / time.Microsecond) }

// MaxCharge is the largest cost an overdraft charge under l counts: the requests that fit in
// MaxTolerance (at most 2^33), since the debt saturates there. A larger cost charges as much.
// l must be valid with a Rate above 0.
func (l Limit) MaxCharge() int64 {
	const most = 1 << 33
	hi, lo := bits.Mul64(uint64(MaxTolerance/time.Microsecond), uint64(l.Rate))
	if hi >= uint64(l.PeriodMicros()) {
		return most
	}
	q, _ := bits.Div64(hi, lo, uint64(l.PeriodMicros()))
	return int64(min(q, most))
}

// ClampCost is the cost Decide counts of cost under l: none below 0; for an overdraft charge
// at most MaxCharge, otherwise at most Burst+1 (any cost above the burst is denied alike).
func (l Limit) ClampCost(cost int64) int64 {
	most := l.Burst + 1
	if l.Overdraft {
		most = l.maxOverdraftCharge()
	}
	return min(max(cost, 0), most)
}

// maxOverdraftCharge is the most an overdraft charge under l counts.
func (l Limit) maxOverdraftCharge() int64 {
	if l.Algorithm == FixedWindow {
		return MaxWindowCharge
	}
	return l.MaxCharge()
}

func (l Limit) validateWindow() error {
	if l.Algorithm > SlidingLog {
		return &Error{Field: AlgorithmField, Value: fmt.Sprint(uint8(l.Algorithm)), Reason: "is not known"}
	}
	if err := l.validateRatePeriod(); err != nil {
		return err
	}
	switch {
	case l.Rate > 0 && l.Burst != l.Rate:
		return &Error{Field: BurstField, Reason: fmt.Sprintf("applies to algorithm gcra only: %v admits the rate, %d, per window, not %d", l.Algorithm, l.Rate, l.Burst)}
	case l.Overdraft && !l.Algorithm.Overdraws():
		return &Error{Field: OverdraftField, Reason: fmt.Sprintf("applies to algorithms gcra and fixed_window, not %v: a charge that goes over cannot be repaid by a %s",
			l.Algorithm, map[Algorithm]string{SlidingWindow: "weighted estimate", SlidingLog: "log of admitted hits"}[l.Algorithm])}
	case l.Window != (Window{}) && l.Algorithm != FixedWindow:
		return &Error{Field: WindowField, Reason: fmt.Sprintf("applies to algorithm fixed_window only, not %v", l.Algorithm)}
	}
	w := l.Window
	switch {
	case w.Calendar != NoCalendar && w.Calendar != Day && w.Calendar != Week && w.Calendar != Month && w.Calendar != Year:
		return &Error{Field: WindowField, Reason: fmt.Sprintf("applies to units day, week, month and year, not %v", w.Calendar)}
	case w.Calendar != NoCalendar && (w.Every < 1 || w.Every > 100*365):
		return &Error{Field: WindowField, Reason: fmt.Sprintf("of %d %ss: want 1 to %d", w.Every, w.Calendar, 100*365)}
	case w.Calendar == NoCalendar && (w.Location != nil || w.Every != 0):
		return &Error{Field: WindowField, Reason: "has a location or a count of units but no calendar unit"}
	}
	switch l.Algorithm {
	case SlidingWindow:
		if l.Period%time.Millisecond != 0 {
			return &Error{Field: PeriodField, Value: l.Period.String(), Reason: "must be a whole number of milliseconds under sliding_window"}
		}
		if ms := int64(l.Period / time.Millisecond); l.Rate > 0 && ms > (1<<52)/l.Rate {
			return &Error{Reason: fmt.Sprintf("sliding_window rate %d × period %v in milliseconds exceeds 2^52", l.Rate, l.Period)}
		}
	case SlidingLog:
		if l.Rate > MaxLogRate {
			return &Error{Field: RateField, Value: fmt.Sprint(l.Rate), Reason: fmt.Sprintf("is above %d: sliding_log keeps one entry per admitted request (16 bytes each, %d KB a key at most): use sliding_window or gcra",
				MaxLogRate, 16*MaxLogRate/1000)}
		}
	}
	return nil
}

// validateConcurrency is Validate for a Concurrency limit: Rate slots of Period's lifetime.
func (l Limit) validateConcurrency() error {
	switch {
	case l.Rate < 1 || l.Rate > MaxInFlight:
		return &Error{Field: RateField, Value: fmt.Sprint(l.Rate), Reason: fmt.Sprintf("must be from 1 to %d", MaxInFlight)}
	case l.Burst != l.Rate:
		return &Error{Field: BurstField, Reason: "applies to rate algorithms only"}
	case l.Period < time.Millisecond || l.Period%time.Millisecond != 0:
		return &Error{Field: PeriodField, Value: l.Period.String(), Reason: "must be a whole number of milliseconds, at least 1ms"}
	case l.Period > MaxSlotLifetime:
		return &Error{Field: PeriodField, Value: l.Period.String(), Reason: fmt.Sprintf("is longer than %v", MaxSlotLifetime)}
	case l.Overdraft:
		return &Error{Field: OverdraftField, Reason: "applies to rate algorithms only"}
	case l.Shared:
		return &Error{Field: SharedField, Reason: "applies to algorithm gcra only"}
	case l.Window != (Window{}):
		return &Error{Field: WindowField, Reason: "applies to algorithm fixed_window only"}
	}
	return nil
}
