package descriptors

import (
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

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
	alg, ok := limit.ParseAlgorithm(rl.Algorithm)
	if !ok {
		b.errorf(lineOf(ln, "algorithm"), "%s: algorithm %q: want one of %s", where, rl.Algorithm, strings.Join(limit.Algorithms, ", "))
		return Limit{}, false
	}
	var loc *time.Location
	if rl.Timezone != "" {
		var lerr error
		if loc, lerr = loadLocation(rl.Timezone); lerr != nil || rl.Timezone == "Local" {
			b.errorf(lineOf(ln, "timezone"), "%s: timezone %q: not a known IANA time zone name", where, rl.Timezone)
			return Limit{}, false
		}
	}
	lim := NewLimit(rl.Name, perUnit, unit, mult, burst)
	// NewLimit reads 0 as unset: hand Validate an explicit 0 as the file wrote it.
	if multSet && mult == 0 {
		lim.Spec.Period = 0
	}
	if burstSet && burst == 0 {
		lim.Burst, lim.Spec.Burst = 0, 0
	}
	lim.Spec.Overdraft = rl.Overdraft || (b.overdraft && alg.Overdraws())
	lim.Spec.Algorithm = alg
	if rl.Global != nil && *rl.Global && lim.Spec.Overdraft {
		b.errorf(lineOf(ln, "global"), "%s: global does not apply with overdraft: a charge past a region's share would take what the other regions hold", where)
		return Limit{}, false
	}
	if rl.Global != nil {
		lim.Spec.Shared = *rl.Global
	} else if slices.Contains(b.globalDomains, b.domain) {
		lim.Spec.Shared = alg == limit.GCRA && !lim.Spec.Overdraft
	}
	lim.Timezone = rl.Timezone
	// Validate decides. A timezone is handed to it as written (a calendar window of the unit in
	// that zone, whatever the algorithm), and only a valid one is then aligned as it is decided.
	if loc != nil {
		lim.Spec.Window = limit.Window{Calendar: unit, Every: int64(lim.UnitMultiplier), Location: loc}
	}
	if err := lim.Spec.Validate(); err != nil {
		if !multSet {
			mult = 1
		}
		b.invalid(ln, where, unit, mult, err)
		return Limit{}, false
	}
	if alg == limit.FixedWindow {
		lim.Spec.Window = windowOf(unit, lim.UnitMultiplier, loc)
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

// invalid records Validate's refusal of a limit at the line of the field the rule file wrote
// it with, in the file's words: unit_multiplier mult of unit for the period.
func (b *builder) invalid(ln *yaml.Node, where string, unit limit.Unit, mult uint32, err error) {
	var e *limit.Error
	if !errors.As(err, &e) || e.Field == limit.NoField {
		b.errorf(ln.Line, "%s: %v", where, err)
		return
	}
	key := map[limit.Field]string{
		limit.RateField: "requests_per_unit", limit.PeriodField: "unit_multiplier", limit.BurstField: "burst",
		limit.OverdraftField: "overdraft", limit.AlgorithmField: "algorithm", limit.WindowField: "timezone",
		limit.SharedField: "global",
	}[e.Field]
	switch {
	case e.Field == limit.PeriodField:
		b.errorf(lineOf(ln, key), "%s: unit_multiplier %d: a period of %d %ss %s", where, mult, mult, unit, e.Reason)
	case e.Value != "":
		b.errorf(lineOf(ln, key), "%s: %s %s %s", where, key, e.Value, e.Reason)
	default:
		b.errorf(lineOf(ln, key), "%s: %s %s", where, key, e.Reason)
	}
}
