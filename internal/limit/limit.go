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
	// Algorithm decides how requests are counted (default GCRA). Under the window algorithms
	// Burst must equal Rate: Rate requests per window.
	Algorithm Algorithm
	// Window aligns FixedWindow's windows (zero: Period-long windows from the Unix epoch, UTC).
	Window Window
}

// ErrInvalid is returned, wrapped, for a limit that cannot be decided exactly.
var ErrInvalid = errors.New("invalid limit")

// Validate reports whether l can be decided.
func (l Limit) Validate() error {
	if l.Algorithm != GCRA {
		return l.validateWindow()
	}
	if l.Window != (Window{}) {
		return fmt.Errorf("%w: a window alignment applies to fixed_window only", ErrInvalid)
	}
	switch {
	case l.Rate < 0:
		return fmt.Errorf("%w: rate %d < 0", ErrInvalid, l.Rate)
	case l.Rate > 1<<32:
		return fmt.Errorf("%w: rate %d too large", ErrInvalid, l.Rate)
	case l.Period < time.Microsecond || l.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: period %v must be a positive whole number of microseconds", ErrInvalid, l.Period)
	case l.Period > MaxTolerance:
		return fmt.Errorf("%w: period %v longer than %v", ErrInvalid, l.Period, MaxTolerance)
	case l.Rate == 0:
		return nil
	case l.Burst <= 0:
		return fmt.Errorf("%w: burst %d must be > 0", ErrInvalid, l.Burst)
	case l.Burst > 1<<32:
		return fmt.Errorf("%w: burst %d too large", ErrInvalid, l.Burst)
	}
	hi, lo := bits.Mul64(uint64(l.Burst), uint64(l.Period/time.Microsecond))
	if hi >= uint64(l.Rate) {
		return fmt.Errorf("%w: burst %d × period %v / rate %d exceeds %v", ErrInvalid, l.Burst, l.Period, l.Rate, MaxTolerance)
	}
	q, _ := bits.Div64(hi, lo, uint64(l.Rate))
	if q > uint64(MaxTolerance/time.Microsecond) {
		return fmt.Errorf("%w: burst %d × period %v / rate %d exceeds %v", ErrInvalid, l.Burst, l.Period, l.Rate, MaxTolerance)
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
	switch {
	case l.Algorithm > SlidingLog:
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalid, l.Algorithm)
	case l.Rate < 0 || l.Rate > 1<<32:
		return fmt.Errorf("%w: rate %d outside [0, 2^32]", ErrInvalid, l.Rate)
	case l.Period < time.Microsecond || l.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: period %v must be a positive whole number of microseconds", ErrInvalid, l.Period)
	case l.Period > MaxTolerance:
		return fmt.Errorf("%w: period %v longer than %v", ErrInvalid, l.Period, MaxTolerance)
	case l.Rate > 0 && l.Burst != l.Rate:
		return fmt.Errorf("%w: %v admits rate %d per window: burst %d must equal it", ErrInvalid, l.Algorithm, l.Rate, l.Burst)
	case l.Overdraft && l.Algorithm != FixedWindow:
		return fmt.Errorf("%w: overdraft needs gcra or fixed_window, not %v (a charge that goes over cannot be repaid by a %s)",
			ErrInvalid, l.Algorithm, map[Algorithm]string{SlidingWindow: "weighted estimate", SlidingLog: "log of admitted hits"}[l.Algorithm])
	case l.Window != (Window{}) && l.Algorithm != FixedWindow:
		return fmt.Errorf("%w: calendar windows and timezones apply to fixed_window only, not %v", ErrInvalid, l.Algorithm)
	}
	w := l.Window
	switch {
	case w.Calendar != NoCalendar && w.Calendar != Day && w.Calendar != Week && w.Calendar != Month && w.Calendar != Year:
		return fmt.Errorf("%w: calendar windows of unit %v: want day, week, month or year", ErrInvalid, w.Calendar)
	case w.Calendar != NoCalendar && (w.Every < 1 || w.Every > 100*365):
		return fmt.Errorf("%w: calendar windows of %d units", ErrInvalid, w.Every)
	case w.Calendar == NoCalendar && (w.Location != nil || w.Every != 0):
		return fmt.Errorf("%w: a location or a count of units without a calendar unit", ErrInvalid)
	}
	switch l.Algorithm {
	case SlidingWindow:
		if l.Period%time.Millisecond != 0 {
			return fmt.Errorf("%w: sliding_window period %v must be a whole number of milliseconds", ErrInvalid, l.Period)
		}
		if ms := int64(l.Period / time.Millisecond); l.Rate > 0 && ms > (1<<52)/l.Rate {
			return fmt.Errorf("%w: sliding_window rate %d × period %v in milliseconds exceeds 2^52", ErrInvalid, l.Rate, l.Period)
		}
	case SlidingLog:
		if l.Rate > MaxLogRate {
			return fmt.Errorf("%w: sliding_log keeps one entry per admitted request: rate %d above %d (16 bytes each, %d KB a key at most): use sliding_window or gcra",
				ErrInvalid, l.Rate, MaxLogRate, 16*MaxLogRate/1000)
		}
	}
	return nil
}
