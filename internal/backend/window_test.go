package backend_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
	"github.com/rls-project/rls/internal/limit"
)

// step is one request of a step table at t0 + at.
type step struct {
	at        time.Duration
	cost      int64
	refund    bool
	allowed   bool
	remaining int64
	retry     time.Duration
	reset     time.Duration
}

func runSteps(t *testing.T, l limit.Limit, t0 time.Time, steps []step) {
	t.Helper()
	var s backend.State
	for i, st := range steps {
		now := t0.Add(st.at).UnixMicro()
		var d backend.Decision
		if st.refund {
			s, d = backend.Refund(s, l, now, st.cost)
		} else {
			s, d = backend.Decide(s, l, now, st.cost)
		}
		want := backend.Decision{Allowed: st.allowed, Remaining: st.remaining, RetryAfter: st.retry, ResetAfter: st.reset}
		if d != want {
			t.Fatalf("step %d (at +%v, cost %d, refund %v): got %+v, want %+v", i, st.at, st.cost, st.refund, d, want)
		}
	}
}

// t0 is the start of a minute.
var t0 = time.Date(2026, 11, 11, 12, 0, 0, 0, time.UTC)

func TestFixedWindowSteps(t *testing.T) {
	s := time.Second
	runSteps(t, backendtest.PerMinute(limit.FixedWindow, 3), t0, []step{
		{at: 0, cost: 0, allowed: true, remaining: 3},
		{at: 10 * s, cost: 2, allowed: true, remaining: 1, reset: 50 * s},
		{at: 20 * s, cost: 2, remaining: 1, retry: 40 * s, reset: 40 * s}, // does not fit: not charged
		{at: 20 * s, cost: 1, allowed: true, remaining: 0, reset: 40 * s},
		{at: 30 * s, cost: 1, remaining: 0, retry: 30 * s, reset: 30 * s},
		{at: 30 * s, cost: 0, allowed: true, remaining: 0, reset: 30 * s},
		{at: 31 * s, cost: 2, refund: true, allowed: true, remaining: 2, reset: 29 * s},
		{at: 40 * s, cost: 4, remaining: 2, retry: 20*s + time.Minute, reset: 20 * s}, // never fits
		{at: 60 * s, cost: 3, allowed: true, remaining: 0, reset: 60 * s},             // a new window
		{at: 180 * s, cost: 1, allowed: true, remaining: 2, reset: 60 * s},            // two windows later
	})
}

func TestFixedWindowOverdraft(t *testing.T) {
	s := time.Second
	l := backendtest.PerMinute(limit.FixedWindow, 3)
	l.Overdraft = true
	runSteps(t, l, t0, []step{
		{at: 0, cost: 5, remaining: 0, retry: 60 * s, reset: 60 * s}, // charged into the window: 5 of 3, spent until it ends
		{at: 10 * s, cost: 0, remaining: 0, retry: 50 * s, reset: 50 * s},
		{at: 20 * s, cost: 2, refund: true, allowed: true, remaining: 0, reset: 40 * s}, // 3 of 3
		{at: 30 * s, cost: 0, allowed: true, remaining: 0, reset: 30 * s},
		{at: 60 * s, cost: 1, allowed: true, remaining: 2, reset: 60 * s}, // the debt ends with its window
	})
}

func TestSlidingWindowSteps(t *testing.T) {
	s, ms := time.Second, time.Millisecond
	// Cloudflare's example: 50 per minute, 42 in the previous minute, 18 in this one at 15
	// seconds: the estimate is 42 × 45/60 + 18 = 49.5, and one more would be 50.5.
	runSteps(t, backendtest.PerMinute(limit.SlidingWindow, 50), t0, []step{
		{at: 30 * s, cost: 42, allowed: true, remaining: 8, reset: 90 * s},
		{at: 75 * s, cost: 18, allowed: true, remaining: 0, reset: 105 * s}, // ⌈31.5⌉ + 18 = 50
		{at: 75 * s, cost: 1, remaining: 0, retry: 715 * ms, reset: 105 * s},
		// At 15.715s, 42 × 44.285/60 = 30.9995: one more fits.
		{at: 75*s + 714*ms, cost: 1, remaining: 0, retry: ms, reset: 105*s - 714*ms},
		{at: 75*s + 715*ms, cost: 1, allowed: true, remaining: 0, reset: 105*s - 715*ms},
		{at: 80 * s, cost: 5, refund: true, allowed: true, remaining: 8, reset: 100 * s}, // 14 + 42 × 40/60
		{at: 80 * s, cost: 40, remaining: 8, retry: 57143 * ms, reset: 100 * s},
		{at: 200 * s, cost: 1, allowed: true, remaining: 49, reset: 100 * s}, // both windows gone
	})
}

func TestSlidingLogSteps(t *testing.T) {
	s := time.Second
	runSteps(t, backendtest.PerMinute(limit.SlidingLog, 3), t0, []step{
		{at: 0, cost: 1, allowed: true, remaining: 2, reset: 60 * s},
		{at: 10 * s, cost: 1, allowed: true, remaining: 1, reset: 60 * s},
		{at: 20 * s, cost: 2, remaining: 1, retry: 40 * s, reset: 50 * s},
		{at: 20 * s, cost: 1, allowed: true, remaining: 0, reset: 60 * s},
		{at: 60*s - time.Microsecond, cost: 1, remaining: 0, retry: time.Microsecond, reset: 20*s + time.Microsecond},
		{at: 60 * s, cost: 1, allowed: true, remaining: 0, reset: 60 * s},
		{at: 61 * s, cost: 1, refund: true, allowed: true, remaining: 1, reset: 19 * s},
		{at: 61 * s, cost: 4, remaining: 1, retry: 19*s + 60*s, reset: 19 * s},
		{at: 61 * s, cost: 0, allowed: true, remaining: 1, reset: 19 * s},
	})
}

// admitter decides arrivals one by one under a limit, from no state.
func admitter(l limit.Limit) func(at float64) bool {
	var s backend.State
	return func(at float64) bool {
		var d backend.Decision
		s, d = backend.Decide(s, l, int64(at*1e6), 1)
		return d.Allowed
	}
}

// maxInPeriod returns the most of the instants (seconds, ascending) that fall in any period.
func maxInPeriod(instants []float64, period float64) int {
	most, j := 0, 0
	for i := range instants {
		for instants[i]-instants[j] >= period {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
}

// TestArrivalPatterns compares the algorithms on the same arrivals (60 per 60 seconds; token bucket of
// capacity 10 and 60 at 1 per second as GCRA with burst 10 and 60): arrivals 60 + 60 across an
// edge, then 2 per second from 100 s to 220 s, with the most each admits in any 60 seconds.
func TestArrivalPatterns(t *testing.T) {
	edge := make([]float64, 0, 120)
	for i := range 120 {
		edge = append(edge, 59+float64(i)/60)
	}
	steady := make([]float64, 0, 240)
	for i := range 240 {
		steady = append(steady, 100+float64(i)/2)
	}
	gcra := func(burst int64) limit.Limit { return limit.Limit{Rate: 60, Period: time.Minute, Burst: burst} }
	tests := []struct {
		name             string
		l                limit.Limit
		edge, steady     int // admitted of each trace
		steadyMostPer60s int
	}{
		{"fixed window", backendtest.PerMinute(limit.FixedWindow, 60), 120, 120, 100},
		{"sliding log", backendtest.PerMinute(limit.SlidingLog, 60), 60, 120, 60},
		{"sliding window", backendtest.PerMinute(limit.SlidingWindow, 60), 60, 0, 86},
		{"token bucket 10 (gcra burst 10)", gcra(10), 11, 0, 69},
		{"token bucket 60 (gcra burst 60)", gcra(60), 61, 0, 119},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			run := func(trace []float64) []float64 {
				allow := admitter(tc.l)
				var got []float64
				for _, at := range trace {
					if allow(at) {
						got = append(got, at)
					}
				}
				return got
			}
			e, s := run(edge), run(steady)
			t.Logf("edge: %d admitted; steady: %d admitted, at most %d in 60 s", len(e), len(s), maxInPeriod(s, 60))
			if len(e) != tc.edge || maxInPeriod(s, 60) != tc.steadyMostPer60s {
				t.Errorf("edge: admitted %d, want %d; steady: at most %d in 60 s, want %d", len(e), tc.edge, maxInPeriod(s, 60), tc.steadyMostPer60s)
			}
		})
	}
}

// TestSlidingWindowAgainstLog runs sliding_window on long random traces and judges each of
// its decisions against the exact one (sliding_log's rule on the hits sliding_window itself
// admitted, as Cloudflare measured): the wrong decisions, the most it admits in any period,
// and what it admits in total next to sliding_log on the same trace. The traces are 24 hours
// of Poisson arrivals under 100 per minute whose mean changes every minute, uniform between a
// tenth of the limit and a top: traffic under its limit on average each minute (top 0.9×),
// around it (top 1.2×) and pushing against it all day (top 3×). The bounds are the measured values with some margin.
func TestSlidingWindowAgainstLog(t *testing.T) {
	tests := []struct {
		name                  string
		top                   float64
		maxWrong, maxMostOver float64 // fractions of the arrivals, of the limit
	}{
		{"under the limit", 0.9, 0.005, 0.10},
		{"around the limit", 1.2, 0.07, 0.25},
		{"against the limit", 3, 0.40, 0.40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			const rate, period = 100, 60.0
			rng := rand.New(rand.NewPCG(12, 12))
			var trace []float64
			mean := 0.0
			for at, minute := 0.0, -1; at < 86400; {
				if m := int(at / 60); m != minute {
					minute, mean = m, rate/period*(0.1+(tc.top-0.1)*rng.Float64())
				}
				at += rng.ExpFloat64() / mean
				trace = append(trace, float64(int64(at*1e6))/1e6)
			}
			sw, sl := admitter(backendtest.PerMinute(limit.SlidingWindow, rate)), admitter(backendtest.PerMinute(limit.SlidingLog, rate))
			var admitted []float64
			wrongAllow, wrongDeny, slAdmitted := 0, 0, 0
			j := 0
			for _, at := range trace {
				for j < len(admitted) && admitted[j] <= at-period {
					j++
				}
				exact := len(admitted)-j+1 <= rate
				got := sw(at)
				switch {
				case got && !exact:
					wrongAllow++
				case !got && exact:
					wrongDeny++
				}
				if got {
					admitted = append(admitted, at)
				}
				if sl(at) {
					slAdmitted++
				}
			}
			n := float64(len(trace))
			most := maxInPeriod(admitted, period)
			wrong := float64(wrongAllow+wrongDeny) / n
			t.Logf("%d arrivals: sliding_window admitted %d, sliding_log %d; wrongly admitted %d (%.4f%%), wrongly denied %d (%.4f%%); at most %d in any %v s (limit %d)",
				len(trace), len(admitted), slAdmitted, wrongAllow, 100*float64(wrongAllow)/n, wrongDeny, 100*float64(wrongDeny)/n, most, period, rate)
			if wrong > tc.maxWrong || float64(most) > rate*(1+tc.maxMostOver) {
				t.Errorf("wrong decisions %.4f%% (bound %.4f%%), at most %d in a period (bound %.0f)", 100*wrong, 100*tc.maxWrong, most, rate*(1+tc.maxMostOver))
			}
		})
	}
}
