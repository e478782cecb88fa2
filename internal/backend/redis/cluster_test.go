package redis

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// TestClusterCrossSlotConcurrent: batches on two keys on different Cluster nodes, the second
// with half the first's burst, from 8 clients at once. Exactly the second key's burst is admitted,
// and the first key keeps exactly what the refused batches took from it.
func TestClusterCrossSlotConcurrent(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{{"direct", Options{}}, {"coalesced", Options{Coalesce: 16}}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, clusterEnv, tc.opts)
			ctx := context.Background()
			ka, kb := keysOnTwoMasters(t, b, "xs-")
			la := limit.Limit{Rate: 100, Period: time.Hour, Burst: 100}
			lb := limit.Limit{Rate: 50, Period: time.Hour, Burst: 50}
			var admitted, denied atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 40 {
						out := make([]backend.Decision, 2)
						ok, err := b.Decide(ctx, []backend.Request{{Key: ka, Limit: la, Cost: 1}, {Key: kb, Limit: lb, Cost: 1}}, out)
						if err != nil {
							t.Error(err)
							return
						}
						if ok {
							admitted.Add(1)
						} else {
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if admitted.Load() != 50 {
				t.Fatalf("admitted %d batches (denied %d), want exactly 50", admitted.Load(), denied.Load())
			}
			out := make([]backend.Decision, 2)
			if _, err := b.Decide(ctx, []backend.Request{{Key: ka, Limit: la}, {Key: kb, Limit: lb}}, out); err != nil {
				t.Fatal(err)
			}
			if out[0].Remaining != 50 || out[1].Remaining != 0 {
				t.Fatalf("after the run: remaining %d on the first key and %d on the second, want 50 and 0", out[0].Remaining, out[1].Remaining)
			}
		})
	}
}

// TestClusterUndoRestoresLog: a batch across two Cluster masters refunds a sliding_log key more
// hits than its newest entry holds, and the other master refuses the batch. The undo gives each
// hit back at the instant it was admitted, so the key frees its hits exactly as before the batch.
func TestClusterUndoRestoresLog(t *testing.T) {
	b := newTestBackend(t, clusterEnv, Options{})
	ctx := context.Background()
	ka, kb := keysOnTwoMasters(t, b, "undo-log-")
	log := limit.Limit{Rate: 5, Period: time.Minute, Burst: 5, Algorithm: limit.SlidingLog}
	spent := limit.Limit{Rate: 1, Period: time.Hour, Burst: 1}
	t0 := time.Now().UnixMicro()
	now := t0
	b.scriptNow = func() int64 { return now }
	decide := func(reqs ...backend.Request) bool {
		t.Helper()
		ok, err := b.Decide(ctx, reqs, make([]backend.Decision, len(reqs)))
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	// Two hits at t0, two a second later; the other key spent for the hour.
	if !decide(backend.Request{Key: ka, Limit: log, Cost: 2}, backend.Request{Key: kb, Limit: spent, Cost: 1}) {
		t.Fatal("the first batch was refused")
	}
	now += 1e6
	if !decide(backend.Request{Key: ka, Limit: log, Cost: 2}) {
		t.Fatal("the second batch was refused")
	}
	want := backend.State{Alg: limit.SlidingLog, Rate: 5, Period: 60e6, Log: []int64{t0, 2, t0 + 1e6, 2}}
	for _, batch := range [][]backend.Request{
		{{Key: ka, Limit: log, Cost: 3, Refund: true}, {Key: kb, Limit: spent, Cost: 1}},
		// A refund of every hit, then a charge at now, in the same refused batch.
		{{Key: ka, Limit: log, Cost: 5, Refund: true}, {Key: ka, Limit: log, Cost: 1}, {Key: kb, Limit: spent, Cost: 1}},
	} {
		now += 1e6
		if decide(batch...) {
			t.Fatalf("batch %+v admitted: the other key is spent", batch)
		}
		if got, ok := readState(t, b.rdb, storedKey(b.prefix, ka)); !ok || !got.Equal(want) {
			t.Fatalf("after the refused batch %+v the key holds %+v (%v), want %+v", batch, got, ok, want)
		}
	}
	// Once t0's hits leave the minute, the two of t0 + 1s still count.
	now = t0 + 60e6 + 1
	out := make([]backend.Decision, 1)
	if _, err := b.Decide(ctx, []backend.Request{{Key: ka, Limit: log}}, out); err != nil {
		t.Fatal(err)
	}
	if out[0].Remaining != 3 || out[0].ResetAfter != time.Second-time.Microsecond {
		t.Fatalf("after t0's hits left: %+v, want 3 remaining and a reset in 999.999ms", out[0])
	}
}
