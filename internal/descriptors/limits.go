package descriptors

import (
	"strings"
	"sync"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// locations holds the time zones loaded so far, by name: a zone loads once per process, and
// limits under one zone share its *time.Location (so equal limits compare equal across reloads).
var locations sync.Map // string → *time.Location

func loadLocation(name string) (*time.Location, error) {
	if l, ok := locations.Load(name); ok {
		return l.(*time.Location), nil
	}
	l, err := time.LoadLocation(name)
	if err != nil {
		return nil, err
	}
	actual, _ := locations.LoadOrStore(name, l)
	return actual.(*time.Location), nil
}

// windowOf aligns a fixed_window limit of mult units: to the epoch in UTC for units up to a
// day, weeks from Monday, calendar months and years, and days and weeks in loc when it is not UTC.
func windowOf(unit limit.Unit, mult uint32, loc *time.Location) limit.Window {
	utc := loc == nil || loc == time.UTC
	switch {
	case unit == limit.Week && utc:
		return limit.Window{Offset: 4 * 86400 * 1e6} // 1970-01-05 was a Monday
	case unit == limit.Day && !utc, unit == limit.Week, unit == limit.Month, unit == limit.Year:
		if loc == nil {
			loc = time.UTC
		}
		return limit.Window{Calendar: unit, Every: int64(mult), Location: loc}
	}
	return limit.Window{}
}

// limitOf validates one rate_limit that is not unlimited. It returns ok false for an error,
// already recorded.
func (b *builder) limitOf(rl rawLimit, where string) (Limit, bool) {
	ln := rl.node
	unit, unitOK := limit.ParseUnit(rl.Unit)
	perUnit, _, err := count(rl.perUnit)
	if err != nil {
		b.errorf(lineOf(ln, "requests_per_unit"), "%s: requests_per_unit %v", where, err)
	}
	mult, multSet, merr := count(rl.multi)
	if merr != nil {
		b.errorf(lineOf(ln, "unit_multiplier"), "%s: unit_multiplier %v", where, merr)
	}
	burst, burstSet, berr := count(rl.burst)
	if berr != nil {
		b.errorf(lineOf(ln, "burst"), "%s: burst %v", where, berr)
	}
	if err != nil || merr != nil || berr != nil {
		return Limit{}, false
	}
	if !unitOK {
		b.errorf(lineOf(ln, "unit"), "%s: unit %q: want second, minute, hour, day, week, month or year", where, rl.Unit)
		return Limit{}, false
	}
	if multSet && mult == 0 {
		b.errorf(lineOf(ln, "unit_multiplier"), "%s: unit_multiplier must be > 0", where)
		return Limit{}, false
	}
	if longest := int64(limit.MaxTolerance / time.Second); unit.Seconds()*int64(max(mult, 1)) > longest {
		b.errorf(lineOf(ln, "unit_multiplier"), "%s: unit_multiplier %d: a period of %d %ss is longer than the longest supported, %d days",
			where, mult, mult, unit, longest/86400)
		return Limit{}, false
	}
	if burstSet && burst == 0 && perUnit > 0 {
		b.errorf(lineOf(ln, "burst"), "%s: burst must be > 0 (requests_per_unit: 0 denies every request)", where)
		return Limit{}, false
	}
	alg, ok := limit.ParseAlgorithm(rl.Algorithm)
	if !ok {
		b.errorf(lineOf(ln, "algorithm"), "%s: algorithm %q: want one of %s", where, rl.Algorithm, strings.Join(limit.Algorithms, ", "))
		return Limit{}, false
	}
	if alg != limit.GCRA {
		if burstSet {
			b.errorf(lineOf(ln, "burst"), "%s: burst applies to algorithm gcra only: %v admits requests_per_unit per window", where, alg)
			return Limit{}, false
		}
		burst = perUnit
	}
	if rl.Overdraft && alg != limit.GCRA && alg != limit.FixedWindow {
		b.errorf(lineOf(ln, "overdraft"), "%s: overdraft applies to algorithms gcra and fixed_window, not %v: it charges hits that went over, which %v cannot hold",
			where, alg, alg)
		return Limit{}, false
	}
	var loc *time.Location
	if rl.Timezone != "" {
		switch {
		case alg != limit.FixedWindow:
			b.errorf(lineOf(ln, "timezone"), "%s: timezone applies to algorithm fixed_window only", where)
			return Limit{}, false
		case unit != limit.Day && unit != limit.Week && unit != limit.Month && unit != limit.Year:
			b.errorf(lineOf(ln, "timezone"), "%s: timezone applies to units day, week, month and year, not %s", where, unit)
			return Limit{}, false
		}
		var lerr error
		if loc, lerr = loadLocation(rl.Timezone); lerr != nil || rl.Timezone == "Local" {
			b.errorf(lineOf(ln, "timezone"), "%s: timezone %q: not a known IANA time zone name", where, rl.Timezone)
			return Limit{}, false
		}
	}
	lim := NewLimit(rl.Name, perUnit, unit, mult, burst)
	lim.Spec.Overdraft = rl.Overdraft || (b.overdraft && (alg == limit.GCRA || alg == limit.FixedWindow))
	lim.Spec.Algorithm = alg
	if alg == limit.FixedWindow {
		lim.Spec.Window = windowOf(unit, lim.UnitMultiplier, loc)
	}
	lim.Timezone = rl.Timezone
	if err := lim.Spec.Validate(); err != nil {
		b.errorf(ln.Line, "%s: %v", where, err)
		return Limit{}, false
	}
	for _, rep := range rl.Replaces {
		switch {
		case rep.Name == "":
			b.errorf(lineOf(ln, "replaces"), "%s: replaces has an entry without a name", where)
		case rep.Name == rl.Name:
			b.errorf(lineOf(ln, "replaces"), "%s: a limit cannot replace itself (%q)", where, rep.Name)
		default:
			lim.Replaces = append(lim.Replaces, rep.Name)
		}
	}
	return lim, true
}
