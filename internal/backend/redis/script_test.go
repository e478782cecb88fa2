package redis

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// randomLimit returns a limit that Validate accepts, drawn across the magnitudes that matter to
// the arithmetic: rates up to 2^32, periods from 1µs to 100 years, tolerances up to the bound.
func randomLimit(rng *rand.Rand) limit.Limit {
	for {
		var l limit.Limit
		switch rng.IntN(4) {
		case 0: // everyday limits
			l.Rate = 1 + rng.Int64N(1000)
			l.Period = []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}[rng.IntN(4)]
		case 1: // odd rates and periods: nothing divides evenly
			l.Rate = 1 + rng.Int64N(1<<20)
			l.Period = time.Duration(1+rng.Int64N(1<<40)) * time.Microsecond
		case 2: // extremes
			l.Rate = []int64{1, 3, 7, 1 << 31, 1<<32 - 1, 1 << 32}[rng.IntN(6)]
			l.Period = []time.Duration{time.Microsecond, 7 * time.Microsecond, time.Second, 365 * 24 * time.Hour, limit.MaxTolerance}[rng.IntN(5)]
		default:
			l.Rate = 1 + rng.Int64N(1<<32)
			l.Period = time.Duration(1+rng.Int64N(int64(limit.MaxTolerance/time.Microsecond))) * time.Microsecond
		}
		switch rng.IntN(3) {
		case 0:
			l.Burst = l.Rate
		case 1:
			l.Burst = 1 + rng.Int64N(100)
		default:
			l.Burst = 1 + rng.Int64N(1<<32)
		}
		if l.Validate() == nil {
			return l
		}
	}
}

// randomState returns a state that some valid limit could have left at or around now.
func randomState(rng *rand.Rand, now int64, l limit.Limit) backend.State {
	if rng.IntN(5) == 0 {
		l = randomLimit(rng) // written under another limit: the clamping paths
	}
	if rng.IntN(3) == 0 {
		// Exactly k emission intervals ahead: the boundaries of every floor and ceiling.
		s, _ := backend.Decide(backend.State{}, l, now-rng.Int64N(2), 1+rng.Int64N(l.Burst))
		return s
	}
	span := fullSpan(l)
	var off int64
	if span > 0 {
		off = rng.Int64N(2*span+1) - span
	}
	return backend.State{TAT: now + off, Frac: rng.Int64N(l.Rate), Rate: l.Rate, Period: int64(l.Period / time.Microsecond)}
}

// fullSpan is the time a full burst holds, in whole microseconds (rounded down).
func fullSpan(l limit.Limit) int64 {
	// Charging a full burst to a fresh key leaves ResetAfter = ceil(full).
	_, d := backend.Decide(backend.State{}, l, 0, l.Burst)
	us := int64(d.ResetAfter / time.Microsecond)
	if us > 0 {
		us--
	}
	return us
}

func randomCost(rng *rand.Rand, l limit.Limit) int64 {
	switch rng.IntN(4) {
	case 0:
		return 1
	case 1:
		return rng.Int64N(min(l.Burst, 10) + 1)
	case 2:
		return l.Burst - rng.Int64N(2) + rng.Int64N(3) // around the burst, beyond it too
	}
	return rng.Int64N(l.Burst + 2)
}

func readState(t *testing.T, rdb goredis.UniversalClient, key string) (backend.State, bool) {
	t.Helper()
	v, err := rdb.Get(context.Background(), key).Result()
	if errors.Is(err, goredis.Nil) {
		return backend.State{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	s, ok := decodeState(v)
	if !ok {
		// The text form earlier versions stored, which the test writes too.
		if _, err := fmt.Sscanf(v, "%d %d %d %d", &s.TAT, &s.Frac, &s.Rate, &s.Period); err != nil {
			t.Fatalf("stored state %q: %v", v, err)
		}
	}
	return s, true
}

// TestScriptMatchesGo runs the Lua script and backend.Decide/Refund on the same random states,
// limits and costs at a fixed instant: same decisions, same stored state, and the undo of what
// was written restores the state exactly.
func TestScriptMatchesGo(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{})
	now := time.Now().UnixMicro()
	b.scriptNow = func() int64 { return now }
	rng := rand.New(rand.NewPCG(1, uint64(now)))
	t.Logf("seed %d", now)
	ctx := context.Background()
	n := 3000
	if testing.Short() {
		n = 300
	}
	for c := range n {
		l := randomLimit(rng)
		var s backend.State
		hasState := rng.IntN(6) != 0
		if hasState {
			s = randomState(rng, now, l)
		}
		cost := randomCost(rng, l)
		refund := rng.IntN(5) == 0
		key := "eq-" + strconv.Itoa(c)
		stored := storedKey(b.prefix, key)
		if hasState {
			v := encodeState(s)
			if rng.IntN(4) == 0 {
				// The text form earlier versions stored is read too.
				v = fmt.Sprintf("%d %d %d %d", s.TAT, s.Frac, s.Rate, s.Period)
			}
			if err := b.rdb.Set(ctx, stored, v, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
		}
		req := backend.Request{Key: key, Limit: l, Cost: cost, Refund: refund}
		var wantS backend.State
		var want backend.Decision
		if refund {
			wantS, want = backend.Refund(s, l, now, cost)
		} else {
			wantS, want = backend.Decide(s, l, now, cost)
		}
		desc := fmt.Sprintf("case %d: state %+v, limit %+v, cost %d, refund %v", c, s, l, cost, refund)

		j := newJob()
		out := make([]backend.Decision, 1)
		if err := j.plan(b, []backend.Request{req}, out); err != nil {
			t.Fatal(err)
		}
		c := &j.calls[0]
		c.multi = true // also check the check-only values and the change written, for undo
		b.single.sendPipeline(j.callPtrs(), time.Now().Add(5*time.Second), false)
		if c.err != nil {
			t.Fatalf("%s: %v", desc, c.err)
		}
		if c.dec[0] != want {
			t.Fatalf("%s:\n got %+v\nwant %+v", desc, c.dec[0], want)
		}
		if c.charged != want.Allowed {
			t.Fatalf("%s: charged=%v, want %v", desc, c.charged, want.Allowed)
		}
		got, ok := readState(t, b.rdb, stored)
		switch {
		case !want.Allowed && hasState && (!ok || !got.Equal(s)):
			t.Fatalf("%s: denied, but the stored state became %+v (present %v)", desc, got, ok)
		case want.Allowed && wantS.Fresh(now) && ok:
			t.Fatalf("%s: state fresh after the decision, but stored %+v", desc, got)
		case want.Allowed && !wantS.Fresh(now) && (!ok || !got.Equal(wantS)):
			t.Fatalf("%s: stored %+v (present %v), want %+v", desc, got, ok, wantS)
		}
		if !want.Allowed {
			continue
		}
		_, check := backend.Decide(s, l, now, 0)
		if c.check[0] != check.Remaining || time.Duration(c.check[1])*time.Microsecond != check.ResetAfter {
			t.Fatalf("%s: check-only remaining %d reset %dµs, want %+v", desc, c.check[0], c.check[1], check)
		}
		if err := j.undo(ctx, b, []backend.Request{req}, nil); err != nil {
			t.Fatalf("%s: undo: %v", desc, err)
		}
		// Undone, the key holds what it held, as of now under l: what a check of it keeps; a
		// refund in the state's own terms is undone in them, to the state it found.
		restored, _ := backend.Decide(s, l, now, 0)
		if refund && backend.OwnTerms(s, l, now) {
			restored = s
		}
		got, ok = readState(t, b.rdb, stored)
		if restored.Fresh(now) {
			if ok {
				t.Fatalf("%s: after undo stored %+v, want the key gone", desc, got)
			}
		} else if !ok || !got.Equal(restored) {
			t.Fatalf("%s: after undo stored %+v (present %v), want %+v", desc, got, ok, restored)
		}
	}
}

// TestScriptMatchesDecideBatch sends random batches (repeated keys, every mode, quotas, refunds,
// rate 0, costs above the burst) to the script at fixed instants and checks, against
// backend.DecideBatch on the states read from Redis before each batch: the same decisions, the
// same admission and the same states stored after it, on a single node and across Cluster
// slots (where a refused batch's charges on other slots are undone).
func TestScriptMatchesDecideBatch(t *testing.T) {
	steps := 2500
	if testing.Short() {
		steps = 300
	}
	for _, tc := range []struct {
		name, env string
		evalOnly  bool
	}{{"single", singleEnv, false}, {"cluster", clusterEnv, false}, {"single EVALSHA", singleEnv, true}} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.env, Options{evalOnly: tc.evalOnly})
			if b.lib.fcall.Load() == tc.evalOnly {
				t.Fatalf("calls by FCALL: %v, want %v", b.lib.fcall.Load(), !tc.evalOnly)
			}
			steps := steps
			if tc.evalOnly {
				steps /= 5 // the same script, called another way
			}
			now := time.Now().UnixMicro()
			if seed := os.Getenv("RLS_TEST_SEED"); seed != "" {
				// Replays a run: the seed a failure logged.
				v, err := strconv.ParseInt(seed, 10, 64)
				if err != nil {
					t.Fatalf("RLS_TEST_SEED: %v", err)
				}
				now = v
			}
			b.scriptNow = func() int64 { return now }
			rng := rand.New(rand.NewPCG(2, uint64(now)))
			t.Logf("seed %d (RLS_TEST_SEED replays it)", now)
			keys := make([]string, 12)
			limits := make([]limit.Limit, len(keys))
			tokyo, err := time.LoadLocation("Asia/Tokyo")
			if err != nil {
				t.Fatal(err)
			}
			ny, err := time.LoadLocation("America/New_York")
			if err != nil {
				t.Fatal(err)
			}
			for i := range keys {
				keys[i] = "batch-" + strconv.Itoa(i)
				// Two keys of each algorithm, then two more of GCRA and of fixed_window, the
				// odd ones under overdraft where it applies; the last two on calendar windows.
				alg := limit.Algorithm(i / 2 % 4)
				l := limit.Limit{Rate: 1 + rng.Int64N(20), Period: time.Duration(1+rng.Int64N(5)) * time.Second, Burst: 1 + rng.Int64N(8),
					Algorithm: alg, Overdraft: i%2 == 1 && (alg == limit.GCRA || alg == limit.FixedWindow)}
				if alg != limit.GCRA {
					l.Burst = l.Rate
				}
				switch i {
				case 10:
					l.Period, l.Window = 24*time.Hour, limit.Window{Calendar: limit.Day, Every: 1, Location: ny}
				case 11:
					l.Period, l.Window = 30*24*time.Hour, limit.Window{Calendar: limit.Month, Every: 1, Location: tokyo}
				}
				if err := l.Validate(); err != nil {
					t.Fatal(err)
				}
				limits[i] = l
			}
			check := batchCheck{t: t, b: b, keys: keys, limits: limits}
			var multi, refused, aboveBurst, checks, debts, overdrawn, saturated int
			for step := range steps {
				now += rng.Int64N(300_000)
				reqs := make([]backend.Request, 1+rng.IntN(5))
				for i := range reqs {
					k := rng.IntN(len(keys))
					reqs[i] = backend.Request{Key: keys[k], Limit: limits[k], Cost: rng.Int64N(4),
						Refund: rng.IntN(8) == 0, Mode: backend.Mode(rng.IntN(3))}
					switch rng.IntN(40) {
					case 0, 1:
						reqs[i].Limit = limit.Limit{Rate: 0, Period: time.Second, Overdraft: limits[k].Overdraft}
					case 2, 3:
						reqs[i].Cost = limits[k].Burst + 1 + rng.Int64N(1<<20)
					case 4:
						// Saturates an overdraft key's debt at MaxTolerance (a GCRA one, keys 1
						// and 9, or fixed_window's count).
						if !limits[k].Overdraft {
							reqs[i].Key, reqs[i].Limit = keys[1], limits[1]
						}
						reqs[i].Cost = 1 << 40
					case 5:
						// The rule changed: a debt is re-expressed (and forgiven) under it.
						reqs[i].Limit.Rate++
						if reqs[i].Limit.Algorithm != limit.GCRA {
							reqs[i].Limit.Burst++
						}
					case 6, 7:
						// A check of a key that may be in debt.
						reqs[i].Cost, reqs[i].Refund = 0, false
					}
					if reqs[i].Cost > reqs[i].Limit.Burst {
						aboveBurst++
					}
					if reqs[i].Cost == 0 && !reqs[i].Refund {
						checks++
					}
				}
				states, want, wantCharged := check.batch(step, reqs, now)
				for i, r := range reqs {
					if r.OverdraftCharge() && !want[i].Allowed && wantCharged {
						overdrawn++
					}
					if r.Limit.Overdraft && r.Limit.Algorithm == limit.FixedWindow && states[i].Alg == limit.FixedWindow && !states[i].Fresh(now) && states[i].Frac > r.Limit.Rate {
						debts++
					}
					if r.Limit.Overdraft && r.Limit.Algorithm == limit.GCRA && r.Limit.Rate > 0 && !states[i].Fresh(now) && states[i].TAT-now > r.Limit.Period.Microseconds()*r.Limit.Burst/r.Limit.Rate {
						debts++
						if states[i].TAT-now >= int64(limit.MaxTolerance/time.Microsecond)-int64(10*time.Minute/time.Microsecond) {
							saturated++
						}
					}
				}
				if j := newJob(); j.plan(b, reqs, make([]backend.Decision, len(reqs))) == nil && len(j.calls) > 1 {
					multi++
				}
				if !wantCharged {
					refused++
				}
			}
			t.Logf("%d batches, %d refused, %d spanning slots, %d requests above their burst, %d checks, %d requests on keys in debt (%d saturated), %d charged into debt",
				steps, refused, multi, aboveBurst, checks, debts, saturated, overdrawn)
			if tc.env == clusterEnv && multi < steps/3 {
				t.Fatalf("only %d batches spanned slots", multi)
			}
			if !testing.Short() && (checks < steps/4 || debts < steps/10 || saturated == 0 || overdrawn < steps/20) {
				t.Fatalf("the batches exercised too little: %d checks, %d on keys in debt, %d saturated, %d charged into debt", checks, debts, saturated, overdrawn)
			}
		})
	}
}

// batchCheck compares the batches a backend decides with backend.DecideBatch on the states read
// from Redis before each: the same decisions, the same admission and the same states stored
// after it.
type batchCheck struct {
	t      *testing.T
	b      *Backend
	keys   []string      // every key the batches use
	limits []limit.Limit // per key, the limit its stored state is compared under
}

// read returns the states the keys hold.
func (c *batchCheck) read() map[string]backend.State {
	got := map[string]backend.State{}
	for _, k := range c.keys {
		if s, ok := readState(c.t, c.b.rdb, storedKey(c.b.prefix, k)); ok {
			got[k] = s
		}
	}
	return got
}

// batch decides reqs on the backend, whose script decides at now, and by DecideBatch, and fails
// the test on any difference. It returns the states the batch found, DecideBatch's decisions and
// whether it charged the batch.
func (c *batchCheck) batch(step int, reqs []backend.Request, now int64) ([]backend.State, []backend.Decision, bool) {
	t, b := c.t, c.b
	t.Helper()
	before := c.read()
	states := make([]backend.State, len(reqs))
	for i, r := range reqs {
		states[i] = before[r.Key]
	}
	want := make([]backend.Decision, len(reqs))
	next := make([]backend.State, len(reqs))
	wantCharged := backend.DecideBatch(states, reqs, now, want, next)
	wantOK := backend.Admitted(reqs, want)
	got := make([]backend.Decision, len(reqs))
	gotOK, err := b.Decide(context.Background(), reqs, got)
	if err != nil {
		t.Fatalf("step %d: %v", step, err)
	}
	if gotOK != wantOK || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("step %d: batch %+v\n got %v %+v\nwant %v %+v", step, reqs, gotOK, got, wantOK, want)
	}
	// The states stored: what DecideBatch says of each key's last occurrence, or,
	// refused, what was there. An undone charge may leave a key that held no usage
	// deleted rather than as it was: compare what each key holds now.
	wantStored := maps.Clone(before)
	if wantCharged {
		for i, r := range reqs {
			if r.Limit.Rate == 0 {
				continue
			}
			wantStored[r.Key] = next[i]
		}
	}
	after := c.read()
	// A batch that changed a key's rule and was undone across slots leaves the key
	// as the new rule sees it (a debt under the old one forgiven): compare it so.
	changed := map[string]limit.Limit{}
	for _, r := range reqs {
		if r.Limit.Rate > 0 {
			changed[r.Key] = r.Limit
		}
	}
	for k, l := range c.limits {
		w, g := wantStored[c.keys[k]], after[c.keys[k]]
		if nl, ok := changed[c.keys[k]]; ok && nl != l && !wantCharged {
			l = nl
		}
		_, wd := backend.Decide(w, l, now, 0)
		_, gd := backend.Decide(g, l, now, 0)
		exact := wantCharged || len(j(b, reqs)) == 1
		if (exact && !w.Fresh(now) && !g.Equal(w)) || wd != gd {
			t.Fatalf("step %d: key %s stored %+v, want %+v (batch %+v, charged %v)", step, c.keys[k], g, w, reqs, wantCharged)
		}
	}
	return states, want, wantCharged
}

// j plans reqs and returns its script calls.
func j(b *Backend, reqs []backend.Request) []call {
	jb := newJob()
	if err := jb.plan(b, reqs, make([]backend.Decision, len(reqs))); err != nil {
		panic(err)
	}
	return jb.calls
}

// TestMergedBatchesMatchMemory merges random batches into one script call, as coalescing does on
// a single node, and decides them one after another on the memory backend at the same instant:
// the same decisions and admissions, with keys shared across batches and refused batches
// between admitted ones, and the same state afterwards for the rounds that follow.
func TestMergedBatchesMatchMemory(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{Coalesce: 8})
	now := time.Now().UnixMicro()
	b.scriptNow = func() int64 { return now }
	m, err := backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return time.UnixMicro(now) }})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, uint64(now)))
	t.Logf("seed %d", now)
	keys := make([]string, 6)
	limits := make([]limit.Limit, len(keys))
	for i := range keys {
		keys[i] = "merged-" + strconv.Itoa(i)
		limits[i] = limit.Limit{Rate: 1 + rng.Int64N(20), Period: time.Duration(1+rng.Int64N(5)) * time.Second, Burst: 1 + rng.Int64N(8),
			Overdraft: i%2 == 1}
	}
	ctx := context.Background()
	refusedBetween := 0
	for round := range 400 {
		now += rng.Int64N(500_000)
		type batch struct {
			reqs []backend.Request
			j    *job
			out  []backend.Decision
		}
		var batches []*batch
		var calls []*call
		for range 2 + rng.IntN(6) {
			c := &batch{reqs: make([]backend.Request, 1+rng.IntN(4)), j: newJob()}
			for i := range c.reqs {
				k := rng.IntN(len(keys))
				c.reqs[i] = backend.Request{Key: keys[k], Limit: limits[k], Cost: rng.Int64N(4),
					Refund: rng.IntN(8) == 0, Mode: backend.Mode(rng.IntN(3))}
				switch rng.IntN(20) {
				case 0:
					c.reqs[i].Limit = limit.Limit{Rate: 0, Period: time.Second}
				case 1:
					c.reqs[i].Cost = limits[k].Burst + 1 + rng.Int64N(100) // into debt under overdraft
				}
			}
			c.out = make([]backend.Decision, len(c.reqs))
			if err := c.j.plan(b, c.reqs, c.out); err != nil {
				t.Fatal(err)
			}
			calls = append(calls, c.j.callPtrs()...)
			batches = append(batches, c)
		}
		b.single.sendPipeline(calls, time.Now().Add(5*time.Second), false)
		for n, c := range batches {
			want := make([]backend.Decision, len(c.reqs))
			wantOK, _ := m.Decide(ctx, c.reqs, want)
			var gotOK bool
			if len(c.j.calls) == 0 {
				gotOK = backend.Admitted(c.reqs, c.out)
			} else {
				var undo bool
				var err error
				if gotOK, undo, err = c.j.settle(c.reqs, c.out); err != nil || undo {
					t.Fatalf("round %d batch %d: %v (undo %v: no batch of one call is undone)", round, n, err, undo)
				}
				if wantCharged := backend.Charged(c.reqs, want); c.j.calls[0].charged != wantCharged {
					t.Fatalf("round %d batch %d: charged=%v, want %v", round, n, c.j.calls[0].charged, wantCharged)
				}
			}
			if gotOK != wantOK || fmt.Sprint(c.out) != fmt.Sprint(want) {
				t.Fatalf("round %d batch %d: %+v\n got %v %+v\nwant %v %+v", round, n, c.reqs, gotOK, c.out, wantOK, want)
			}
			if !wantOK && n > 0 && n < len(batches)-1 {
				refusedBetween++
			}
		}
	}
	if refusedBetween < 50 {
		t.Fatalf("only %d refused batches between others", refusedBetween)
	}
}

// randomWindowLimit returns a window limit that Validate accepts, at the extremes it allows:
// rates from 1 to 2^32 (sliding_log's to MaxLogRate), periods from 1 µs (1 ms for
// sliding_window) to MaxTolerance, fixed windows from an offset or on a calendar in one of locs,
// overdraft or not.
func randomWindowLimit(rng *rand.Rand, locs []*time.Location) limit.Limit {
	const day = 24 * time.Hour
	for {
		l := limit.Limit{Algorithm: limit.FixedWindow + limit.Algorithm(rng.IntN(3))}
		rates := []int64{1, 2, 3, 1000, 1 << 20, 1e9, 1 << 32}
		if l.Algorithm == limit.SlidingLog {
			rates = []int64{1, 2, 7, 999, limit.MaxLogRate}
		}
		l.Rate = rates[rng.IntN(len(rates))]
		if rng.IntN(4) == 0 {
			l.Rate = 1 + rng.Int64N(l.Rate) // odd rates between
		}
		l.Burst = l.Rate
		periods := []time.Duration{time.Microsecond, 7 * time.Microsecond, time.Millisecond, 7 * time.Millisecond, time.Second,
			time.Hour, 30 * day, 365 * day, 10 * 365 * day, limit.MaxTolerance}
		l.Period = periods[rng.IntN(len(periods))]
		if rng.IntN(4) == 0 {
			l.Period = time.Duration(1+rng.Int64N(int64(l.Period/time.Microsecond))) * time.Microsecond
		}
		if l.Algorithm == limit.SlidingWindow {
			l.Period = max(l.Period.Truncate(time.Millisecond), time.Millisecond)
		}
		if l.Algorithm == limit.FixedWindow {
			l.Overdraft = rng.IntN(3) == 0
			switch rng.IntN(3) {
			case 0:
				l.Window.Offset = rng.Int64N(int64(l.Period / time.Microsecond))
			case 1:
				unit := limit.Day + limit.Unit(rng.IntN(4))
				every := 1 + rng.Int64N(3)
				l.Window = limit.Window{Calendar: unit, Every: every, Location: locs[rng.IntN(len(locs))]}
				l.Period = time.Duration(every) * map[limit.Unit]time.Duration{limit.Day: day, limit.Week: 7 * day,
					limit.Month: 30 * day, limit.Year: 365 * day}[unit]
			}
		}
		if l.Validate() == nil {
			return l
		}
	}
}

// randomWindowCost returns a cost around what matters under l: none, one, a few, half the rate,
// about the rate, above it, and under overdraft a charge far beyond.
func randomWindowCost(rng *rand.Rand, l limit.Limit) int64 {
	costs := []int64{0, 1, rng.Int64N(min(l.Rate, 10) + 1), l.Rate/2 + rng.Int64N(2), l.Rate - rng.Int64N(2) + rng.Int64N(3),
		l.Rate + 1 + rng.Int64N(1<<20)}
	if l.Overdraft {
		costs = append(costs, 1<<40)
	}
	return costs[rng.IntN(len(costs))]
}

// TestWindowScriptMatchesDecideBatch sends random batches under the window algorithms at the
// extremes Validate allows (see randomWindowLimit) to the script, at instants on and around
// their edges: the end of a key's window, a month's and a year's end, a change of daylight
// saving time in the zones of the calendar windows; rls's clock up to a second from Redis's,
// either way. Each batch is checked against
// backend.DecideBatch as in TestScriptMatchesDecideBatch, on a single node and across Cluster
// slots.
func TestWindowScriptMatchesDecideBatch(t *testing.T) {
	var locs []*time.Location
	for _, name := range []string{"UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe", "Asia/Kathmandu"} {
		loc, err := time.LoadLocation(name)
		if err != nil {
			t.Fatal(err)
		}
		locs = append(locs, loc)
	}
	paris, ny, lordHowe := locs[1], locs[2], locs[3]
	// The instants each run starts just before: daylight saving time begins and ends (Lord Howe
	// moves by half an hour), a month's end, a year's end, each in its zone.
	starts := []time.Time{
		time.Date(2026, 3, 29, 1, 59, 59, 0, paris),
		time.Date(2026, 11, 1, 1, 59, 59, 0, ny),
		time.Date(2026, 4, 5, 1, 59, 59, 0, lordHowe),
		time.Date(2026, 2, 28, 23, 59, 59, 0, locs[4]),
		time.Date(2026, 12, 31, 23, 59, 59, 0, time.UTC),
	}
	steps := 1500
	if testing.Short() {
		steps = 200
	}
	for _, tc := range []struct{ name, env string }{{"single", singleEnv}, {"cluster", clusterEnv}} {
		t.Run(tc.name, func(t *testing.T) {
			seed := time.Now().UnixNano()
			if s := os.Getenv("RLS_TEST_SEED"); s != "" {
				v, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					t.Fatalf("RLS_TEST_SEED: %v", err)
				}
				seed = v
			}
			t.Logf("seed %d (RLS_TEST_SEED replays it)", seed)
			rng := rand.New(rand.NewPCG(4, uint64(seed)))
			// The script decides at now; rls computes the calendar windows around it on its own
			// clock, now + skew (see TestCalendarWindowClockSkew).
			var now, skew int64
			b := newTestBackend(t, tc.env, Options{Now: func() time.Time { return time.UnixMicro(now + skew) }})
			b.scriptNow = func() int64 { return now }
			var edges, crossed, denied, calendar, huge, long, short int
			for run, start := range starts {
				now = start.UnixMicro() - rng.Int64N(5_000_000)
				keys := make([]string, 8)
				limits := make([]limit.Limit, len(keys))
				for i := range keys {
					keys[i] = fmt.Sprintf("window-%d-%d", run, i)
					limits[i] = randomWindowLimit(rng, locs)
					if i < 2 {
						// A day's and a month's (a year's) fixed windows in the zone of the
						// edge the run starts at, so that the run crosses it on a calendar.
						unit := limit.Day
						if i == 1 {
							unit = []limit.Unit{limit.Month, limit.Year}[rng.IntN(2)]
						}
						limits[i].Algorithm, limits[i].Burst = limit.FixedWindow, limits[i].Rate
						limits[i].Period = 24 * time.Hour
						limits[i].Window = limit.Window{Calendar: unit, Every: 1, Location: start.Location()}
					}
					for limits[i].Rate < 1e9 && i == 2 || (limits[i].Algorithm != limit.SlidingLog || limits[i].Rate < limit.MaxLogRate) && i == 3 {
						// The highest rates: a window's, a log's.
						limits[i] = randomWindowLimit(rng, locs)
					}
					if limits[i].Window.Calendar != limit.NoCalendar {
						calendar++
					}
					if limits[i].Rate >= 1e9 {
						huge++
					}
					if limits[i].Period >= 365*24*time.Hour {
						long++
					}
					if limits[i].Period <= time.Millisecond {
						short++
					}
				}
				check := batchCheck{t: t, b: b, keys: keys, limits: limits}
				pin, cross := -1, int64(0) // a key charged just before its window's end, then just after it
				for step := range steps / len(starts) {
					switch n := rng.IntN(8); {
					case cross != 0:
						now, cross = cross, 0
					case n == 0:
						// Just before the end of some key's window, of at most a year, and then
						// just after it.
						k := rng.IntN(len(limits))
						if _, end := limits[k].Bounds(now); end-now <= int64(366*24*time.Hour/time.Microsecond) {
							now, cross, pin = end-1-rng.Int64N(3), end+rng.Int64N(3), k
							edges++
						}
					case n == 1:
						now += rng.Int64N(1 << 30) // up to 18 minutes
					default:
						now += rng.Int64N(3000)
					}
					skew = 0
					if rng.IntN(2) == 0 {
						skew = rng.Int64N(2_000_001) - 1_000_000
					}
					reqs := make([]backend.Request, 1+rng.IntN(4))
					for i := range reqs {
						k := rng.IntN(len(keys))
						reqs[i] = backend.Request{Key: keys[k], Limit: limits[k], Cost: randomWindowCost(rng, limits[k]),
							Refund: rng.IntN(8) == 0, Mode: backend.Mode(rng.IntN(3))}
					}
					if pin >= 0 {
						reqs[0] = backend.Request{Key: keys[pin], Limit: limits[pin], Cost: 1}
						if cross == 0 {
							pin = -1
						}
					}
					states, want, _ := check.batch(step, reqs, now)
					for i, r := range reqs {
						if !want[i].Allowed {
							denied++
						}
						if s := states[i]; s.Alg == r.Limit.Algorithm && s.Alg != limit.SlidingLog && !s.Fresh(now) {
							if _, end := r.Limit.Bounds(now); s.TAT != end {
								crossed++ // a state left by an earlier window
							}
						}
					}
				}
			}
			t.Logf("%d limits on calendars, %d at rates of 1e9 or more, %d of a year or more, %d of 1 ms or less; %d jumps to a window's end, %d requests on a state of an earlier window, %d denied",
				calendar, huge, long, short, edges, crossed, denied)
			if !testing.Short() && (huge == 0 || long == 0 || short == 0 || edges < steps/20 || denied < steps/10) {
				t.Fatal("the batches exercised too little")
			}
		})
	}
}
