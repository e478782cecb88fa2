package backend

import (
	"fmt"
	"slices"
	"time"
)

// Algorithm is how a limit counts requests.
type Algorithm uint8

const (
	// GCRA is the generic cell rate algorithm: Rate requests per Period, Burst at once (the
	// default).
	GCRA Algorithm = iota
	// FixedWindow counts the hits admitted in each window (see Window) and admits while the
	// count stays within Rate; the count starts again from 0 at each window's end.
	FixedWindow
	// SlidingWindow is the two-counter estimate: the hits of the current Period-long window
	// plus those of the previous one weighted by how much of it the last Period still covers
	// (in whole milliseconds), admitted while within Rate.
	SlidingWindow
	// SlidingLog keeps the instant of every admitted hit and admits while the hits of the last
	// Period stay within Rate: exact, at a cost in memory of 16 bytes per admitted request.
	SlidingLog
)

var algorithmNames = [...]string{"gcra", "fixed_window", "sliding_window", "sliding_log"}

// Algorithms lists the algorithms' names, as the rule files spell them.
var Algorithms = algorithmNames[:]

func (a Algorithm) String() string {
	if int(a) < len(algorithmNames) {
		return algorithmNames[a]
	}
	return fmt.Sprintf("algorithm(%d)", a)
}

// ParseAlgorithm parses an algorithm's name ("" is GCRA).
func ParseAlgorithm(s string) (Algorithm, bool) {
	if s == "" {
		return GCRA, true
	}
	for i, n := range algorithmNames {
		if s == n {
			return Algorithm(i), true
		}
	}
	return GCRA, false
}

// MaxLogRate bounds a SlidingLog limit's Rate: its log holds at most Rate entries of 16 bytes,
// so a key takes at most 16 KB, which each decision on it reads and writes whole. Measured in
// Redis (BENCHMARKS.md): 80 µs of Redis time per decision on a log of 1,000 entries, 7 times
// GCRA's; 600 µs at 10,000, enough for one busy key to take most of a Redis. Rates above it
// are what sliding_window, fixed_window and GCRA are for.
const MaxLogRate = 1_000

// maxWindowCharge bounds what an overdraft charge counts under FixedWindow, and maxWindowCount
// the count it may reach: every count stays exact as a double.
const (
	maxWindowCharge = 1 << 33
	maxWindowCount  = 1 << 40
)

// Calendar is a unit of calendar windows.
type Calendar uint8

const (
	// NoCalendar: windows are Period long, from Window.Offset after the Unix epoch.
	NoCalendar Calendar = iota
	Day
	Week // from Monday 00:00
	Month
	Year
)

// Window aligns a FixedWindow limit's windows. The zero value is Period-long windows from the
// Unix epoch: a minute window starts at each minute's 00 second, in UTC.
type Window struct {
	// Calendar, when set, makes windows Every calendar days, weeks, months or years long in
	// Location, starting at local midnight: a month is a calendar month, whatever its length
	// in days or hours (daylight saving). Windows are counted from 1970-01-01 (weeks from
	// Monday 1970-01-05): with Every 3 and Month, January, April, July and October start one.
	Calendar Calendar
	Every    int64
	Location *time.Location
	// Offset shifts Period-long windows (no Calendar): a window starts at Offset + k×Period
	// µs after the epoch (a UTC week from Monday: 4 days).
	Offset int64
}

// Bounds returns the window [start, end) that holds now (µs since the Unix epoch) under a
// FixedWindow or SlidingWindow limit.
func (l Limit) Bounds(now int64) (start, end int64) {
	w := l.Window
	if w.Calendar == NoCalendar {
		p := l.periodMicros()
		start = now - floorMod(now-w.Offset, p)
		return start, start + p
	}
	loc := w.Location
	if loc == nil {
		loc = time.UTC
	}
	y, m, d := time.UnixMicro(now).In(loc).Date()
	var from, to time.Time
	switch w.Calendar {
	case Day, Week:
		days := time.Date(y, m, d, 0, 0, 0, 0, time.UTC).Unix() / 86400
		step, base := w.Every, int64(0)
		if w.Calendar == Week {
			step, base = 7*w.Every, 4 // 1970-01-05 was a Monday
		}
		k := base + floorDiv(days-base, step)*step
		from = time.Date(1970, 1, 1+int(k), 0, 0, 0, 0, loc)
		to = time.Date(1970, 1, 1+int(k+step), 0, 0, 0, 0, loc)
	case Month:
		k := floorDiv(int64(y-1970)*12+int64(m-1), w.Every) * w.Every
		from = time.Date(1970, time.Month(1+k), 1, 0, 0, 0, 0, loc)
		to = time.Date(1970, time.Month(1+k+w.Every), 1, 0, 0, 0, 0, loc)
	default: // Year
		k := floorDiv(int64(y-1970), w.Every) * w.Every
		from = time.Date(1970+int(k), 1, 1, 0, 0, 0, 0, loc)
		to = time.Date(1970+int(k+w.Every), 1, 1, 0, 0, 0, 0, loc)
	}
	return from.UnixMicro(), to.UnixMicro()
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func floorMod(a, b int64) int64 { return a - floorDiv(a, b)*b }

func (l Limit) validateWindow() error {
	switch {
	case l.Algorithm > SlidingLog:
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, l.Algorithm)
	case l.Rate < 0 || l.Rate > 1<<32:
		return fmt.Errorf("%w: rate %d outside [0, 2^32]", ErrInvalidLimit, l.Rate)
	case l.Period < time.Microsecond || l.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: period %v must be a positive whole number of microseconds", ErrInvalidLimit, l.Period)
	case l.Period > MaxTolerance:
		return fmt.Errorf("%w: period %v longer than %v", ErrInvalidLimit, l.Period, MaxTolerance)
	case l.Rate > 0 && l.Burst != l.Rate:
		return fmt.Errorf("%w: %v admits rate %d per window: burst %d must equal it", ErrInvalidLimit, l.Algorithm, l.Rate, l.Burst)
	case l.Overdraft && l.Algorithm != FixedWindow:
		return fmt.Errorf("%w: overdraft needs gcra or fixed_window, not %v (a charge that goes over cannot be repaid by a %s)",
			ErrInvalidLimit, l.Algorithm, map[Algorithm]string{SlidingWindow: "weighted estimate", SlidingLog: "log of admitted hits"}[l.Algorithm])
	case l.Window != (Window{}) && l.Algorithm != FixedWindow:
		return fmt.Errorf("%w: calendar windows and timezones apply to fixed_window only, not %v", ErrInvalidLimit, l.Algorithm)
	}
	w := l.Window
	switch {
	case w.Calendar > Year:
		return fmt.Errorf("%w: unknown calendar unit %d", ErrInvalidLimit, w.Calendar)
	case w.Calendar != NoCalendar && (w.Every < 1 || w.Every > 100*365):
		return fmt.Errorf("%w: calendar windows of %d units", ErrInvalidLimit, w.Every)
	case w.Calendar == NoCalendar && (w.Location != nil || w.Every != 0):
		return fmt.Errorf("%w: a location or a count of units without a calendar unit", ErrInvalidLimit)
	}
	switch l.Algorithm {
	case SlidingWindow:
		if l.Period%time.Millisecond != 0 {
			return fmt.Errorf("%w: sliding_window period %v must be a whole number of milliseconds", ErrInvalidLimit, l.Period)
		}
		if ms := int64(l.Period / time.Millisecond); l.Rate > 0 && ms > (1<<52)/l.Rate {
			return fmt.Errorf("%w: sliding_window rate %d × period %v in milliseconds exceeds 2^52", ErrInvalidLimit, l.Rate, l.Period)
		}
	case SlidingLog:
		if l.Rate > MaxLogRate {
			return fmt.Errorf("%w: sliding_log keeps one entry per admitted request: rate %d above %d (16 bytes each, %d KB a key at most): use sliding_window or gcra",
				ErrInvalidLimit, l.Rate, MaxLogRate, 16*MaxLogRate/1000)
		}
	}
	return nil
}

// Expiry is the instant from which s holds no usage (µs since the epoch); ≤ now when Fresh.
func (s State) Expiry() int64 {
	switch s.Alg {
	case FixedWindow:
		if s.Frac > 0 {
			return s.TAT
		}
		return 0
	case SlidingWindow:
		switch {
		case s.Frac > 0:
			return s.TAT + s.Period
		case s.Prev > 0:
			return s.TAT
		}
		return 0
	case SlidingLog:
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
func fixedCount(s State, l Limit, end int64) int64 {
	if s.Alg != FixedWindow || s.TAT != end || s.Period != l.periodMicros() {
		return 0
	}
	return s.Frac
}

func fixedState(l Limit, end, count int64) State {
	return State{TAT: end, Frac: count, Rate: l.Rate, Period: l.periodMicros(), Alg: FixedWindow}
}

// decideFixed is Decide under FixedWindow: admitted while the window's count plus cost stays
// within Rate. Denied hits are not counted, but under overdraft. RetryAfter is the window's
// end, ResetAfter too while the window holds hits.
func decideFixed(s State, l Limit, now, cost int64) (State, Decision) {
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
		return fixedState(l, end, min(count+cost, maxWindowCount)), Decision{RetryAfter: since(end, now), ResetAfter: since(end, now)}
	}
	d := Decision{Remaining: max(l.Rate-count, 0), RetryAfter: since(end, now), ResetAfter: reset}
	if cost > l.Rate {
		d.RetryAfter += l.Period // never admitted: no sooner than a window after the reset
	}
	return s, d
}

func refundFixed(s State, l Limit, now, cost int64) (State, Decision) {
	_, end := l.Bounds(now)
	n := max(fixedCount(s, l, end)-l.ClampCost(cost), 0)
	d := Decision{Allowed: true, Remaining: max(l.Rate-n, 0)}
	if n > 0 {
		d.ResetAfter = since(end, now)
	}
	return fixedState(l, end, n), d
}

// slidingCounts returns the hits s counts in the window [start, end) and in the one before.
func slidingCounts(s State, l Limit, start, end int64) (cur, prev int64) {
	if s.Alg != SlidingWindow || s.Period != l.periodMicros() {
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
func slidingUsed(l Limit, cur, prev, start, now int64) int64 {
	p := int64(l.Period / time.Millisecond)
	e := (now - start) / 1000
	w := prev * (p - e)
	return cur + (w+p-1)/p
}

func slidingState(l Limit, end, cur, prev int64) State {
	return State{TAT: end, Frac: cur, Prev: prev, Rate: l.Rate, Period: l.periodMicros(), Alg: SlidingWindow}
}

// decideSliding is Decide under SlidingWindow.
func decideSliding(s State, l Limit, now, cost int64) (State, Decision) {
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

func refundSliding(s State, l Limit, now, cost int64) (State, Decision) {
	start, end := l.Bounds(now)
	cur, prev := slidingCounts(s, l, start, end)
	cur = max(cur-l.ClampCost(cost), 0)
	ns := slidingState(l, end, cur, prev)
	used := slidingUsed(l, cur, prev, start, now)
	return ns, Decision{Allowed: true, Remaining: max(l.Rate-used, 0), ResetAfter: since(ns.Expiry(), now)}
}

// liveLog returns the entries of s's log still within the last period at now, and their hits.
func liveLog(s State, l Limit, now int64) ([]int64, int64) {
	if s.Alg != SlidingLog || s.Period != l.periodMicros() {
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

func logState(l Limit, log []int64) State {
	return State{Rate: l.Rate, Period: l.periodMicros(), Alg: SlidingLog, Log: log}
}

// decideLog is Decide under SlidingLog.
func decideLog(s State, l Limit, now, cost int64) (State, Decision) {
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
			d.RetryAfter = since(log[i]+l.periodMicros(), now)
			break
		}
	}
	return s, d
}

// refundLog gives back cost hits, the most recent first.
func refundLog(s State, l Limit, now, cost int64) (State, Decision) {
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
		s.Alg == o.Alg && s.Prev == o.Prev && slices.Equal(s.Log, o.Log)
}
