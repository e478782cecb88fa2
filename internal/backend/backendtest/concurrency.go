package backendtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// Slots is a Concurrency limit of n slots living lifetime.
func Slots(n int64, lifetime time.Duration) limit.Limit {
	return limit.Limit{Rate: n, Burst: n, Period: lifetime, Algorithm: limit.Concurrency}
}

// RunSlots runs the cases of limits on requests in flight (limit.Concurrency, backend.DecideSlot)
// at instants the test sets: acquire, renew, release, expiry, and all or nothing with rates.
func RunSlots(t *testing.T, newBackend func(t *testing.T, clock *Clock) backend.Backend) {
	prefix := fmt.Sprintf("slots-%d-", time.Now().UnixNano())
	for _, tc := range slotCases {
		t.Run(tc.name, func(t *testing.T) {
			clock := new(Clock)
			clock.Set(time.Date(2026, 11, 11, 12, 0, 0, 0, time.UTC))
			tc.run(t, newBackend(t, clock), clock, prefix+tc.name)
		})
	}
}

func acquire(key, id string, l limit.Limit) backend.Request {
	return backend.Request{Key: key, Limit: l, Cost: 1, Slot: id}
}

func release(key, id string, l limit.Limit) backend.Request {
	return backend.Request{Key: key, Limit: l, Cost: 1, Slot: id, Refund: true}
}

// held checks the slots free on key: a check's Remaining.
func free(t *testing.T, b backend.Backend, key string, l limit.Limit, want int64) {
	t.Helper()
	if d := one(t, b, backend.Request{Key: key, Limit: l}); d.Remaining != want {
		t.Fatalf("check of %s: %+v, want %d free", key, d, want)
	}
}

var slotCases = []struct {
	name string
	run  func(t *testing.T, b backend.Backend, clock *Clock, key string)
}{
	{"at most N, a renewal counts once", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		l := Slots(3, time.Minute)
		for i := range 3 {
			if d := one(t, b, acquire(key, fmt.Sprint("r", i), l)); !d.Allowed || d.Remaining != int64(2-i) || d.ResetAfter != time.Minute {
				t.Fatalf("acquire %d: %+v", i, d)
			}
		}
		clock.Set(clock.Now().Add(10 * time.Second))
		d := one(t, b, acquire(key, "r3", l))
		if d.Allowed || d.Remaining != 0 || d.RetryAfter != 50*time.Second || d.ResetAfter != 50*time.Second {
			t.Fatalf("fourth acquire: %+v, want denied, retry when the first frees itself (50s)", d)
		}
		if d := one(t, b, acquire(key, "r0", l)); !d.Allowed || d.Remaining != 0 || d.ResetAfter != time.Minute {
			t.Fatalf("renewal of r0: %+v, want allowed, holding one slot", d)
		}
		if d := one(t, b, acquire(key, "", Slots(5, time.Minute))); d.Allowed {
			t.Fatalf("acquire without a slot id: %+v, want denied", d)
		}
		free(t, b, key, l, 0)
	}},
	{"release is idempotent and names its slot", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		l := Slots(2, time.Minute)
		one(t, b, acquire(key, "a", l))
		one(t, b, acquire(key, "b", l))
		for _, r := range []backend.Request{release(key, "zz", l), release(key+"-other", "a", l), release(key, "", l)} {
			if d := one(t, b, r); !d.Allowed {
				t.Fatalf("release %+v: %+v, want allowed", r, d)
			}
		}
		free(t, b, key, l, 0)
		if d := one(t, b, release(key, "a", l)); !d.Allowed || d.Remaining != 1 {
			t.Fatalf("release a: %+v, want one free", d)
		}
		one(t, b, release(key, "a", l))
		free(t, b, key, l, 1)
		if d := one(t, b, acquire(key, "c", l)); !d.Allowed {
			t.Fatalf("acquire c after a's release: %+v", d)
		}
		if d := one(t, b, acquire(key, "d", l)); d.Allowed {
			t.Fatalf("acquire d with b and c held: %+v", d)
		}
	}},
	{"a slot frees itself after its lifetime", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		l := Slots(2, 2*time.Second)
		one(t, b, acquire(key, "a", l))
		clock.Set(clock.Now().Add(time.Second))
		one(t, b, acquire(key, "b", l))
		clock.Set(clock.Now().Add(time.Second)) // a expires now
		free(t, b, key, l, 1)
		if d := one(t, b, acquire(key, "c", l)); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("acquire once a expired: %+v", d)
		}
		// a's late release frees nothing.
		one(t, b, release(key, "a", l))
		free(t, b, key, l, 0)
		clock.Set(clock.Now().Add(2 * time.Second))
		free(t, b, key, l, 2)
		if s, ok := b.(backend.SlotStats); ok && s.SlotsExpired() != 3 {
			t.Fatalf("%d slots counted expired, want 3 (a, b and c)", s.SlotsExpired())
		}
	}},
	{"a rate's denial holds no slot", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		l, rate := Slots(2, time.Minute), PerMinute(limit.GCRA, 1)
		reqs := []backend.Request{{Key: key + "-rate", Limit: rate, Cost: 1}, acquire(key, "a", l)}
		out, admitted := batch(t, b, reqs)
		if !admitted || !out[0].Allowed || !out[1].Allowed || out[1].Remaining != 1 {
			t.Fatalf("first: admitted %v, %+v", admitted, out)
		}
		reqs[1].Slot = "b"
		out, admitted = batch(t, b, reqs)
		if admitted || out[0].Allowed || !out[1].Allowed || out[1].Remaining != 1 {
			t.Fatalf("second: admitted %v, %+v, want the rate denied and b reported as a check", admitted, out)
		}
		free(t, b, key, l, 1)
		// A release refused with its batch is not applied either.
		out, admitted = batch(t, b, []backend.Request{reqs[0], release(key, "a", l)})
		if admitted || !out[1].Allowed {
			t.Fatalf("release with a denied rate: admitted %v, %+v", admitted, out)
		}
		free(t, b, key, l, 1)
	}},
	{"a slot's denial charges no rate", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		l, rate := Slots(1, time.Minute), PerMinute(limit.GCRA, 5)
		one(t, b, acquire(key, "a", l))
		reqs := []backend.Request{{Key: key + "-rate", Limit: rate, Cost: 2}, acquire(key, "b", l), {Key: key + "-rate2", Limit: PerMinute(limit.SlidingLog, 5), Cost: 1}}
		out, admitted := batch(t, b, reqs)
		if admitted || !out[0].Allowed || out[0].Remaining != 5 || out[1].Allowed || !out[2].Allowed || out[2].Remaining != 5 {
			t.Fatalf("admitted %v, %+v, want the slot denied and the rates reported as checks", admitted, out)
		}
		if d := one(t, b, backend.Request{Key: key + "-rate", Limit: rate}); d.Remaining != 5 {
			t.Fatalf("rate after the refused batch: %+v, want nothing charged", d)
		}
		// A shadow slot's denial refuses nothing and holds nothing.
		reqs[1].Mode = backend.Shadow
		out, admitted = batch(t, b, reqs)
		if !admitted || out[0].Remaining != 3 || out[1].Allowed {
			t.Fatalf("shadow: admitted %v, %+v", admitted, out)
		}
		free(t, b, key, l, 0)
	}},
	{"a lower max_in_flight admits once below it", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		l := Slots(3, time.Minute)
		for _, id := range []string{"a", "b", "c"} {
			one(t, b, acquire(key, id, l))
		}
		l = Slots(2, time.Minute) // the rule edited while three are held
		free(t, b, key, l, 0)
		if d := one(t, b, acquire(key, "d", l)); d.Allowed || d.Remaining != 0 {
			t.Fatalf("acquire with 3 held of 2: %+v", d)
		}
		if d := one(t, b, release(key, "a", l)); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("release with 3 held of 2: %+v", d)
		}
		if d := one(t, b, acquire(key, "d", l)); d.Allowed {
			t.Fatalf("acquire with 2 held of 2: %+v", d)
		}
		if d := one(t, b, acquire(key, "b", l)); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("renewal of b, held: %+v", d)
		}
		one(t, b, release(key, "b", l))
		if d := one(t, b, acquire(key, "d", l)); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("acquire with 1 held of 2: %+v", d)
		}
	}},
	{"random ids hold at most N", func(t *testing.T, b backend.Backend, clock *Clock, key string) {
		l := Slots(4, time.Minute)
		allowed := 0
		for i := range 40 {
			if one(t, b, acquire(key, fmt.Sprintf("hostile-%d", i), l)).Allowed {
				allowed++
			}
		}
		if allowed != 4 {
			t.Fatalf("%d of 40 random ids admitted, want 4", allowed)
		}
		// One batch acquiring two slots of the key with one free: the second is refused, and
		// so the first is not held either.
		one(t, b, release(key, "hostile-0", l))
		out, admitted := batch(t, b, []backend.Request{acquire(key, "x", l), acquire(key, "y", l)})
		if admitted || !out[0].Allowed || out[1].Allowed {
			t.Fatalf("two acquires, one free: admitted %v, %+v", admitted, out)
		}
		free(t, b, key, l, 1)
		if r, ok := b.(backend.Resetter); ok {
			if err := r.Reset(context.Background(), []string{key}); err != nil {
				t.Fatal(err)
			}
			free(t, b, key, l, 4) // a reset frees every slot
		}
	}},
}
