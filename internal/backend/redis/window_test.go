package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
	"github.com/rls-project/rls/internal/limit"
)

// TestClocked runs the cases of the window algorithms at instants the test sets (the script
// decides at the instant given instead of Redis TIME), on a single node, across Cluster slots,
// and with the local over-limit cache, whose denials must hold until their instant under every
// algorithm.
func TestClocked(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		opts Options
	}{
		{"single", singleEnv, Options{}},
		{"cluster", clusterEnv, Options{}},
		{"single with local cache", singleEnv, Options{LocalCacheSize: 100}},
		{"cluster coalesced", clusterEnv, Options{Coalesce: 16}},
		{"single coalesced", singleEnv, Options{Coalesce: 16}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			backendtest.RunClocked(t, func(t *testing.T, clock *backendtest.Clock) backend.Backend {
				opts := tc.opts
				opts.Now = clock.Now
				b := newTestBackend(t, tc.env, opts)
				b.scriptNow = clock.Micros
				return b
			})
		})
	}
}

// TestCalendarWindowClockSkew: rls computes calendar windows on its own clock and the script
// decides at Redis's; across a month's boundary, with Redis's clock half a second behind rls's,
// a request is counted in the month Redis's clock is in, and with it half a second ahead, too.
func TestCalendarWindowClockSkew(t *testing.T) {
	tokyo, err := time.LoadLocation("Asia/Tokyo")
	if err != nil {
		t.Fatal(err)
	}
	renew := time.Date(2026, 3, 1, 0, 0, 0, 0, tokyo)
	l := limit.Limit{Rate: 1, Period: 30 * 24 * time.Hour, Burst: 1, Algorithm: limit.FixedWindow,
		Window: limit.Window{Calendar: limit.Month, Every: 1, Location: tokyo}}
	for _, tc := range []struct {
		name string
		skew time.Duration // Redis's clock less rls's
	}{{"redis behind", -500 * time.Millisecond}, {"redis ahead", 500 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			var rlsNow time.Time
			b := newTestBackend(t, singleEnv, Options{Now: func() time.Time { return rlsNow }})
			b.scriptNow = func() int64 { return rlsNow.Add(tc.skew).UnixMicro() }
			key := fmt.Sprintf("skew-%d", time.Now().UnixNano())
			steps := []struct {
				redisAt time.Time
				allowed bool
				retry   time.Duration
				reset   time.Duration
			}{
				{renew.Add(-300 * time.Millisecond), true, 0, 300 * time.Millisecond},
				{renew.Add(-100 * time.Millisecond), false, 100 * time.Millisecond, 100 * time.Millisecond},
				{renew.Add(100 * time.Millisecond), true, 0, time.Date(2026, 4, 1, 0, 0, 0, 0, tokyo).Sub(renew.Add(100 * time.Millisecond))},
			}
			for i, s := range steps {
				rlsNow = s.redisAt.Add(-tc.skew)
				out := make([]backend.Decision, 1)
				if _, err := b.Decide(context.Background(), []backend.Request{{Key: key, Limit: l, Cost: 1}}, out); err != nil {
					t.Fatal(err)
				}
				if d := out[0]; d.Allowed != s.allowed || d.RetryAfter != s.retry || d.ResetAfter != s.reset {
					t.Fatalf("step %d, Redis at %v, rls at %v: got %+v, want allowed %v, retry %v, reset %v", i, s.redisAt, rlsNow, d, s.allowed, s.retry, s.reset)
				}
			}
		})
	}
}
