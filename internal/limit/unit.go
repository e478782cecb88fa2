package limit

import "strings"

// Unit is a rate-limit unit of time, numbered as envoy.config.ratelimit.v3's RateLimitUnit and
// envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
type Unit uint8

// The units. A Month is 30 days and a Year 365 as a length (Seconds), as in envoyproxy/ratelimit;
// as a Window.Calendar they are calendar months and years.
const (
	UnitUnknown Unit = iota
	Second
	Minute
	Hour
	Day
	Month
	Year
	Week
)

// units is the one table of the units: each one's name, as rule files spell it, and length.
var units = [...]struct {
	name    string
	seconds int64
}{
	UnitUnknown: {"unknown", 0},
	Second:      {"second", 1},
	Minute:      {"minute", 60},
	Hour:        {"hour", 3600},
	Day:         {"day", 86400},
	Month:       {"month", 30 * 86400},
	Year:        {"year", 365 * 86400},
	Week:        {"week", 7 * 86400},
}

// ParseUnit parses a unit's name, in any case; "unknown" is not a unit.
func ParseUnit(s string) (Unit, bool) {
	for u := Second; int(u) < len(units); u++ {
		if strings.EqualFold(s, units[u].name) {
			return u, true
		}
	}
	return UnitUnknown, false
}

func (u Unit) String() string {
	if int(u) < len(units) {
		return units[u].name
	}
	return "unknown"
}

// Seconds is the unit's length, 0 for UnitUnknown and any number that is not a unit.
func (u Unit) Seconds() int64 {
	if int(u) < len(units) {
		return units[u].seconds
	}
	return 0
}
