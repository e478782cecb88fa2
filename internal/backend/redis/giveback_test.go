package redis

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// lease charges cost+k hits of key under l on b as a lease-carrying request does, and returns
// the give-back of k of them that the lease would queue if it used none.
func chargeLease(t *testing.T, b *Backend, key string, l limit.Limit, k int64) leftover {
	t.Helper()
	r := backend.Request{Key: key, Limit: l, Cost: 1 + k}
	out := make([]backend.Decision, 1)
	at := make([]int64, 1)
	ok, err := b.decideAt(context.Background(), []backend.Request{r}, out, at)
	if err != nil || !ok {
		t.Fatalf("charging a lease of %d: admitted %v, %v", k, ok, err)
	}
	if at[0] == 0 {
		t.Fatal("no instant from Redis for the lease's charge")
	}
	heldUntil, expires := b.leases.validity(&r, &out[0], at[0])
	return leftover{key: key, lim: l, hits: k, heldUntil: heldUntil, expires: expires}
}

// giveBackNow sends g back to Redis at once and returns what the leases' counters gained.
func giveBackNow(t *testing.T, b *Backend, g leftover) (returned, expired, dropped uint64) {
	t.Helper()
	r, e, d := b.core.giveBack([]leftover{g})
	return uint64(r), uint64(e), uint64(d)
}

// TestGiveBackUnderAnotherLimit: a lease charged under one replica's rule (100 an hour) and
// given back after another replica's larger rule (2,000 an hour) charged the key gives back
// only its own hits, in the terms the key holds: the other replica's charges stay. (Given back
// under the lease's limit, the key was re-expressed under it and capped at its burst of 100,
// erasing about 930 of the other replica's 1,000 charges.)
func TestGiveBackUnderAnotherLimit(t *testing.T) {
	for _, env := range []string{singleEnv, clusterEnv} {
		t.Run(env, func(t *testing.T) {
			b := newLeasedBackends(t, env, 1, time.Minute)[0]
			small := limit.Limit{Rate: 100, Period: time.Hour, Burst: 100}
			large := limit.Limit{Rate: 2000, Period: time.Hour, Burst: 2000}
			g := chargeLease(t, b, "rollout", small, 30)
			out := make([]backend.Decision, 1)
			if ok, err := b.core.Decide(context.Background(), []backend.Request{{Key: "rollout", Limit: large, Cost: 1000}}, out); err != nil || !ok {
				t.Fatalf("charging 1000 under the larger rule: %v, %v", ok, err)
			}
			returned, expired, dropped := giveBackNow(t, b, g)
			if returned != 30 || expired != 0 || dropped != 0 {
				t.Fatalf("gave back %d, expired %d, dropped %d of 30, want 30, 0, 0", returned, expired, dropped)
			}
			// Held: the lease request's own hit and the 1,000; an hour's rate restores about one
			// hit in the test's few seconds.
			if d := check(t, b, "rollout", large); d.Remaining < 997 || d.Remaining > 999 {
				t.Fatalf("remaining %d under the larger rule after the give-back, want 999 (2000 - 1 - 1000)", d.Remaining)
			}
		})
	}
}

// TestGiveBackLate: a give-back that reaches Redis after its lease expired gives nothing back
// and is counted: the key keeps its charges.
func TestGiveBackLate(t *testing.T) {
	b := newLeasedBackends(t, singleEnv, 1, 20*time.Millisecond)[0]
	l := limit.Limit{Rate: 1000, Period: time.Hour, Burst: 1000}
	g := chargeLease(t, b, "late", l, 40)
	time.Sleep(50 * time.Millisecond) // past the expiry: 1.5 lifetimes
	returned, expired, dropped := giveBackNow(t, b, g)
	if returned != 0 || expired != 40 || dropped != 0 {
		t.Fatalf("gave back %d, expired %d, dropped %d of 40, want 0, 40, 0", returned, expired, dropped)
	}
	if d := check(t, b, "late", l); d.Remaining > 1000-41 {
		t.Fatalf("remaining %d after a late give-back, want at most %d: the lease's hits stay charged", d.Remaining, 1000-41)
	}
}

// TestGiveBackOnlyWhatTimeHasNotRestored: a GCRA give-back returns only the lease's hits still
// ahead of Redis's now; those time restored already are not given twice.
func TestGiveBackOnlyWhatTimeHasNotRestored(t *testing.T) {
	b := newLeasedBackends(t, singleEnv, 1, time.Second)[0]
	l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
	g := chargeLease(t, b, "restored", l, 100) // 101 ms of the key's time from a fresh key
	time.Sleep(60 * time.Millisecond)
	returned, expired, _ := giveBackNow(t, b, g)
	// At least 60 ms passed: at most 41 of the 100 are still ahead of now.
	if returned > 41 || returned+expired != 100 {
		t.Fatalf("gave back %d (expired %d) of 100 after 60 ms at 1/ms, want at most 41 and the rest expired", returned, expired)
	}
}

// TestGiveBackFixedWindow: a fixed-window give-back returns its hits to the window its lease
// was charged in, and nothing to another.
func TestGiveBackFixedWindow(t *testing.T) {
	b := newLeasedBackends(t, singleEnv, 1, time.Minute)[0]
	l := limit.Limit{Rate: 1000, Period: 24 * time.Hour, Burst: 1000, Algorithm: limit.FixedWindow}
	g := chargeLease(t, b, "window", l, 50)
	other := g
	other.heldUntil += int64(time.Hour / time.Microsecond) // not this key's window
	if returned, _, _ := giveBackNow(t, b, other); returned != 0 {
		t.Fatalf("gave back %d to another window, want 0", returned)
	}
	if returned, _, _ := giveBackNow(t, b, g); returned != 50 {
		t.Fatalf("gave back %d of 50 within the lease's window", returned)
	}
	if d := check(t, b, "window", l); d.Remaining != 999 {
		t.Fatalf("remaining %d after the give-back, want 999", d.Remaining)
	}
}

// TestRefundUnderAnotherLimit: a client's refund (is_negative_hits) on a replica whose rule is
// smaller than the one the key's state was written under gives back its own hits in the key's
// terms, as backend.Refund does: the larger rule's charges stay. Across Cluster slots, a batch
// refused by another slot undoes the refund in the same terms.
func TestRefundUnderAnotherLimit(t *testing.T) {
	for _, env := range []string{singleEnv, clusterEnv} {
		t.Run(env, func(t *testing.T) {
			b := newLeasedBackends(t, env, 1, 0)[0]
			small := limit.Limit{Rate: 100, Period: time.Hour, Burst: 100}
			large := limit.Limit{Rate: 2000, Period: time.Hour, Burst: 2000}
			out := make([]backend.Decision, 2)
			if ok, err := b.core.Decide(context.Background(), []backend.Request{{Key: "refund", Limit: large, Cost: 1000}}, out); err != nil || !ok {
				t.Fatalf("charging 1000: %v, %v", ok, err)
			}
			if _, err := b.core.Decide(context.Background(), []backend.Request{{Key: "refund", Limit: small, Cost: 30, Refund: true}}, out); err != nil {
				t.Fatal(err)
			}
			if d := check(t, b, "refund", large); d.Remaining < 1028 || d.Remaining > 1030 {
				t.Fatalf("remaining %d under the larger rule after a refund of 30, want 1030", d.Remaining)
			}
			if !b.cluster {
				return
			}
			// A refund beside a request on another slot that is denied: the batch is refused and
			// the refund undone, in the key's own terms.
			reqs := []backend.Request{
				{Key: "refund", Limit: small, Cost: 30, Refund: true},
				{Key: otherSlotKey(t, b, "refund"), Limit: limit.Limit{Rate: 1, Period: time.Hour, Burst: 1}, Cost: 2},
			}
			if ok, err := b.core.Decide(context.Background(), reqs, out); err != nil || ok {
				t.Fatalf("a batch with a request past its burst: admitted %v, %v", ok, err)
			}
			if d := check(t, b, "refund", large); d.Remaining < 1028 || d.Remaining > 1030 {
				t.Fatalf("remaining %d after a refused batch's refund was undone, want 1030 still", d.Remaining)
			}
		})
	}
}

// otherSlotKey returns a key whose slot is not key's.
func otherSlotKey(t *testing.T, b *Backend, key string) string {
	t.Helper()
	for i := range 1000 {
		k := fmt.Sprintf("other-%d", i)
		if slot(storedKey(b.prefix, k)) != slot(storedKey(b.prefix, key)) {
			return k
		}
	}
	t.Fatal("no key on another slot")
	return ""
}
