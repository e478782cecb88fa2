package redis

import (
	"context"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// TestSharedKeepsDebt: under a Shared limit (a region's share of a global one), a state written
// under another share keeps every request it holds, beyond the new burst too, in the script as
// in Go; an ordinary limit caps it at the new burst.
func TestSharedKeepsDebt(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{})
	now := time.Now().UnixMicro()
	b.scriptNow = func() int64 { return now }
	ctx := context.Background()
	held := backend.State{TAT: now + 10_000_000, Rate: 10, Period: 1_000_000} // 100 requests at 10/s
	for _, shared := range []bool{false, true} {
		l := limit.Limit{Rate: 20, Period: time.Second, Burst: 5, Shared: shared}
		key := "shared-debt"
		if err := b.rdb.Set(ctx, storedKey(b.prefix, key), encodeState(held), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		_, want := backend.Decide(held, l, now, 1)
		out := make([]backend.Decision, 1)
		if _, err := b.Decide(ctx, []backend.Request{{Key: key, Limit: l, Cost: 1}}, out); err != nil {
			t.Fatal(err)
		}
		if out[0] != want {
			t.Fatalf("shared %v: script %+v, Go %+v", shared, out[0], want)
		}
		if wantRetry := map[bool]time.Duration{false: 50 * time.Millisecond, true: 4800 * time.Millisecond}[shared]; want.RetryAfter != wantRetry {
			t.Fatalf("shared %v: retry after %v, want %v", shared, want.RetryAfter, wantRetry)
		}
	}
}

// fixedShares gives every Shared limit a share of share, good until until, and counts what is
// reported late.
type fixedShares struct {
	share limit.Limit
	until time.Time
	late  int
}

func (f *fixedShares) Limit(_ context.Context, _ string, l limit.Limit, _ int64) (limit.Limit, time.Time, error) {
	l.Rate, l.Burst = f.share.Rate, f.share.Burst
	return l, f.until, nil
}

func (f *fixedShares) Late(n int) { f.late += n }

// TestSharesLateAnswerDenied: a decision on a global key whose answer comes after the instant its
// share was good until (this process paused between reading the share and Redis's answer) does
// not admit, since Redis may have decided it after the share moved to another region; its
// regional requests keep their answers, it is counted late, and what it charged stays charged.
// One answered in time admits as Redis said.
func TestSharesLateAnswerDenied(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{})
	ctx := context.Background()
	global := limit.Limit{Rate: 100, Period: time.Second, Burst: 100, Shared: true}
	regional := limit.Limit{Rate: 100, Period: time.Second, Burst: 100}
	for _, tc := range []struct {
		name  string
		until time.Duration // from now
		want  bool
	}{
		{"in time", time.Minute, true},
		{"late", -time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &fixedShares{share: limit.Limit{Rate: 10, Burst: 10}, until: time.Now().Add(tc.until)}
			b.SetShares(s)
			g, r := "late-global-"+tc.name, "late-regional-"+tc.name
			reqs := []backend.Request{{Key: g, Limit: global, Cost: 1}, {Key: r, Limit: regional, Cost: 1}}
			out := make([]backend.Decision, 2)
			admitted, err := b.Decide(ctx, reqs, out)
			if err != nil {
				t.Fatal(err)
			}
			if admitted != tc.want || out[0].Allowed != tc.want || !out[1].Allowed {
				t.Fatalf("admitted %v, decisions %+v; want admitted %v, the global one %v, the regional one allowed", admitted, out, tc.want, tc.want)
			}
			if wantLate := map[bool]int{true: 0, false: 1}[tc.want]; s.late != wantLate {
				t.Fatalf("counted late %d, want %d", s.late, wantLate)
			}
			// Charged either way: the share's key holds one request of its burst of 10.
			s.until = time.Now().Add(time.Minute)
			check := make([]backend.Decision, 1)
			if _, err := b.Decide(ctx, []backend.Request{{Key: g, Limit: global, Cost: 1, Mode: backend.Shadow}}, check); err != nil {
				t.Fatal(err)
			}
			if check[0].Remaining != 8 {
				t.Fatalf("after one charge, a shadow check leaves %d of the share's burst of 10, want 8", check[0].Remaining)
			}
		})
	}
}
