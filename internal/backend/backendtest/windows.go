package backendtest

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// Clock is an instant a backend decides at, set by the cases of RunClocked. The zero value is
// the Unix epoch.
type Clock struct{ us atomic.Int64 }

// Set sets the instant.
func (c *Clock) Set(t time.Time) { c.us.Store(t.UnixMicro()) }

// Micros returns the instant in microseconds since the epoch.
func (c *Clock) Micros() int64 { return c.us.Load() }

// Now returns the instant.
func (c *Clock) Now() time.Time { return time.UnixMicro(c.us.Load()) }

// RunClocked runs the cases of the algorithms that need the instant set: calendar windows,
// the edge of a window, all or nothing across algorithms. newBackend returns a backend that
// decides at clock's instant.
func RunClocked(t *testing.T, newBackend func(t *testing.T, clock *Clock) backend.Backend) {
	prefix := fmt.Sprintf("clocked-%d-", time.Now().UnixNano())
	for _, tc := range clockedCases {
		t.Run(tc.name, func(t *testing.T) {
			clock := new(Clock)
			tc.run(t, newBackend(t, clock), clock, prefix+tc.name)
		})
	}
}

// PerMinute is requestsPerUnit per minute under alg (burst = rate).
func PerMinute(alg limit.Algorithm, rate int64) limit.Limit {
	return limit.Limit{Rate: rate, Period: time.Minute, Burst: rate, Algorithm: alg}
}

// AllAlgorithms lists the algorithms in order.
var AllAlgorithms = []limit.Algorithm{limit.GCRA, limit.FixedWindow, limit.SlidingWindow, limit.SlidingLog}

// Edge is the minute-edge burst that lets a fixed window pass twice its limit: 60 arrivals in the second before a minute's edge and
// 60 in the second after it, under 60 per minute. It returns how many alg admits, deciding
// each arrival with decide at its instant.
func Edge(decide func(at time.Time, r backend.Request) backend.Decision, key string, alg limit.Algorithm, edge time.Time) int {
	l := PerMinute(alg, 60)
	admitted := 0
	for i := range 120 {
		// 60 arrivals in [edge-1s, edge), 60 in [edge, edge+1s), evenly.
		at := edge.Add(-time.Second + time.Duration(i)*time.Second/60)
		if decide(at, backend.Request{Key: key, Limit: l, Cost: 1}).Allowed {
			admitted++
		}
	}
	return admitted
}

var clockedCases = []struct {
	name string
	run  func(t *testing.T, b backend.Backend, clock *Clock, key string)
}{
	{"edge of a minute", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		edge := time.Date(2026, 11, 11, 12, 1, 0, 0, time.UTC)
		for _, alg := range AllAlgorithms {
			got := Edge(func(at time.Time, r backend.Request) backend.Decision {
				clock.Set(at)
				return one(t, b, r)
			}, fmt.Sprintf("%s-%v", key, alg), alg, edge)
			want := 60
			switch alg {
			case limit.FixedWindow:
				want = 120 // the count starts again at the edge
			case limit.GCRA:
				want = 61 // the burst of 60, then one more emission interval (1s) elapsed
			}
			if got != want {
				t.Errorf("%v: admitted %d of 60+60 arrivals across a minute's edge, want %d", alg, got, want)
			}
		}
	}},
	{"calendar month renews at 00:00 on the 1st in its timezone", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		tokyo, err := time.LoadLocation("Asia/Tokyo")
		if err != nil {
			t.Fatal(err)
		}
		l := limit.Limit{Rate: 3, Period: 30 * 24 * time.Hour, Burst: 3, Algorithm: limit.FixedWindow,
			Window: limit.Window{Calendar: limit.Month, Every: 1, Location: tokyo}}
		// February 2026 in Tokyo: 28 days; 00:00 on March 1st in Tokyo is 15:00 UTC on Feb 28th.
		renew := time.Date(2026, 3, 1, 0, 0, 0, 0, tokyo)
		steps := []struct {
			at        time.Time
			allowed   bool
			remaining int64
			retry     time.Duration
		}{
			{time.Date(2026, 2, 1, 0, 0, 0, 0, tokyo), true, 2, 0},
			{time.Date(2026, 2, 14, 0, 0, 0, 0, tokyo), true, 1, 0},
			{renew.Add(-time.Hour), true, 0, 0},
			{renew.Add(-time.Second), false, 0, time.Second},
			{renew.Add(-time.Microsecond), false, 0, time.Microsecond},
			{renew, true, 2, 0},
			{renew.Add(time.Hour), true, 1, 0},
		}
		for i, s := range steps {
			clock.Set(s.at)
			d := one(t, b, backend.Request{Key: key, Limit: l, Cost: 1})
			if d.Allowed != s.allowed || d.Remaining != s.remaining || d.RetryAfter != s.retry {
				t.Fatalf("step %d at %v: got %+v, want allowed %v, remaining %d, retry after %v", i, s.at, d, s.allowed, s.remaining, s.retry)
			}
			if end := time.Date(2026, time.Month(s.at.Month()+1), 1, 0, 0, 0, 0, tokyo); d.ResetAfter != end.Sub(s.at) {
				t.Fatalf("step %d at %v: reset after %v, want %v (the end of the month in Tokyo)", i, s.at, d.ResetAfter, end.Sub(s.at))
			}
		}
	}},
	{"all or nothing across algorithms", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		clock.Set(time.Date(2026, 11, 11, 12, 0, 30, 0, time.UTC))
		reqs := make([]backend.Request, len(AllAlgorithms))
		for i, alg := range AllAlgorithms {
			reqs[i] = backend.Request{Key: fmt.Sprintf("%s-%v", key, alg), Limit: PerMinute(alg, 3), Cost: 1}
		}
		for i := range reqs {
			// Use up reqs[i]'s key alone, then the batch must be refused whole, charging
			// nothing; every other key still has its 3 requests.
			r := reqs[i]
			r.Key += "-full"
			batchReqs := append([]backend.Request(nil), reqs...)
			batchReqs[i] = r
			for range 3 {
				one(t, b, r)
			}
			for range 2 {
				out, admitted := batch(t, b, batchReqs)
				if admitted || out[i].Allowed {
					t.Fatalf("%v exhausted: batch admitted=%v, its decision %+v", r.Limit.Algorithm, admitted, out[i])
				}
				for j := range out {
					if j != i && (!out[j].Allowed || out[j].Remaining != 3) {
						t.Fatalf("%v exhausted: %v reports %+v, want allowed with 3 remaining (nothing charged)", r.Limit.Algorithm, reqs[j].Limit.Algorithm, out[j])
					}
				}
			}
		}
		for n := int64(2); n >= 0; n-- {
			out, admitted := batch(t, b, reqs)
			if !admitted {
				t.Fatalf("batch with %d remaining everywhere: refused: %+v", n, out)
			}
			for j := range out {
				if !out[j].Allowed || out[j].Remaining != n {
					t.Fatalf("%v: got %+v, want allowed with %d remaining", reqs[j].Limit.Algorithm, out[j], n)
				}
			}
		}
		if out, admitted := batch(t, b, reqs); admitted || out[0].Allowed {
			t.Fatalf("fourth batch: admitted %v: %+v", admitted, out)
		}
	}},
	{"fixed window answers as envoyproxy/ratelimit within a window", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		start := time.Date(2026, 11, 11, 12, 7, 0, 0, time.UTC)
		l := PerMinute(limit.FixedWindow, 5)
		// envoyproxy/ratelimit's fixed window (base_limiter.go): after = count + hits;
		// OVER_LIMIT when after > limit, remaining limit - after when OK, else 0; the reset is
		// the unit's end, counted from the epoch. It counts every hit, denied or not.
		count := int64(0)
		for i := range 12 {
			at := start.Add(time.Duration(i) * 4 * time.Second)
			if i >= 10 {
				at = start.Add(time.Minute + time.Duration(i-10)*4*time.Second) // the next window
			}
			if i == 10 {
				count = 0
			}
			clock.Set(at)
			d := one(t, b, backend.Request{Key: key, Limit: l, Cost: 1})
			count++
			ok, remaining := count <= 5, max(5-count, 0)
			reset := start.Add(time.Minute).Sub(at)
			if i >= 10 {
				reset = start.Add(2 * time.Minute).Sub(at)
			}
			if d.Allowed != ok || d.Remaining != remaining || d.ResetAfter != reset {
				t.Fatalf("request %d at %v: got %+v, envoyproxy/ratelimit answers ok=%v remaining %d reset %v", i, at, d, ok, remaining, reset)
			}
		}
	}},
}
