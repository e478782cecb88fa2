package limit

import "time"

// MaxWindowCharge bounds what an overdraft charge counts under FixedWindow, and MaxWindowCount
// the count it may reach: every count stays exact as a double.
const (
	MaxWindowCharge = 1 << 33
	MaxWindowCount  = 1 << 40
)

// NoCalendar is Window.Calendar's zero value: windows are Period long, from Window.Offset
// after the Unix epoch.
const NoCalendar = UnitUnknown

// Window aligns a FixedWindow limit's windows. The zero value is Period-long windows from the
// Unix epoch: a minute window starts at each minute's 00 second, in UTC.
type Window struct {
	// Calendar, when Day, Week, Month or Year, makes windows Every calendar days, weeks
	// (from Monday 00:00), months or years long in
	// Location, starting at local midnight: a month is a calendar month, whatever its length
	// in days or hours (daylight saving). Windows are counted from 1970-01-01 (weeks from
	// Monday 1970-01-05): with Every 3 and Month, January, April, July and October start one.
	Calendar Unit
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
		p := l.PeriodMicros()
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
