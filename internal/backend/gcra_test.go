package backend

import (
	"math/big"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

const sec = int64(time.Second / time.Microsecond)

// TestDecideSteps walks one key through a fixed sequence of instants t0..t8.
func TestDecideSteps(t *testing.T) {
	l := limit.Limit{Rate: 2, Period: time.Second, Burst: 3} // T = 500ms, full burst = 1.5s
	t0 := int64(1_000_000_000_000)
	steps := []struct {
		name      string
		at        int64
		cost      int64
		allowed   bool
		remaining int64
		retry     time.Duration
		reset     time.Duration
	}{
		{"t0 first", t0, 1, true, 2, 0, 500 * time.Millisecond},
		{"t1 same instant", t0, 1, true, 1, 0, time.Second},
		{"t2 burst used", t0, 1, true, 0, 0, 1500 * time.Millisecond},
		{"t3 denied", t0, 1, false, 0, 500 * time.Millisecond, 1500 * time.Millisecond},
		{"t4 one slot back", t0 + sec/2, 1, true, 0, 0, 1500 * time.Millisecond},
		{"t5 cost 2 too early", t0 + sec, 2, false, 1, 500 * time.Millisecond, time.Second},
		{"t6 check only", t0 + sec, 0, true, 1, 0, time.Second},
		{"t7 cost 2 fits", t0 + 3*sec/2, 2, true, 0, 0, 1500 * time.Millisecond},
		{"t8 idle to full", t0 + 10*sec, 1, true, 2, 0, 500 * time.Millisecond},
	}
	var s State
	for _, st := range steps {
		var d Decision
		s, d = Decide(s, l, st.at, st.cost)
		want := Decision{Allowed: st.allowed, Remaining: st.remaining, RetryAfter: st.retry, ResetAfter: st.reset}
		if d != want {
			t.Fatalf("%s: got %+v, want %+v", st.name, d, want)
		}
	}
}

func TestDeniedLeavesStateUnchanged(t *testing.T) {
	l := limit.Limit{Rate: 7, Period: time.Second, Burst: 2}
	now := int64(5 * sec)
	s, _ := Decide(State{}, l, now, 2)
	for _, cost := range []int64{1, 2, 3, 100} {
		got, d := Decide(s, l, now, cost)
		if d.Allowed || !got.Equal(s) {
			t.Fatalf("cost %d: got %+v state %+v, want denied with state %+v", cost, d, got, s)
		}
	}
}

// TestCostAboveBurst: a cost above the burst can never pass. It is denied without touching the
// state, and RetryAfter is the time to a full burst plus one full burst span, never zero, so
// that "retry now" is never said of a request that cannot pass.
func TestCostAboveBurst(t *testing.T) {
	l := limit.Limit{Rate: 2, Period: time.Second, Burst: 3}   // T = 500ms, full burst = 1.5s
	odd := limit.Limit{Rate: 3, Period: time.Second, Burst: 2} // T = 333⅓ms, full burst = 666⅔ms
	t0 := int64(1_000_000_000_000)
	used, _ := Decide(State{}, l, t0, 2)      // 2 of 3 used at t0
	oddUsed, _ := Decide(State{}, odd, t0, 1) // 1 of 2 used at t0: TAT t0 + 333⅓ms
	tests := []struct {
		name string
		s    State
		l    limit.Limit
		at   int64
		cost int64
		want Decision
	}{
		{"fresh key", State{}, l, t0, 4, Decision{Remaining: 3, RetryAfter: 1500 * time.Millisecond}},
		{"far above", State{}, l, t0, 1 << 40, Decision{Remaining: 3, RetryAfter: 1500 * time.Millisecond}},
		{"2 used", used, l, t0, 4, Decision{Remaining: 1, RetryAfter: 2500 * time.Millisecond, ResetAfter: time.Second}},
		{"2 used, half refilled", used, l, t0 + sec/4, 4, Decision{Remaining: 1, RetryAfter: 2250 * time.Millisecond, ResetAfter: 750 * time.Millisecond}},
		{"fractional spans round up each", oddUsed, odd, t0, 3, Decision{Remaining: 1, RetryAfter: 666667*time.Microsecond + 333334*time.Microsecond, ResetAfter: 333334 * time.Microsecond}},
		{"rate 0", State{}, limit.Limit{Period: time.Minute}, t0, 4, Decision{RetryAfter: time.Minute}},
	}
	for _, tc := range tests {
		got, d := Decide(tc.s, tc.l, tc.at, tc.cost)
		if d != tc.want || !got.Equal(tc.s) {
			t.Errorf("%s: got %+v state %+v, want %+v state unchanged %+v", tc.name, d, got, tc.want, tc.s)
		}
	}
}

func TestRefund(t *testing.T) {
	l := limit.Limit{Rate: 10, Period: time.Minute, Burst: 10}
	now := int64(100 * sec)
	s, _ := Decide(State{}, l, now, 8)
	s, d := Refund(s, l, now, 3)
	if d.Remaining != 5 {
		t.Fatalf("after refund of 3: remaining %d, want 5", d.Remaining)
	}
	s, d = Refund(s, l, now, 1000)
	if d.Remaining != 10 || !s.Fresh(now) {
		t.Fatalf("after refund beyond: remaining %d fresh %v, want 10 and fresh", d.Remaining, s.Fresh(now))
	}
}

func TestLimitChange(t *testing.T) {
	now := int64(1000 * sec)
	old := limit.Limit{Rate: 10, Period: time.Minute, Burst: 10}
	s, _ := Decide(State{}, old, now, 10) // 10 of 10 used
	tests := []struct {
		name      string
		l         limit.Limit
		allowed   bool
		remaining int64
	}{
		{"raised rate keeps usage", limit.Limit{Rate: 100, Period: time.Minute, Burst: 100}, true, 89},
		{"lowered rate caps at a full burst", limit.Limit{Rate: 5, Period: time.Minute, Burst: 5}, false, 0},
		{"raised burst only", limit.Limit{Rate: 10, Period: time.Minute, Burst: 20}, true, 9},
		{"lowered burst only", limit.Limit{Rate: 10, Period: time.Minute, Burst: 5}, false, 0},
		{"longer period", limit.Limit{Rate: 10, Period: time.Hour, Burst: 100}, true, 89},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, d := Decide(s, tc.l, now, 1)
			if d.Allowed != tc.allowed || d.Remaining != tc.remaining {
				t.Fatalf("got %+v, want allowed=%v remaining=%d", d, tc.allowed, tc.remaining)
			}
		})
	}
}

// tokenBucket is the reference: capacity b, refilled at rate/period per microsecond, in exact
// rational arithmetic.
type tokenBucket struct {
	tokens, perMicro, capacity *big.Rat
	last                       int64
}

func newTokenBucket(l limit.Limit) *tokenBucket {
	return &tokenBucket{
		tokens:   big.NewRat(l.Burst, 1),
		perMicro: big.NewRat(l.Rate, int64(l.Period/time.Microsecond)),
		capacity: big.NewRat(l.Burst, 1),
	}
}

func (tb *tokenBucket) take(now, cost int64) (bool, int64) {
	refill := new(big.Rat).Mul(big.NewRat(now-tb.last, 1), tb.perMicro)
	tb.tokens.Add(tb.tokens, refill)
	if tb.tokens.Cmp(tb.capacity) > 0 {
		tb.tokens.Set(tb.capacity)
	}
	tb.last = now
	ok := tb.tokens.Cmp(big.NewRat(cost, 1)) >= 0
	if ok {
		tb.tokens.Sub(tb.tokens, big.NewRat(cost, 1))
	}
	floor := new(big.Int).Quo(tb.tokens.Num(), tb.tokens.Denom())
	return ok, floor.Int64()
}

// TestGCRAEqualsTokenBucket: GCRA and a token bucket computed
// with fractions agree on every one of 60,000 random arrivals, for several rates, bursts and
// costs, both on the decision and on the remaining count.
func TestGCRAEqualsTokenBucket(t *testing.T) {
	limits := []limit.Limit{
		{Rate: 1, Period: time.Second, Burst: 10},
		{Rate: 7, Period: time.Second, Burst: 3},
		{Rate: 60, Period: time.Minute, Burst: 60},
		{Rate: 1000, Period: 3 * time.Second, Burst: 1},
		{Rate: 13, Period: 7 * time.Second, Burst: 29},
	}
	for _, l := range limits {
		t.Run(limitName(l), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(l.Rate), uint64(l.Burst)))
			interval := int64(l.Period/time.Microsecond) / l.Rate
			tb := newTokenBucket(l)
			var s State
			now := int64(1_700_000_000) * sec
			tb.last = now
			disagree := 0
			for i := range 60_000 {
				now += rng.Int64N(2*interval + 1) // mean arrival rate ≈ the limit: both outcomes common
				cost := 1 + rng.Int64N(3)
				var d Decision
				s, d = Decide(s, l, now, cost)
				ok, rem := tb.take(now, cost)
				if d.Allowed != ok || (ok && d.Remaining != rem) {
					if disagree < 5 {
						t.Errorf("arrival %d at +%dµs cost %d: GCRA %+v, token bucket allowed=%v remaining=%d", i, now, cost, d, ok, rem)
					}
					disagree++
				}
			}
			if disagree != 0 {
				t.Fatalf("%d of 60000 decisions disagree", disagree)
			}
		})
	}
}

func limitName(l limit.Limit) string {
	return big.NewRat(l.Rate, 1).RatString() + "/" + l.Period.String() + " burst " + big.NewRat(l.Burst, 1).RatString()
}

// TestWindowBound checks GCRA's defining bound: in any window of length W, at most
// burst + rate·W/period requests are admitted.
func TestWindowBound(t *testing.T) {
	l := limit.Limit{Rate: 60, Period: time.Minute, Burst: 10}
	rng := rand.New(rand.NewPCG(1, 2))
	var s State
	now := int64(1_000) * sec
	var admitted []int64
	for range 20_000 {
		now += rng.Int64N(sec) // about 2 arrivals per second against a limit of 1 per second
		var d Decision
		if s, d = Decide(s, l, now, 1); d.Allowed {
			admitted = append(admitted, now)
		}
	}
	for _, w := range []int64{1 * sec, 10 * sec, 60 * sec, 600 * sec} {
		bound := l.Burst + w*l.Rate/int64(l.Period/time.Microsecond)
		j := 0
		worst := 0
		for i := range admitted {
			for admitted[i]-admitted[j] >= w {
				j++
			}
			worst = max(worst, i-j+1)
		}
		if int64(worst) > bound {
			t.Errorf("window %ds: %d admitted, bound %d", w/sec, worst, bound)
		}
		t.Logf("window %ds: at most %d admitted (bound %d)", w/sec, worst, bound)
	}
}

// TestMinuteEdge: 60 requests in the second before
// a minute edge and 60 in the second after it, at 60 per minute. A fixed window admits all 120;
// GCRA admits the burst plus what refills during the two seconds (61 with burst 60, 11 with
// burst 10, as a token bucket of that capacity admits).
func TestMinuteEdge(t *testing.T) {
	var arrivals []int64
	for i := range int64(120) {
		arrivals = append(arrivals, 59*sec+i*sec/60) // 59.000s … 60.983s
	}
	fixed := map[int64]int{}
	fixedAdmitted := 0
	for _, at := range arrivals {
		if w := at / (60 * sec); fixed[w] < 60 {
			fixed[w]++
			fixedAdmitted++
		}
	}
	if fixedAdmitted != 120 {
		t.Fatalf("fixed window admitted %d, want 120", fixedAdmitted)
	}
	for _, tc := range []struct{ burst, want int64 }{{60, 61}, {10, 11}, {1, 2}} {
		l := limit.Limit{Rate: 60, Period: time.Minute, Burst: tc.burst}
		var s State
		n := int64(0)
		for _, at := range arrivals {
			var d Decision
			if s, d = Decide(s, l, at, 1); d.Allowed {
				n++
			}
		}
		bound := tc.burst + 2 // rate × the 2-second span
		if n != tc.want || n > bound {
			t.Errorf("burst %d: GCRA admitted %d, want %d (bound %d; fixed window: 120)", tc.burst, n, tc.want, bound)
		}
	}
}

func BenchmarkDecide(b *testing.B) {
	l := limit.Limit{Rate: 1000, Period: time.Second, Burst: 100}
	var s State
	now := int64(1_000) * sec
	b.ReportAllocs()
	for b.Loop() {
		now += 700
		s, _ = Decide(s, l, now, 1)
	}
}

// TestOverdraftSteps walks the usage-based sequence: 1000 tokens a minute, a report of 800, a
// report of 5000 that goes over (charged into debt under overdraft, not charged without), and
// checks (cost 0) until the debt of 4800 tokens is repaid after 4.8 minutes.
func TestOverdraftSteps(t *testing.T) {
	const ms = int64(time.Millisecond / time.Microsecond)
	t0 := int64(1_000_000_000_000)
	type step struct {
		name      string
		at        int64
		cost      int64
		allowed   bool
		remaining int64
		retry     time.Duration
		reset     time.Duration
	}
	for _, tc := range []struct {
		name      string
		overdraft bool
		steps     []step
	}{
		{"overdraft", true, []step{
			{"report 800", t0, 800, true, 200, 0, 48 * time.Second},
			// Answered as the key is after the charge: in debt, repaid in 288 s, full at 348 s.
			{"report 5000 goes over: charged", t0, 5000, false, 0, 288 * time.Second, 348 * time.Second},
			{"check in debt", t0, 0, false, 0, 288 * time.Second, 348 * time.Second},
			{"report 1 in debt: charged", t0 + sec, 1, false, 0, 288*time.Second + 60*time.Millisecond - time.Second, 347*time.Second + 60*time.Millisecond},
			{"check just before repaid", t0 + 288*sec + 60*ms - 1, 0, false, 0, time.Microsecond, 60*time.Second + time.Microsecond},
			{"check when repaid: exactly 0 remaining is admitted", t0 + 288*sec + 60*ms, 0, true, 0, 0, 60 * time.Second},
			{"a request with hits when repaid", t0 + 288*sec + 60*ms + 60*ms, 1, true, 0, 0, 60 * time.Second},
		}},
		{"without overdraft", false, []step{
			{"report 800", t0, 800, true, 200, 0, 48 * time.Second},
			{"report 5000 denied, not charged", t0, 5000, false, 200, 60*time.Second + 48*time.Second, 48 * time.Second},
			{"check admitted", t0, 0, true, 200, 0, 48 * time.Second},
			{"report 300 denied, not charged", t0, 300, false, 200, 6 * time.Second, 48 * time.Second},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := limit.Limit{Rate: 1000, Period: time.Minute, Burst: 1000, Overdraft: tc.overdraft}
			var s State
			for _, st := range tc.steps {
				var d Decision
				s, d = Decide(s, l, st.at, st.cost)
				want := Decision{Allowed: st.allowed, Remaining: st.remaining, RetryAfter: st.retry, ResetAfter: st.reset}
				if d != want {
					t.Fatalf("%s: got %+v, want %+v", st.name, d, want)
				}
			}
		})
	}
}

// TestOverdraftBounds: a debt saturates at MaxTolerance, a refund pays back at most a burst, and
// a changed rate forgives a debt (the key is re-expressed under the new rule, capped at a burst).
func TestOverdraftBounds(t *testing.T) {
	t0 := int64(1_000_000_000_000)
	l := limit.Limit{Rate: 1, Period: 5 * time.Second, Burst: 2, Overdraft: true}
	s, d := Decide(State{}, l, t0, 1<<40)
	if d.Allowed || s.TAT != t0+int64(limit.MaxTolerance/time.Microsecond) || s.Frac != 0 {
		t.Fatalf("huge charge: %+v state %+v, want denied and the TAT at now + MaxTolerance", d, s)
	}
	if s2, _ := Decide(s, l, t0, 5); !s2.Equal(s) {
		t.Fatalf("charge on a saturated debt: state %+v, want %+v", s2, s)
	}
	r, rd := Refund(s, l, t0, 100)
	if !rd.Allowed || r.TAT != s.TAT-2*5*sec || rd.Remaining != 0 {
		t.Fatalf("refund in debt: %+v state %+v, want a burst (10s) paid back and 0 remaining", rd, r)
	}
	changed := l
	changed.Rate = 2
	_, cd := Decide(s, changed, t0, 0)
	if !cd.Allowed || cd.Remaining != 0 || cd.ResetAfter != 5*time.Second {
		t.Fatalf("check under a changed rate: %+v, want the debt forgiven to a used burst", cd)
	}
	plain := l
	plain.Overdraft = false
	if _, pd := Decide(s, plain, t0, 0); !pd.Allowed || pd.Remaining != 0 {
		t.Fatalf("check once overdraft is off: %+v, want the debt capped at a burst", pd)
	}
	if got := (limit.Limit{Rate: 1 << 32, Period: time.Microsecond, Burst: 1, Overdraft: true}).MaxCharge(); got != 1<<33 {
		t.Fatalf("MaxCharge of a fast limit: %d, want 2^33", got)
	}
	if got := l.MaxCharge(); got != int64(limit.MaxTolerance/(5*time.Second)) {
		t.Fatalf("MaxCharge: %d, want %d", got, int64(limit.MaxTolerance/(5*time.Second)))
	}
}

// TestRefundUnderAnotherLimit: a refund under a limit other than the one a key's state was
// written under (a replica on an older rule during a rollout) gives back its own requests in
// the state's terms: the state is neither re-expressed under the refund's limit nor capped at
// its burst, which took back the other limit's charges with it.
func TestRefundUnderAnotherLimit(t *testing.T) {
	const now = int64(1_000_000_000)
	large := limit.Limit{Rate: 2000, Period: time.Hour, Burst: 2000}
	small := limit.Limit{Rate: 100, Period: time.Hour, Burst: 100}
	s, d := Decide(State{}, large, now, 1000)
	if !d.Allowed {
		t.Fatal("1000 of 2000 denied")
	}
	s, d = Refund(s, small, now, 30)
	if s.Rate != large.Rate || s.Period != large.PeriodMicros() {
		t.Fatalf("state re-expressed under the refund's limit: %+v", s)
	}
	if d.Remaining != 0 {
		t.Fatalf("the refund reports %d remaining under its limit of 100, want 0 (970 held)", d.Remaining)
	}
	if _, d := Decide(s, large, now, 0); d.Remaining != 1030 {
		t.Fatalf("%d remaining under the larger limit after the refund, want 1030 (970 held)", d.Remaining)
	}
	// More than the state holds leaves it empty.
	s, _ = Refund(s, small, now, 100)
	s, _ = Refund(s, limit.Limit{Rate: 1, Period: time.Second, Burst: 1 << 32}, now, 1<<32)
	if !s.Fresh(now) {
		t.Fatalf("state %+v after refunds of more than it held, want fresh", s)
	}
}
