package limit

import (
	"errors"
	"testing"
	"time"
)

func TestBounds(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		t.Fatal(err)
	}
	day := 24 * time.Hour
	fixed := func(p time.Duration, w Window) Limit {
		return Limit{Rate: 1, Burst: 1, Period: p, Algorithm: FixedWindow, Window: w}
	}
	tests := []struct {
		name       string
		l          Limit
		at         time.Time
		start, end time.Time
	}{
		{"minute", fixed(time.Minute, Window{}), time.Date(2026, 3, 4, 10, 7, 59, 999999000, time.UTC),
			time.Date(2026, 3, 4, 10, 7, 0, 0, time.UTC), time.Date(2026, 3, 4, 10, 8, 0, 0, time.UTC)},
		{"minute at its start", fixed(time.Minute, Window{}), time.Date(2026, 3, 4, 10, 8, 0, 0, time.UTC),
			time.Date(2026, 3, 4, 10, 8, 0, 0, time.UTC), time.Date(2026, 3, 4, 10, 9, 0, 0, time.UTC)},
		{"UTC week from Monday", fixed(7*day, Window{Offset: 4 * 86400e6}), time.Date(2026, 3, 8, 23, 0, 0, 0, time.UTC), // a Sunday
			time.Date(2026, 3, 2, 0, 0, 0, 0, time.UTC), time.Date(2026, 3, 9, 0, 0, 0, 0, time.UTC)},
		{"before the epoch", fixed(time.Hour, Window{}), time.Date(1969, 12, 31, 23, 30, 0, 0, time.UTC),
			time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC), time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)},
		{"Paris day of the spring change: 23 hours", fixed(day, Window{Calendar: Day, Every: 1, Location: paris}),
			time.Date(2026, 3, 29, 12, 0, 0, 0, paris), time.Date(2026, 3, 29, 0, 0, 0, 0, paris), time.Date(2026, 3, 30, 0, 0, 0, 0, paris)},
		{"New York week from Monday", fixed(7*day, Window{Calendar: Week, Every: 1, Location: ny}),
			time.Date(2026, 3, 2, 0, 30, 0, 0, time.UTC), // Sunday evening in New York
			time.Date(2026, 2, 23, 0, 0, 0, 0, ny), time.Date(2026, 3, 2, 0, 0, 0, 0, ny)},
		{"February", fixed(30*day, Window{Calendar: Month, Every: 1, Location: time.UTC}),
			time.Date(2028, 2, 29, 23, 59, 59, 0, time.UTC), time.Date(2028, 2, 1, 0, 0, 0, 0, time.UTC), time.Date(2028, 3, 1, 0, 0, 0, 0, time.UTC)},
		{"quarter", fixed(90*day, Window{Calendar: Month, Every: 3, Location: time.UTC}),
			time.Date(2026, 6, 30, 0, 0, 0, 0, time.UTC), time.Date(2026, 4, 1, 0, 0, 0, 0, time.UTC), time.Date(2026, 7, 1, 0, 0, 0, 0, time.UTC)},
		{"year in Paris", fixed(365*day, Window{Calendar: Year, Every: 1, Location: paris}),
			time.Date(2026, 12, 31, 23, 30, 0, 0, time.UTC), // already 2027 in Paris
			time.Date(2027, 1, 1, 0, 0, 0, 0, paris), time.Date(2028, 1, 1, 0, 0, 0, 0, paris)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.l.Validate(); err != nil {
				t.Fatal(err)
			}
			s, e := tc.l.Bounds(tc.at.UnixMicro())
			if s != tc.start.UnixMicro() || e != tc.end.UnixMicro() {
				t.Fatalf("Bounds(%v) = [%v, %v), want [%v, %v)", tc.at, time.UnixMicro(s).UTC(), time.UnixMicro(e).UTC(), tc.start.UTC(), tc.end.UTC())
			}
		})
	}
}

func TestValidateAlgorithms(t *testing.T) {
	tests := []struct {
		name string
		l    Limit
		ok   bool
	}{
		{"fixed window", perMinute(FixedWindow, 10), true},
		{"fixed window with overdraft", Limit{Rate: 10, Burst: 10, Period: time.Minute, Algorithm: FixedWindow, Overdraft: true}, true},
		{"burst other than rate", Limit{Rate: 10, Burst: 5, Period: time.Minute, Algorithm: FixedWindow}, false},
		{"sliding window with overdraft", Limit{Rate: 10, Burst: 10, Period: time.Minute, Algorithm: SlidingWindow, Overdraft: true}, false},
		{"sliding log with overdraft", Limit{Rate: 10, Burst: 10, Period: time.Minute, Algorithm: SlidingLog, Overdraft: true}, false},
		{"sliding log at its bound", perMinute(SlidingLog, MaxLogRate), true},
		{"sliding log above its bound", perMinute(SlidingLog, MaxLogRate+1), false},
		{"sliding window period in microseconds", Limit{Rate: 10, Burst: 10, Period: time.Second + time.Microsecond, Algorithm: SlidingWindow}, false},
		{"sliding window rate × period too large", Limit{Rate: 1 << 32, Burst: 1 << 32, Period: 365 * 24 * time.Hour, Algorithm: SlidingWindow}, false},
		{"calendar on a sliding window", Limit{Rate: 10, Burst: 10, Period: time.Hour, Algorithm: SlidingWindow,
			Window: Window{Calendar: Month, Every: 1, Location: time.UTC}}, false},
		{"calendar on GCRA", Limit{Rate: 10, Burst: 10, Period: time.Hour, Window: Window{Calendar: Month, Every: 1}}, false},
		{"calendar of 0 months", Limit{Rate: 10, Burst: 10, Period: time.Hour, Algorithm: FixedWindow, Window: Window{Calendar: Month}}, false},
		{"unknown algorithm", Limit{Rate: 10, Burst: 10, Period: time.Hour, Algorithm: 9}, false},
	}
	for _, tc := range tests {
		err := tc.l.Validate()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrInvalid)) {
			t.Errorf("%s: Validate() = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		l    Limit
		ok   bool
	}{
		{"ordinary", Limit{Rate: 60, Period: time.Minute, Burst: 10}, true},
		{"deny all", Limit{Rate: 0, Period: time.Minute}, true},
		{"zero burst", Limit{Rate: 1, Period: time.Minute}, false},
		{"sub-microsecond period", Limit{Rate: 1, Period: time.Nanosecond, Burst: 1}, false},
		{"negative rate", Limit{Rate: -1, Period: time.Second, Burst: 1}, false},
		{"tolerance too long", Limit{Rate: 1, Period: 365 * 24 * time.Hour, Burst: 1000}, false},
		{"huge but bounded", Limit{Rate: 1 << 32, Period: time.Second, Burst: 1 << 32}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.l.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func perMinute(alg Algorithm, rate int64) Limit {
	return Limit{Rate: rate, Period: time.Minute, Burst: rate, Algorithm: alg}
}

// TestValidateNamesTheField: each refusal names the field at fault, which the rule files'
// loader turns into the line and the words of what its user wrote.
func TestValidateNamesTheField(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Limit
		want Field
	}{
		{"zero period", Limit{Rate: 1, Burst: 1}, PeriodField},
		{"period too long", Limit{Rate: 1, Burst: 1, Period: MaxTolerance + time.Second}, PeriodField},
		{"zero burst", Limit{Rate: 1, Period: time.Minute}, BurstField},
		{"burst on a window", Limit{Rate: 10, Burst: 5, Period: time.Minute, Algorithm: FixedWindow}, BurstField},
		{"overdraft on a sliding log", Limit{Rate: 10, Burst: 10, Period: time.Minute, Algorithm: SlidingLog, Overdraft: true}, OverdraftField},
		{"calendar on GCRA", Limit{Rate: 10, Burst: 10, Period: time.Hour, Window: Window{Calendar: Month, Every: 1}}, WindowField},
		{"calendar of minutes", Limit{Rate: 10, Burst: 10, Period: time.Minute, Algorithm: FixedWindow, Window: Window{Calendar: Minute, Every: 1}}, WindowField},
		{"sliding log above its bound", perMinute(SlidingLog, MaxLogRate+1), RateField},
		{"tolerance too long", Limit{Rate: 1, Period: 365 * 24 * time.Hour, Burst: 1000}, NoField},
		{"global on a window", Limit{Rate: 10, Burst: 10, Period: time.Minute, Algorithm: FixedWindow, Shared: true}, SharedField},
	} {
		var e *Error
		if err := tc.l.Validate(); !errors.As(err, &e) || e.Field != tc.want || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: Validate() = %v, want an *Error of field %q", tc.name, err, tc.want)
		}
	}
}
