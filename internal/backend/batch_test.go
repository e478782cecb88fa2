package backend

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// store is the simplest store of batch outcomes: what DecideBatch says to store, in a map.
type store map[string]State

func (st store) decide(reqs []Request, now int64) ([]Decision, []State, []State, bool) {
	states := make([]State, len(reqs))
	for i := range reqs {
		states[i] = st[reqs[i].Key]
	}
	out := make([]Decision, len(reqs))
	next := make([]State, len(reqs))
	admitted := DecideBatch(states, reqs, now, out, next)
	if admitted {
		for i := range reqs {
			if next[i].Fresh(now) {
				delete(st, reqs[i].Key)
			} else {
				st[reqs[i].Key] = next[i]
			}
		}
	}
	return out, states, next, admitted
}

// TestDecideBatchSteps walks a store through batches at fixed instants t0 and t1 = t0 + 1s.
func TestDecideBatchSteps(t *testing.T) {
	l := limit.Limit{Rate: 2, Period: time.Second, Burst: 3} // T = 500ms, full burst = 1.5s
	zero := limit.Limit{Rate: 0, Period: time.Minute}
	const ms = time.Millisecond
	t0 := int64(1_000_000_000_000)
	t1 := t0 + sec
	req := func(key string, cost int64) Request { return Request{Key: key, Limit: l, Cost: cost} }
	with := func(r Request, f func(*Request)) Request { f(&r); return r }
	shadow := func(r *Request) { r.Mode = Shadow }
	quota := func(r *Request) { r.Mode = Quota }
	refund := func(r *Request) { r.Refund = true }
	rateZero := func(r *Request) { r.Limit = zero }
	allow := func(rem int64, reset time.Duration) Decision {
		return Decision{Allowed: true, Remaining: rem, ResetAfter: reset}
	}
	deny := func(rem int64, retry, reset time.Duration) Decision {
		return Decision{Remaining: rem, RetryAfter: retry, ResetAfter: reset}
	}
	steps := []struct {
		name     string
		at       int64
		reqs     []Request
		admitted bool
		want     []Decision
	}{
		{"a twice: the second sees the first's charge", t0,
			[]Request{req("a", 1), req("a", 1)},
			true, []Decision{allow(2, 500*ms), allow(1, time.Second)}},
		{"a's third and fourth do not fit: all refused, allowed ones report a check", t0,
			[]Request{req("a", 1), req("b", 1), req("a", 2)},
			false, []Decision{allow(1, time.Second), allow(3, 0), deny(0, time.Second, 1500*ms)}},
		{"a refused batch stored nothing", t0,
			[]Request{req("a", 0), req("b", 0)},
			true, []Decision{allow(1, time.Second), allow(3, 0)}},
		{"a shadow denial admits the batch", t0,
			[]Request{with(req("a", 2), shadow), req("b", 1)},
			true, []Decision{deny(1, 500*ms, time.Second), allow(2, 500*ms)}},
		{"one quota of two denied: admitted", t0,
			[]Request{with(req("a", 2), quota), with(req("c", 1), quota)},
			true, []Decision{deny(1, 500*ms, time.Second), allow(2, 500*ms)}},
		{"every quota denied: refused", t0,
			[]Request{with(req("a", 2), quota), with(req("c", 3), quota), req("b", 1)},
			false, []Decision{deny(1, 500*ms, time.Second), deny(2, 500*ms, 500*ms), allow(2, 500*ms)}},
		{"a quota denied with no other quota: refused", t0,
			[]Request{with(req("a", 2), quota)},
			false, []Decision{deny(1, 500*ms, time.Second)}},
		{"cost above burst: retry after reset plus a full burst span", t0,
			[]Request{with(req("a", 1), refund), req("a", 5)},
			false, []Decision{allow(1, time.Second), deny(2, 2*time.Second, 500*ms)}},
		{"cost above burst on a fresh key in shadow: admitted, nothing charged", t0,
			[]Request{with(req("d", 4), shadow), req("d", 0)},
			true, []Decision{deny(3, 1500*ms, 0), allow(3, 0)}},
		{"rate 0 denies; a refund under rate 0 stays allowed in the refused batch", t0,
			[]Request{with(with(req("z", 1), rateZero), refund), with(req("z2", 0), rateZero), req("b", 1)},
			false, []Decision{{Allowed: true}, {RetryAfter: time.Minute}, allow(2, 500*ms)}},
		{"rate 0 in shadow admits", t0,
			[]Request{with(with(req("z", 1), rateZero), shadow), req("b", 1)},
			true, []Decision{{RetryAfter: time.Minute}, allow(1, time.Second)}},
		{"a refund in an admitted batch gives back, then a charge sees it", t0,
			[]Request{with(req("b", 1), refund), req("b", 2)},
			true, []Decision{allow(2, 500*ms), allow(0, 1500*ms)}},
		{"t1: refilled; a key and a refund of all of it: deleted", t1,
			[]Request{req("a", 1), with(req("a", 5), refund), req("b", 0)},
			true, []Decision{allow(2, 500*ms), allow(3, 0), allow(2, 500*ms)}},
		{"mixed modes, an enforce denial refuses; denied ones report what they saw", t1,
			[]Request{with(req("c", 1), quota), with(req("b", 3), shadow), req("b", 2), req("b", 1)},
			false, []Decision{allow(3, 0), deny(2, 500*ms, 500*ms), allow(2, 500*ms), deny(0, 500*ms, 1500*ms)}},
	}
	st := store{}
	for _, s := range steps {
		out, states, next, admitted := st.decide(s.reqs, s.at)
		if admitted != s.admitted {
			t.Fatalf("%s: admitted %v, want %v (decisions %+v)", s.name, admitted, s.admitted, out)
		}
		for i := range s.want {
			if out[i] != s.want[i] {
				t.Errorf("%s: request %d (%s cost %d): got %+v, want %+v", s.name, i, s.reqs[i].Key, s.reqs[i].Cost, out[i], s.want[i])
			}
			if !admitted && !next[i].Equal(states[i]) {
				t.Errorf("%s: refused, but next[%d] = %+v, want the stored state %+v", s.name, i, next[i], states[i])
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	if _, ok := st["a"]; ok {
		t.Errorf("a refunded to a full burst is still stored: %+v", st["a"])
	}
	if _, ok := st["d"]; ok {
		t.Errorf("d, never charged, is stored: %+v", st["d"])
	}
}

// TestDecideBatchProperties compares DecideBatch on random batches with the batch rules stated
// one request at a time: decide each request in order on the state the batch has left so far;
// admit when no enforced request is denied and not every quota request is; store the charges of
// an admitted batch; report a refused batch's allowed requests as a check of the stored state.
func TestDecideBatchProperties(t *testing.T) {
	limits := []limit.Limit{
		{Rate: 2, Period: time.Second, Burst: 3},
		{Rate: 7, Period: time.Second, Burst: 2},
		{Rate: 3, Period: 2 * time.Second, Burst: 5},
		{Rate: 0, Period: time.Second},
	}
	keys := []string{"a", "b", "c", "d", "e"}
	rng := rand.New(rand.NewPCG(8, 9))
	got, want := store{}, map[string]State{}
	now := int64(1_700_000_000) * sec
	counts := map[string]int{}
	for n := range 20_000 {
		now += rng.Int64N(400_000)
		reqs := make([]Request, 1+rng.IntN(8))
		for i := range reqs {
			reqs[i] = Request{
				Key:    keys[rng.IntN(len(keys))],
				Limit:  limits[rng.IntN(len(limits))],
				Cost:   rng.Int64N(7) - 1,
				Refund: rng.IntN(6) == 0,
				Mode:   Mode(rng.IntN(3)),
			}
		}
		name := fmt.Sprintf("batch %d at %d: %+v", n, now, reqs)

		// The rules, one request at a time, on a copy of the store.
		tentative := map[string]State{}
		for k, v := range want {
			tentative[k] = v
		}
		wantOut := make([]Decision, len(reqs))
		enforceDenied, quotas, quotasDenied := false, 0, 0
		for i, r := range reqs {
			s := tentative[r.Key]
			if r.Refund {
				s, wantOut[i] = Refund(s, r.Limit, now, r.Cost)
			} else {
				s, wantOut[i] = Decide(s, r.Limit, now, r.Cost)
			}
			tentative[r.Key] = s
			if r.Mode == Quota {
				quotas++
			}
			if !wantOut[i].Allowed {
				switch r.Mode {
				case Enforce:
					enforceDenied = true
				case Quota:
					quotasDenied++
				}
			}
		}
		wantAdmitted := !enforceDenied && (quotas == 0 || quotasDenied < quotas)
		if wantAdmitted {
			for _, r := range reqs {
				k, s := r.Key, tentative[r.Key]
				if s.Fresh(now) {
					delete(want, k)
				} else {
					want[k] = s
				}
			}
		} else {
			for i, r := range reqs {
				if wantOut[i].Allowed {
					if r.Refund || r.Limit.Rate == 0 {
						_, wantOut[i] = Refund(want[r.Key], r.Limit, now, 0)
					} else {
						_, wantOut[i] = Decide(want[r.Key], r.Limit, now, 0)
					}
				}
			}
		}

		out, states, next, admitted := got.decide(reqs, now)
		if admitted != wantAdmitted {
			t.Fatalf("%s: admitted %v, want %v", name, admitted, wantAdmitted)
		}
		for i, r := range reqs {
			if out[i] != wantOut[i] {
				t.Fatalf("%s: request %d: got %+v, want %+v", name, i, out[i], wantOut[i])
			}
			if r.Refund && !out[i].Allowed {
				t.Fatalf("%s: refund %d denied", name, i)
			}
			if !admitted && !next[i].Equal(states[i]) {
				t.Fatalf("%s: refused, next[%d] %+v is not the stored %+v", name, i, next[i], states[i])
			}
		}
		if len(got) != len(want) {
			t.Fatalf("%s: stored %v, want %v", name, got, want)
		}
		for k, s := range want {
			if !got[k].Equal(s) {
				t.Fatalf("%s: key %s stored %+v, want %+v", name, k, got[k], s)
			}
		}
		counts[fmt.Sprint("admitted=", admitted)]++
		for i, r := range reqs {
			for j := range i {
				if reqs[j].Key == r.Key {
					counts["repeated key"]++
					break
				}
			}
			if r.Cost > r.Limit.Burst && !r.Refund {
				counts["cost above burst"]++
			}
		}
	}
	t.Logf("outcomes: %v", counts)
	for _, k := range []string{"admitted=true", "admitted=false", "repeated key", "cost above burst"} {
		if counts[k] < 1000 {
			t.Errorf("only %d batches with %s: the generator no longer covers the rules", counts[k], k)
		}
	}
}

func TestDecideBatchAllocatesNothing(t *testing.T) {
	l := limit.Limit{Rate: 10, Period: time.Second, Burst: 5}
	reqs := []Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 9}, {Key: "a", Limit: l, Cost: 1, Mode: Quota}}
	states := make([]State, len(reqs))
	out := make([]Decision, len(reqs))
	next := make([]State, len(reqs))
	if n := testing.AllocsPerRun(100, func() { DecideBatch(states, reqs, 1e12, out, next) }); n != 0 {
		t.Fatalf("DecideBatch allocates %v times per call", n)
	}
}

func BenchmarkDecideBatch(b *testing.B) {
	l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 100}
	for _, n := range []int{1, 8, 64} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			reqs := make([]Request, n)
			for i := range reqs {
				reqs[i] = Request{Key: fmt.Sprintf("5:bench|6:api_key|%d", i), Limit: l, Cost: 1}
			}
			states := make([]State, n)
			out := make([]Decision, n)
			next := make([]State, n)
			now := int64(1_000) * sec
			b.ReportAllocs()
			for b.Loop() {
				now += 700
				DecideBatch(states, reqs, now, out, next)
				copy(states, next)
			}
		})
	}
}

// TestBatchOverdraft: overdraft charges never refuse a batch; an ordinary denial refuses the
// whole batch, overdraft charges included; the answer is still not admitted when an overdraft
// charge went over.
func TestBatchOverdraft(t *testing.T) {
	t0 := int64(1_000_000_000_000)
	od := limit.Limit{Rate: 10, Period: time.Minute, Burst: 10, Overdraft: true}
	plain := limit.Limit{Rate: 10, Period: time.Minute, Burst: 10}
	tests := []struct {
		name              string
		reqs              []Request
		charged, admitted bool
	}{
		{"overdraft over alone: charged, not admitted", []Request{{Key: "a", Limit: od, Cost: 50}}, true, false},
		{"overdraft over with an ordinary that admits: both charged", []Request{{Key: "a", Limit: od, Cost: 50}, {Key: "b", Limit: plain, Cost: 1}}, true, false},
		{"overdraft over with an ordinary that denies: nothing charged", []Request{{Key: "a", Limit: od, Cost: 50}, {Key: "b", Limit: plain, Cost: 11}}, false, false},
		{"overdraft within with an ordinary that denies: nothing charged", []Request{{Key: "a", Limit: od, Cost: 5}, {Key: "b", Limit: plain, Cost: 11}}, false, false},
		{"overdraft over in shadow mode: charged and admitted", []Request{{Key: "a", Limit: od, Cost: 50, Mode: Shadow}}, true, true},
		{"overdraft over in quota mode beside a quota that admits", []Request{{Key: "a", Limit: od, Cost: 50, Mode: Quota}, {Key: "b", Limit: plain, Cost: 1, Mode: Quota}}, true, true},
		{"a check of a fresh overdraft key", []Request{{Key: "a", Limit: od}}, true, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := len(tc.reqs)
			states, out, next := make([]State, n), make([]Decision, n), make([]State, n)
			charged := DecideBatch(states, tc.reqs, t0, out, next)
			if charged != tc.charged || Admitted(tc.reqs, out) != tc.admitted {
				t.Fatalf("charged %v admitted %v, want %v %v (%+v)", charged, Admitted(tc.reqs, out), tc.charged, tc.admitted, out)
			}
			for i := range next {
				if used := !next[i].Fresh(t0); used != (charged && tc.reqs[i].Cost > 0) {
					t.Fatalf("request %d: state %+v, charged %v", i, next[i], charged)
				}
			}
		})
	}
}
