// Package backendtest is the conformance suite every backend.Backend passes: the same cases,
// run against the memory backend and against Redis (single node and Cluster).
//
// The cases use limits whose emission interval is minutes long, so the few milliseconds a test
// takes against a real store's clock cannot change a whole request's worth of state.
package backendtest

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// Run runs the suite. newBackend returns a backend with no state for the keys the suite uses;
// each case uses keys unique to the run, so backends may be shared between cases.
func Run(t *testing.T, newBackend func(t *testing.T) backend.Backend) {
	prefix := fmt.Sprintf("conformance-%d-", time.Now().UnixNano())
	n := 0
	key := func(name string) string {
		n++
		return fmt.Sprintf("%s%s-%d", prefix, name, n)
	}
	perHour := func(rate, burst int64) limit.Limit {
		return limit.Limit{Rate: rate, Period: time.Hour, Burst: burst}
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newBackend(t), key, perHour)
		})
	}
}

type keyFunc func(name string) string
type limitFunc func(rate, burst int64) limit.Limit

var cases = []struct {
	name string
	run  func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc)
}{
	{"burst then deny", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k, l := key("burst"), perHour(10, 5)
		for i := range 5 {
			d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 1})
			if !d.Allowed || d.Remaining != int64(4-i) {
				t.Fatalf("request %d: got %+v, want allowed with remaining %d", i+1, d, 4-i)
			}
		}
		d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 1})
		if d.Allowed || d.Remaining != 0 {
			t.Fatalf("request 6: got %+v, want denied with remaining 0", d)
		}
		// One emission interval is 6 minutes; the first slot frees at most that far ahead.
		if d.RetryAfter <= 5*time.Minute || d.RetryAfter > 6*time.Minute {
			t.Fatalf("request 6: retry after %v, want within (5m, 6m]", d.RetryAfter)
		}
		if d.ResetAfter <= 29*time.Minute || d.ResetAfter > 30*time.Minute {
			t.Fatalf("request 6: reset after %v, want within (29m, 30m]", d.ResetAfter)
		}
	}},
	{"denial charges nothing", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k, l := key("nocharge"), perHour(10, 2)
		for range 2 {
			one(t, b, backend.Request{Key: k, Limit: l, Cost: 1})
		}
		for i := range 5 {
			if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 1}); d.Allowed {
				t.Fatalf("denied request %d: got %+v", i, d)
			}
		}
		d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 0})
		if !d.Allowed || d.Remaining != 0 || d.ResetAfter > 12*time.Minute || d.ResetAfter <= 11*time.Minute {
			t.Fatalf("check after denials: got %+v, want allowed, remaining 0, reset within (11m, 12m]", d)
		}
	}},
	{"cost", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k, l := key("cost"), perHour(10, 5)
		steps := []struct {
			cost      int64
			allowed   bool
			remaining int64
		}{{3, true, 2}, {3, false, 2}, {2, true, 0}, {1, false, 0}}
		for i, s := range steps {
			d := one(t, b, backend.Request{Key: k, Limit: l, Cost: s.cost})
			if d.Allowed != s.allowed || d.Remaining != s.remaining {
				t.Fatalf("step %d (cost %d): got %+v, want allowed=%v remaining=%d", i, s.cost, d, s.allowed, s.remaining)
			}
		}
	}},
	{"cost above burst touches nothing", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		// A full burst of 5 at 10 per hour spans 30 minutes. A cost that can never pass is told to
		// retry after the reset plus one full burst span: never "retry now".
		k, l := key("huge"), perHour(10, 5)
		if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 6}); d.Allowed || d.Remaining != 5 || d.RetryAfter != 30*time.Minute || d.ResetAfter != 0 {
			t.Fatalf("cost 6 on burst 5, fresh key: got %+v, want denied with remaining 5, retry after 30m, reset 0", d)
		}
		if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 2}); !d.Allowed || d.Remaining != 3 {
			t.Fatalf("cost 2 after: got %+v, want allowed with remaining 3", d)
		}
		d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 6})
		if d.Allowed || d.Remaining != 3 || d.ResetAfter <= 11*time.Minute || d.ResetAfter > 12*time.Minute || d.RetryAfter != d.ResetAfter+30*time.Minute {
			t.Fatalf("cost 6 with 2 used: got %+v, want denied with remaining 3, reset within (11m, 12m], retry after the reset + 30m", d)
		}
		if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 3}); !d.Allowed || d.Remaining != 0 {
			t.Fatalf("cost 3 after: got %+v, want allowed with remaining 0", d)
		}
	}},
	{"refund", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k, l := key("refund"), perHour(10, 5)
		one(t, b, backend.Request{Key: k, Limit: l, Cost: 5})
		if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 2, Refund: true}); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("refund 2: got %+v, want allowed with remaining 2", d)
		}
		if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 100, Refund: true}); !d.Allowed || d.Remaining != 5 {
			t.Fatalf("refund 100: got %+v, want remaining clamped to the burst, 5", d)
		}
		if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 6}); d.Allowed {
			t.Fatalf("cost 6 after refunds: got %+v, want denied: refunds never exceed the burst", d)
		}
	}},
	{"all or nothing", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		ka, kb, l := key("aon-a"), key("aon-b"), perHour(10, 3)
		one(t, b, backend.Request{Key: kb, Limit: l, Cost: 3})
		reqs := []backend.Request{{Key: ka, Limit: l, Cost: 1}, {Key: kb, Limit: l, Cost: 1}}
		out, admitted := batch(t, b, reqs)
		if admitted || !out[0].Allowed || out[0].Remaining != 3 || out[1].Allowed {
			t.Fatalf("got admitted=%v %+v, want denied batch; a allowed with remaining 3 (uncharged), b denied", admitted, out)
		}
		if d := one(t, b, backend.Request{Key: ka, Limit: l, Cost: 0}); d.Remaining != 3 {
			t.Fatalf("a after denied batch: remaining %d, want 3", d.Remaining)
		}
	}},
	{"admitted batch charges every key", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		ka, kb, l := key("both-a"), key("both-b"), perHour(10, 3)
		out, admitted := batch(t, b, []backend.Request{{Key: ka, Limit: l, Cost: 1}, {Key: kb, Limit: l, Cost: 2}})
		if !admitted || out[0].Remaining != 2 || out[1].Remaining != 1 {
			t.Fatalf("got admitted=%v %+v, want admitted with remaining 2 and 1", admitted, out)
		}
	}},
	{"shadow denial does not deny", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		ka, ks, l := key("sh-a"), key("sh-s"), perHour(10, 2)
		one(t, b, backend.Request{Key: ks, Limit: l, Cost: 2})
		out, admitted := batch(t, b, []backend.Request{{Key: ka, Limit: l, Cost: 1}, {Key: ks, Limit: l, Cost: 1, Mode: backend.Shadow}})
		if !admitted || !out[0].Allowed || out[0].Remaining != 1 || out[1].Allowed {
			t.Fatalf("got admitted=%v %+v, want admitted, a charged (remaining 1), shadow key denied", admitted, out)
		}
	}},
	{"quota denies only when every quota is over", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		q1, q2, l := key("q1"), key("q2"), perHour(10, 1)
		one(t, b, backend.Request{Key: q1, Limit: l, Cost: 1})
		out, admitted := batch(t, b, []backend.Request{{Key: q1, Limit: l, Cost: 1, Mode: backend.Quota}, {Key: q2, Limit: l, Cost: 1, Mode: backend.Quota}})
		if !admitted || out[0].Allowed || !out[1].Allowed {
			t.Fatalf("one quota over: got admitted=%v %+v, want admitted with q1 denied, q2 allowed", admitted, out)
		}
		out, admitted = batch(t, b, []backend.Request{{Key: q1, Limit: l, Cost: 1, Mode: backend.Quota}, {Key: q2, Limit: l, Cost: 1, Mode: backend.Quota}})
		if admitted || out[0].Allowed || out[1].Allowed {
			t.Fatalf("both quotas over: got admitted=%v %+v, want denied", admitted, out)
		}
	}},
	{"a key twice in one batch", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k, l := key("twice"), perHour(10, 3)
		out, admitted := batch(t, b, []backend.Request{{Key: k, Limit: l, Cost: 2}, {Key: k, Limit: l, Cost: 1}})
		if !admitted || out[0].Remaining != 1 || out[1].Remaining != 0 {
			t.Fatalf("2+1 of 3: got admitted=%v %+v, want admitted with remaining 1 then 0", admitted, out)
		}
		k2 := key("twice-over")
		out, admitted = batch(t, b, []backend.Request{{Key: k2, Limit: l, Cost: 2}, {Key: k2, Limit: l, Cost: 2}})
		if admitted || out[1].Allowed {
			t.Fatalf("2+2 of 3: got admitted=%v %+v, want denied", admitted, out)
		}
		if d := one(t, b, backend.Request{Key: k2, Limit: l, Cost: 0}); d.Remaining != 3 {
			t.Fatalf("after denied 2+2: remaining %d, want 3", d.Remaining)
		}
	}},
	{"a refused batch applies no refund and keeps refunds allowed", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		kr, kz, kd, l := key("rf-r"), key("rf-z"), key("rf-d"), perHour(10, 5)
		one(t, b, backend.Request{Key: kr, Limit: l, Cost: 3})
		out, admitted := batch(t, b, []backend.Request{
			{Key: kr, Limit: l, Cost: 2, Refund: true},
			{Key: kz, Limit: limit.Limit{Rate: 0, Period: time.Minute}, Cost: 1, Refund: true},
			{Key: kd, Limit: perHour(10, 1), Cost: 2},
		})
		if admitted || !out[0].Allowed || out[0].Remaining != 2 || !out[1].Allowed || out[2].Allowed {
			t.Fatalf("got admitted=%v %+v, want refused; both refunds allowed, the first reporting the unchanged remaining 2", admitted, out)
		}
		if d := one(t, b, backend.Request{Key: kr, Limit: l, Cost: 0}); d.Remaining != 2 {
			t.Fatalf("after the refused refund: remaining %d, want 2", d.Remaining)
		}
	}},
	{"a key repeated in a refused batch reports the stored state", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k, kd, l := key("rep-k"), key("rep-d"), perHour(10, 5)
		one(t, b, backend.Request{Key: kd, Limit: l, Cost: 5})
		out, admitted := batch(t, b, []backend.Request{
			{Key: k, Limit: l, Cost: 2},
			{Key: k, Limit: l, Cost: 2},
			{Key: kd, Limit: l, Cost: 1},
			{Key: k, Limit: l, Cost: 2, Mode: backend.Shadow},
		})
		// The shadow request saw the 4 charged before it in the batch: denied with remaining 1.
		if admitted || !out[0].Allowed || out[0].Remaining != 5 || !out[1].Allowed || out[1].Remaining != 5 || out[2].Allowed || out[3].Allowed || out[3].Remaining != 1 {
			t.Fatalf("got admitted=%v %+v, want refused; the allowed requests on k report remaining 5, the shadow one denied with remaining 1", admitted, out)
		}
	}},
	{"rate zero denies", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		d := one(t, b, backend.Request{Key: key("zero"), Limit: limit.Limit{Rate: 0, Period: time.Minute}, Cost: 1})
		if d.Allowed || d.Remaining != 0 {
			t.Fatalf("got %+v, want denied", d)
		}
	}},
	{"raised limit applies at once", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k := key("raise")
		for range 10 {
			one(t, b, backend.Request{Key: k, Limit: perHour(10, 10), Cost: 1})
		}
		d := one(t, b, backend.Request{Key: k, Limit: perHour(100, 100), Cost: 1})
		if !d.Allowed || d.Remaining != 89 {
			t.Fatalf("after raising 10/h to 100/h with 10 used: got %+v, want allowed with remaining 89", d)
		}
	}},
	{"lowered limit applies at once", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k := key("lower")
		for range 5 {
			one(t, b, backend.Request{Key: k, Limit: perHour(100, 100), Cost: 1})
		}
		if d := one(t, b, backend.Request{Key: k, Limit: perHour(5, 5), Cost: 1}); d.Allowed {
			t.Fatalf("after lowering 100/h to 5/h with 5 used: got %+v, want denied", d)
		}
	}},
	{"keys are independent", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		ka, kb, l := key("ind-a"), key("ind-b"), perHour(10, 1)
		one(t, b, backend.Request{Key: ka, Limit: l, Cost: 1})
		if d := one(t, b, backend.Request{Key: kb, Limit: l, Cost: 1}); !d.Allowed {
			t.Fatalf("b after a: got %+v, want allowed", d)
		}
	}},
	{"concurrent clients admit exactly the burst", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k, l := key("race"), perHour(100, 100)
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 50 {
					out := make([]backend.Decision, 1)
					ok, err := b.Decide(context.Background(), []backend.Request{{Key: k, Limit: l, Cost: 1}}, out)
					if err != nil {
						t.Error(err)
						return
					}
					if ok {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		if got := admitted.Load(); got != 100 {
			t.Fatalf("8 clients × 50 requests on burst 100: admitted %d, want exactly 100", got)
		}
	}}, {"overdraft", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		// 10 an hour (one per 6 minutes), burst 10: 8, then 50 over the burst, into a debt of 48.
		k, l := key("overdraft"), perHour(10, 10)
		l.Overdraft = true
		if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 8}); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("report 8: got %+v, want allowed with 2 remaining", d)
		}
		if d := one(t, b, backend.Request{Key: k, Limit: l, Cost: 50}); d.Allowed {
			t.Fatalf("report 50: got %+v, want denied (and charged)", d)
		}
		d := one(t, b, backend.Request{Key: k, Limit: l})
		// The debt: 58 - 10 = 48 requests, 48 × 6 minutes = 288 minutes.
		if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 287*time.Minute || d.RetryAfter > 288*time.Minute {
			t.Fatalf("check in debt: got %+v, want denied, 0 remaining, retry within (287m, 288m]", d)
		}
		plain := key("plain")
		if d := one(t, b, backend.Request{Key: plain, Limit: perHour(10, 10), Cost: 5}); !d.Allowed || d.Remaining != 5 {
			t.Fatalf("another key: got %+v, want untouched", d)
		}
		// An ordinary limit that denies refuses the batch: the overdraft charge is not made.
		out, admitted := batch(t, b, []backend.Request{{Key: k, Limit: l, Cost: 3}, {Key: plain, Limit: perHour(10, 10), Cost: 6}})
		if admitted || out[1].Allowed {
			t.Fatalf("batch with an ordinary denial: admitted %v, %+v", admitted, out)
		}
		if d := one(t, b, backend.Request{Key: k, Limit: l}); d.RetryAfter <= 287*time.Minute || d.RetryAfter > 288*time.Minute {
			t.Fatalf("after a refused batch: got %+v, want the debt unchanged", d)
		}
		// Without overdraft, the same report is denied and not charged.
		k2 := key("nooverdraft")
		one(t, b, backend.Request{Key: k2, Limit: perHour(10, 10), Cost: 8})
		one(t, b, backend.Request{Key: k2, Limit: perHour(10, 10), Cost: 50})
		if d := one(t, b, backend.Request{Key: k2, Limit: perHour(10, 10)}); !d.Allowed || d.Remaining != 2 {
			t.Fatalf("check without overdraft: got %+v, want allowed with 2 remaining", d)
		}
	}},
	{"overdraft reports from concurrent clients add up exactly", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		k, l := key("overdraft-concurrent"), perHour(10, 10)
		l.Overdraft = true
		var wg sync.WaitGroup
		var sum atomic.Int64
		for c := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 25 {
					cost := int64(1 + (c*25+i)%7)
					out := make([]backend.Decision, 1)
					if _, err := b.Decide(context.Background(), []backend.Request{{Key: k, Limit: l, Cost: cost}}, out); err != nil {
						t.Errorf("Decide: %v", err)
						return
					}
					sum.Add(cost)
				}
			}()
		}
		wg.Wait()
		d := one(t, b, backend.Request{Key: k, Limit: l})
		// Everything charged: ResetAfter is the whole sum × 6 minutes, less the test's duration.
		total := time.Duration(sum.Load()) * 6 * time.Minute
		if d.ResetAfter > total || d.ResetAfter < total-time.Minute {
			t.Fatalf("after reports summing to %d: reset after %v, want %v", sum.Load(), d.ResetAfter, total)
		}
	}},
	{"reset", func(t *testing.T, b backend.Backend, key keyFunc, perHour limitFunc) {
		r, ok := b.(backend.Resetter)
		if !ok {
			t.Skip("not a backend.Resetter")
		}
		k, l := key("reset"), perHour(10, 10)
		l.Overdraft = true
		other := key("reset-other")
		one(t, b, backend.Request{Key: k, Limit: l, Cost: 500})
		one(t, b, backend.Request{Key: other, Limit: l, Cost: 3})
		if d := one(t, b, backend.Request{Key: k, Limit: l}); d.Allowed {
			t.Fatalf("check in debt: got %+v", d)
		}
		if err := r.Reset(context.Background(), []string{k, key("never-seen")}); err != nil {
			t.Fatal(err)
		}
		if d := one(t, b, backend.Request{Key: k, Limit: l}); !d.Allowed || d.Remaining != 10 || d.ResetAfter != 0 {
			t.Fatalf("check after reset: got %+v, want a full burst", d)
		}
		if d := one(t, b, backend.Request{Key: other, Limit: l}); d.Remaining != 7 {
			t.Fatalf("the other key after reset: got %+v, want untouched (7 remaining)", d)
		}
	}},
}

func batch(t *testing.T, b backend.Backend, reqs []backend.Request) ([]backend.Decision, bool) {
	t.Helper()
	out := make([]backend.Decision, len(reqs))
	admitted, err := b.Decide(context.Background(), reqs, out)
	if err != nil {
		t.Fatalf("Decide: %v", err)
	}
	return out, admitted
}

func one(t *testing.T, b backend.Backend, r backend.Request) backend.Decision {
	t.Helper()
	out, admitted := batch(t, b, []backend.Request{r})
	if admitted != out[0].Allowed {
		t.Fatalf("single request: admitted=%v but decision %+v", admitted, out[0])
	}
	return out[0]
}
