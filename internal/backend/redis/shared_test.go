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
