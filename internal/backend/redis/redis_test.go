package redis

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/backend/backendtest"
	"github.com/rls-project/rls/internal/redistest"
)

func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		opts Options
	}{
		{"single", singleEnv, Options{}},
		{"single coalesced", singleEnv, Options{Coalesce: 16}},
		{"single cached", singleEnv, Options{LocalCacheSize: 100}},
		{"cluster", clusterEnv, Options{}},
		{"cluster coalesced cached", clusterEnv, Options{Coalesce: 16, LocalCacheSize: 100}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.env, tc.opts)
			backendtest.Run(t, func(t *testing.T) backend.Backend { return b })
		})
	}
}

// TestSentinel runs the conformance suite through a Sentinel that monitors a Redis started here.
func TestSentinel(t *testing.T) {
	r := redistest.Start(t)
	target, err := ParseURL("redis-sentinel://" + startSentinel(t, r.Addr()) + "/rlsmaster")
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(context.Background(), Options{Target: target, Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !b.Healthy() {
		t.Fatal("not healthy through Sentinel")
	}
	backendtest.Run(t, func(t *testing.T) backend.Backend { return b })
	direct := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer direct.Close()
	if n, err := direct.DBSize(context.Background()).Result(); err != nil || n == 0 {
		t.Fatalf("the master behind the Sentinel holds %d keys (%v), want the suite's", n, err)
	}
}

// randomLimit returns a limit that Validate accepts, drawn across the magnitudes that matter to
// the arithmetic: rates up to 2^32, periods from 1µs to 100 years, tolerances up to the bound.
func randomLimit(rng *rand.Rand) backend.Limit {
	for {
		var l backend.Limit
		switch rng.IntN(4) {
		case 0: // everyday limits
			l.Rate = 1 + rng.Int64N(1000)
			l.Period = []time.Duration{time.Second, time.Minute, time.Hour, 24 * time.Hour}[rng.IntN(4)]
		case 1: // odd rates and periods: nothing divides evenly
			l.Rate = 1 + rng.Int64N(1<<20)
			l.Period = time.Duration(1+rng.Int64N(1<<40)) * time.Microsecond
		case 2: // extremes
			l.Rate = []int64{1, 3, 7, 1 << 31, 1<<32 - 1, 1 << 32}[rng.IntN(6)]
			l.Period = []time.Duration{time.Microsecond, 7 * time.Microsecond, time.Second, 365 * 24 * time.Hour, backend.MaxTolerance}[rng.IntN(5)]
		default:
			l.Rate = 1 + rng.Int64N(1<<32)
			l.Period = time.Duration(1+rng.Int64N(int64(backend.MaxTolerance/time.Microsecond))) * time.Microsecond
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
func randomState(rng *rand.Rand, now int64, l backend.Limit) backend.State {
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
func fullSpan(l backend.Limit) int64 {
	// Charging a full burst to a fresh key leaves ResetAfter = ceil(full).
	_, d := backend.Decide(backend.State{}, l, 0, l.Burst)
	us := int64(d.ResetAfter / time.Microsecond)
	if us > 0 {
		us--
	}
	return us
}

func randomCost(rng *rand.Rand, l backend.Limit) int64 {
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
		b.single.sendCalls(j.callPtrs(), time.Now().Add(5*time.Second))
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
		// Undone, the key holds what it held, as of now under l: what a check of it keeps.
		restored, _ := backend.Decide(s, l, now, 0)
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
			if b.fcall.Load() == tc.evalOnly {
				t.Fatalf("calls by FCALL: %v, want %v", b.fcall.Load(), !tc.evalOnly)
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
			limits := make([]backend.Limit, len(keys))
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
				alg := backend.Algorithm(i / 2 % 4)
				l := backend.Limit{Rate: 1 + rng.Int64N(20), Period: time.Duration(1+rng.Int64N(5)) * time.Second, Burst: 1 + rng.Int64N(8),
					Algorithm: alg, Overdraft: i%2 == 1 && (alg == backend.GCRA || alg == backend.FixedWindow)}
				if alg != backend.GCRA {
					l.Burst = l.Rate
				}
				switch i {
				case 10:
					l.Period, l.Window = 24*time.Hour, backend.Window{Calendar: backend.Day, Every: 1, Location: ny}
				case 11:
					l.Period, l.Window = 30*24*time.Hour, backend.Window{Calendar: backend.Month, Every: 1, Location: tokyo}
				}
				if err := l.Validate(); err != nil {
					t.Fatal(err)
				}
				limits[i] = l
			}
			ctx := context.Background()
			read := func() map[string]backend.State {
				got := map[string]backend.State{}
				for _, k := range keys {
					if s, ok := readState(t, b.rdb, storedKey(b.prefix, k)); ok {
						got[k] = s
					}
				}
				return got
			}
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
						reqs[i].Limit = backend.Limit{Rate: 0, Period: time.Second, Overdraft: limits[k].Overdraft}
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
						if reqs[i].Limit.Algorithm != backend.GCRA {
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
				before := read()
				states := make([]backend.State, len(reqs))
				for i, r := range reqs {
					states[i] = before[r.Key]
				}
				want := make([]backend.Decision, len(reqs))
				next := make([]backend.State, len(reqs))
				wantCharged := backend.DecideBatch(states, reqs, now, want, next)
				wantOK := backend.Admitted(reqs, want)
				for i, r := range reqs {
					if r.OverdraftCharge() && !want[i].Allowed && wantCharged {
						overdrawn++
					}
					if r.Limit.Overdraft && r.Limit.Algorithm == backend.FixedWindow && states[i].Alg == backend.FixedWindow && !states[i].Fresh(now) && states[i].Frac > r.Limit.Rate {
						debts++
					}
					if r.Limit.Overdraft && r.Limit.Algorithm == backend.GCRA && r.Limit.Rate > 0 && !states[i].Fresh(now) && states[i].TAT-now > r.Limit.Period.Microseconds()*r.Limit.Burst/r.Limit.Rate {
						debts++
						if states[i].TAT-now >= int64(backend.MaxTolerance/time.Microsecond)-int64(10*time.Minute/time.Microsecond) {
							saturated++
						}
					}
				}
				got := make([]backend.Decision, len(reqs))
				gotOK, err := b.Decide(ctx, reqs, got)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if j := newJob(); j.plan(b, reqs, make([]backend.Decision, len(reqs))) == nil && len(j.calls) > 1 {
					multi++
				}
				if !wantCharged {
					refused++
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
				after := read()
				// A batch that changed a key's rule and was undone across slots leaves the key
				// as the new rule sees it (a debt under the old one forgiven): compare it so.
				changed := map[string]backend.Limit{}
				for _, r := range reqs {
					if r.Limit.Rate > 0 {
						changed[r.Key] = r.Limit
					}
				}
				for k, l := range limits {
					w, g := wantStored[keys[k]], after[keys[k]]
					if c, ok := changed[keys[k]]; ok && c != l && !wantCharged {
						l = c
					}
					_, wd := backend.Decide(w, l, now, 0)
					_, gd := backend.Decide(g, l, now, 0)
					exact := wantCharged || len(j(b, reqs)) == 1
					if (exact && !w.Fresh(now) && !g.Equal(w)) || wd != gd {
						t.Fatalf("step %d: key %s stored %+v, want %+v (batch %+v, charged %v)", step, keys[k], g, w, reqs, wantCharged)
					}
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
	limits := make([]backend.Limit, len(keys))
	for i := range keys {
		keys[i] = "merged-" + strconv.Itoa(i)
		limits[i] = backend.Limit{Rate: 1 + rng.Int64N(20), Period: time.Duration(1+rng.Int64N(5)) * time.Second, Burst: 1 + rng.Int64N(8),
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
					c.reqs[i].Limit = backend.Limit{Rate: 0, Period: time.Second}
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
		b.single.sendCalls(calls, time.Now().Add(5*time.Second))
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
			la := backend.Limit{Rate: 100, Period: time.Hour, Burst: 100}
			lb := backend.Limit{Rate: 50, Period: time.Hour, Burst: 50}
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
	log := backend.Limit{Rate: 5, Period: time.Minute, Burst: 5, Algorithm: backend.SlidingLog}
	spent := backend.Limit{Rate: 1, Period: time.Hour, Burst: 1}
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
	want := backend.State{Alg: backend.SlidingLog, Rate: 5, Period: 60e6, Log: []int64{t0, 2, t0 + 1e6, 2}}
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

// TestNoScript: after SCRIPT FLUSH and FUNCTION FLUSH every call still works, direct and
// pipelined, and the count carries on; the library of Redis Functions is loaded again and calls
// go by it once more.
func TestNoScript(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		opts Options
	}{
		{"single", singleEnv, Options{}},
		{"single coalesced", singleEnv, Options{Coalesce: 8}},
		{"single EVALSHA", singleEnv, Options{Coalesce: 8, evalOnly: true}},
		{"cluster", clusterEnv, Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBackend(t, tc.env, tc.opts)
			ctx := context.Background()
			if b.fcall.Load() == tc.opts.evalOnly {
				t.Fatalf("calls by FCALL: %v, want %v (Redis 7 takes the library)", b.fcall.Load(), !tc.opts.evalOnly)
			}
			flush := func() {
				each := func(ctx context.Context, n goredis.Cmdable) error {
					if err := n.ScriptFlush(ctx).Err(); err != nil {
						return err
					}
					return n.FunctionFlush(ctx).Err()
				}
				if c, ok := b.rdb.(*goredis.ClusterClient); ok {
					if err := c.ForEachMaster(ctx, func(ctx context.Context, n *goredis.Client) error { return each(ctx, n) }); err != nil {
						t.Fatal(err)
					}
					return
				}
				if err := each(ctx, b.rdb); err != nil {
					t.Fatal(err)
				}
			}
			l := backend.Limit{Rate: 10, Period: time.Hour, Burst: 10}
			reqs := []backend.Request{{Key: "ns-a", Limit: l, Cost: 1}, {Key: "ns-b", Limit: l, Cost: 1}, {Key: "ns-c", Limit: l, Cost: 1}}
			decide := func(i int, after string) {
				t.Helper()
				out := make([]backend.Decision, len(reqs))
				ok, err := b.Decide(ctx, reqs, out)
				if err != nil {
					t.Fatalf("call %d %s: %v", i, after, err)
				}
				if !ok || out[0].Remaining != int64(9-i) {
					t.Fatalf("call %d %s: admitted=%v %+v, want admitted with remaining %d", i, after, ok, out, 9-i)
				}
			}
			for i := range 4 {
				flush()
				decide(i, "after SCRIPT FLUSH and FUNCTION FLUSH")
			}
			if tc.opts.evalOnly {
				if b.fcall.Load() {
					t.Fatal("calls by FCALL with evalOnly")
				}
				return
			}
			deadline := time.Now().Add(5 * time.Second)
			for !b.fcall.Load() {
				if time.Now().After(deadline) {
					t.Fatal("the library was not loaded again within 5s")
				}
				time.Sleep(time.Millisecond)
			}
			decide(4, "once the library is back")
		})
	}
}

// TestLibraryRefused: a Redis that refuses FUNCTION (here an ACL) leaves the backend on
// EVALSHA, and decisions go on as before.
func TestLibraryRefused(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer admin.Close()
	if err := admin.Do(ctx, "acl", "setuser", "nofn", "on", ">pw", "~*", "&*", "+@all", "-function").Err(); err != nil {
		t.Fatal(err)
	}
	b := newURLBackend(t, "redis://nofn:pw@"+r.Addr())
	if !b.Healthy() || b.fcall.Load() {
		t.Fatalf("healthy %v, calls by FCALL %v: want healthy, by EVALSHA", b.Healthy(), b.fcall.Load())
	}
	l := backend.Limit{Rate: 2, Period: time.Hour, Burst: 2}
	for i, want := range []bool{true, true, false} {
		ok, err := b.Decide(ctx, []backend.Request{{Key: "k", Limit: l, Cost: 1}}, make([]backend.Decision, 1))
		if err != nil || ok != want {
			t.Fatalf("call %d: admitted=%v err=%v, want admitted=%v", i, ok, err, want)
		}
	}
	if n, err := admin.FunctionList(ctx, goredis.FunctionListQuery{}).Result(); err != nil || len(n) != 0 {
		t.Fatalf("libraries %v (err %v), want none", n, err)
	}
}

// newURLBackend connects to the Redis at url with default options, closed when the test ends.
func newURLBackend(t *testing.T, url string) *Backend {
	t.Helper()
	target, err := ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(context.Background(), Options{Target: target})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// TestFCallRefused: a Redis that takes the library but refuses FCALL (renamed, as a proxy or a
// failover to an older Redis would; or an ACL without it) answers every decision all the same,
// through EVAL and then EVALSHA, and the backend stops sending FCALL for good.
func TestFCallRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		acl  []any // a user to connect as
	}{
		{"unknown command", []string{"--rename-command", "FCALL", "fcall-renamed"}, nil},
		{"ACL", nil, []any{"acl", "setuser", "nofcall", "on", ">pw", "~*", "&*", "+@all", "-fcall"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.StartWith(t, tc.args...)
			url := r.URL()
			if tc.acl != nil {
				admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
				defer admin.Close()
				if err := admin.Do(context.Background(), tc.acl...).Err(); err != nil {
					t.Fatal(err)
				}
				url = "redis://nofcall:pw@" + r.Addr()
			}
			target, err := ParseURL(url)
			if err != nil {
				t.Fatal(err)
			}
			for _, coalesce := range []int{0, 8} {
				b, err := New(context.Background(), Options{Target: target, Coalesce: coalesce, KeyPrefix: fmt.Sprintf("c%d:", coalesce)})
				if err != nil {
					t.Fatal(err)
				}
				defer b.Close()
				if !b.fcall.Load() {
					t.Fatal("the library was not loaded")
				}
				l := backend.Limit{Rate: 2, Period: time.Hour, Burst: 2}
				for i, want := range []bool{true, true, false} {
					ok, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: l, Cost: 1}}, make([]backend.Decision, 1))
					if err != nil || ok != want {
						t.Fatalf("coalesce %d, call %d: admitted=%v err=%v, want admitted=%v", coalesce, i, ok, err, want)
					}
				}
				if b.fcall.Load() || !b.libraryRefused.Load() || !b.Healthy() {
					t.Fatalf("coalesce %d: calls by FCALL %v, library refused %v, healthy %v: want EVALSHA for good, healthy",
						coalesce, b.fcall.Load(), b.libraryRefused.Load(), b.Healthy())
				}
			}
		})
	}
}

// TestLibraryLater: a Redis that cannot take the library when rls starts (out of memory here:
// FUNCTION LOAD is a write, SCRIPT LOAD is not) gets it once it can: decisions go by EVALSHA
// meanwhile, then by FCALL.
func TestLibraryLater(t *testing.T) {
	r := redistest.Start(t)
	ctx := context.Background()
	admin := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	defer admin.Close()
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	b := newURLBackend(t, r.URL())
	if !b.Healthy() || b.fcall.Load() || b.libraryRefused.Load() {
		t.Fatalf("healthy %v, calls by FCALL %v, library refused %v: want healthy, EVALSHA, not refused for good",
			b.Healthy(), b.fcall.Load(), b.libraryRefused.Load())
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	l := backend.Limit{Rate: 1000, Period: time.Hour, Burst: 1000}
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; !b.fcall.Load(); i++ {
		if time.Now().After(deadline) {
			t.Fatal("the library was not loaded within 5s of Redis taking writes again")
		}
		if ok, err := b.Decide(ctx, []backend.Request{{Key: "k", Limit: l, Cost: 1}}, make([]backend.Decision, 1)); err != nil || !ok {
			t.Fatalf("call %d: admitted=%v err=%v", i, ok, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n, err := admin.FunctionList(ctx, goredis.FunctionListQuery{}).Result(); err != nil || len(n) != 1 || n[0].Name != functionName {
		t.Fatalf("libraries %v (err %v), want %s", n, err, functionName)
	}
}

// TestLocalCache: a denied hot key is answered from memory, with no Redis command, until Redis
// would admit it; a smaller cost, another limit or a refund goes to Redis.
func TestLocalCache(t *testing.T) {
	clock := time.Now()
	var mu sync.Mutex
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	advance := func(d time.Duration) { mu.Lock(); clock = clock.Add(d); mu.Unlock() }
	b := newTestBackend(t, singleEnv, Options{LocalCacheSize: 10, Now: now})
	counter := &commandCounter{calls: make(chan string, 1000)}
	b.rdb.AddHook(counter)
	ctx := context.Background()
	l := backend.Limit{Rate: 2, Period: time.Second, Burst: 2} // a slot frees every 500ms
	decide := func(r backend.Request) backend.Decision {
		t.Helper()
		out := make([]backend.Decision, 1)
		if _, err := b.Decide(ctx, []backend.Request{r}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	hot := backend.Request{Key: "hot", Limit: l, Cost: 2}
	if d := decide(hot); !d.Allowed {
		t.Fatalf("first request: %+v, want allowed", d)
	}
	first := decide(hot)
	if first.Allowed {
		t.Fatalf("second request: %+v, want denied", first)
	}
	counter.count()
	for i := range 100 {
		if d := decide(hot); d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > first.RetryAfter {
			t.Fatalf("cached request %d: %+v, want denied within %v", i, d, first.RetryAfter)
		}
	}
	if n := counter.count(); n != 0 {
		t.Fatalf("100 denied requests on a cached key sent %d Redis commands, want 0", n)
	}
	if h := b.CacheHits(); h != 100 {
		t.Fatalf("CacheHits() = %d after 100 cached answers, want 100", h)
	}
	steps := []struct {
		name  string
		req   backend.Request
		calls int
	}{
		{"higher cost, cached", backend.Request{Key: "hot", Limit: l, Cost: 3}, 0},
		{"smaller cost asks Redis", backend.Request{Key: "hot", Limit: l, Cost: 1}, 1},
		{"another limit asks Redis", backend.Request{Key: "hot", Limit: backend.Limit{Rate: 3, Period: time.Second, Burst: 2}, Cost: 2}, 1},
		{"a batch with an uncached key asks Redis", backend.Request{Key: "cold", Limit: l, Cost: 1}, 1},
	}
	for _, s := range steps {
		decide(s.req)
		if n := counter.count(); n != s.calls {
			t.Fatalf("%s: %d Redis commands, want %d", s.name, n, s.calls)
		}
	}
	// Once Redis would admit the key again, the cache no longer answers.
	advance(first.RetryAfter)
	time.Sleep(first.RetryAfter)
	if d := decide(hot); !d.Allowed {
		t.Fatalf("after RetryAfter: %+v, want allowed", d)
	}
	if n := counter.count(); n != 1 {
		t.Fatalf("after RetryAfter: %d Redis commands, want 1", n)
	}
	// A refund forgets the cached denial.
	decide(hot)
	counter.count()
	decide(backend.Request{Key: "hot", Limit: l, Cost: 2, Refund: true})
	if d := decide(hot); !d.Allowed {
		t.Fatalf("after a refund: %+v, want allowed", d)
	}
	if n := counter.count(); n != 2 {
		t.Fatalf("refund and request: %d Redis commands, want 2", n)
	}
}

// TestBreaker: with Redis killed every call fails with ErrUnavailable within the timeout, the
// breaker opens and fails fast; with Redis back (empty) it closes by itself and limits again.
func TestBreaker(t *testing.T) {
	for _, tc := range []struct {
		name     string
		coalesce int
	}{{"direct", 0}, {"coalesced", 16}} {
		t.Run(tc.name, func(t *testing.T) { testBreaker(t, tc.coalesce) })
	}
}

func testBreaker(t *testing.T, coalesce int) {
	r := redistest.Start(t)
	var changes []bool
	var mu sync.Mutex
	target, err := ParseURL("redis://" + r.Addr())
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(context.Background(), Options{Target: target, Timeout: time.Second, Coalesce: coalesce,
		BreakerFailures: 3, BreakerCooldown: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	b.SubscribeHealth(func(h bool) { mu.Lock(); changes = append(changes, h); mu.Unlock() })
	defer b.Close()
	ctx := context.Background()
	l := backend.Limit{Rate: 3, Period: time.Hour, Burst: 3}
	decide := func() (bool, error) {
		out := make([]backend.Decision, 1)
		return b.Decide(ctx, []backend.Request{{Key: "k", Limit: l, Cost: 1}}, out)
	}
	for range 3 {
		if ok, err := decide(); !ok || err != nil {
			t.Fatalf("Redis up: admitted=%v err=%v", ok, err)
		}
	}
	r.Kill()
	for i := range 10 {
		start := time.Now()
		_, err := decide()
		if !errors.Is(err, backend.ErrUnavailable) {
			t.Fatalf("call %d with Redis down: err %v, want ErrUnavailable", i, err)
		}
		if d := time.Since(start); d > 1500*time.Millisecond {
			t.Fatalf("call %d with Redis down took %v, want within the 1s timeout", i, d)
		}
	}
	if b.Healthy() {
		t.Fatal("Healthy after 10 failures, want the breaker open")
	}
	if _, err := decide(); !errors.Is(err, errOpen) {
		t.Fatalf("breaker open: err %v, want %v", err, errOpen)
	}
	r.Start()
	deadline := time.Now().Add(5 * time.Second)
	for !b.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("breaker still open 5s after Redis came back")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Redis came back empty: the key has its full burst again, and is limited again.
	for i := range 4 {
		ok, err := decide()
		if err != nil || ok != (i < 3) {
			t.Fatalf("request %d after recovery: admitted=%v err=%v, want admitted=%v", i, ok, err, i < 3)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(changes) != "[false true]" {
		t.Fatalf("health changes %v, want [false true]", changes)
	}
}

// TestStalledRedis: a Redis that accepts commands but does not answer (stopped with SIGSTOP)
// costs each of many concurrent calls its timeout and no more, coalesced or not, leaves no
// goroutine behind, and once Redis answers again calls succeed.
func TestStalledRedis(t *testing.T) {
	for _, tc := range []struct {
		name     string
		coalesce int
	}{{"direct", 0}, {"coalesced", 4}} {
		t.Run(tc.name, func(t *testing.T) {
			r := redistest.Start(t)
			target, _ := ParseURL("redis://" + r.Addr())
			const timeout = 50 * time.Millisecond
			b, err := New(context.Background(), Options{Target: target, Timeout: timeout, Coalesce: tc.coalesce,
				BreakerFailures: 1 << 20}) // keep calling Redis: the timeouts are under test
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			l := backend.Limit{Rate: 1000, Period: time.Second, Burst: 1000}
			call := func(i int) (time.Duration, error) {
				start := time.Now()
				out := make([]backend.Decision, 1)
				_, err := b.Decide(context.Background(), []backend.Request{{Key: "k" + strconv.Itoa(i), Limit: l, Cost: 1}}, out)
				return time.Since(start), err
			}
			if _, err := call(0); err != nil {
				t.Fatal(err)
			}
			goroutines := runtime.NumGoroutine()
			if err := r.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			var slow, ok atomic.Int64
			for g := range 16 {
				wg.Go(func() {
					for i := range 5 {
						took, err := call(g*10 + i)
						if !errors.Is(err, backend.ErrUnavailable) {
							ok.Add(1)
						}
						if took > timeout+250*time.Millisecond {
							slow.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if err := r.Signal(syscall.SIGCONT); err != nil {
				t.Fatal(err)
			}
			if ok.Load() > 0 || slow.Load() > 0 {
				t.Fatalf("Redis stalled: %d of 80 calls did not fail with ErrUnavailable, %d took longer than %v", ok.Load(), slow.Load(), timeout+250*time.Millisecond)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				if _, err := call(1000); err == nil {
					break
				} else if time.Now().After(deadline) {
					t.Fatalf("Redis answering again, but: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
			for n := runtime.NumGoroutine(); n > goroutines+2; n = runtime.NumGoroutine() {
				if time.Now().After(deadline) {
					t.Fatalf("%d goroutines after the stall, %d before", n, goroutines)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

func TestStartsWithRedisDown(t *testing.T) {
	r := redistest.Start(t)
	r.Kill()
	target, _ := ParseURL("redis://" + r.Addr())
	b, err := New(context.Background(), Options{Target: target, Timeout: 100 * time.Millisecond, BreakerCooldown: 20 * time.Millisecond})
	if err != nil {
		t.Fatalf("New with Redis down: %v, want a backend that waits for Redis", err)
	}
	defer b.Close()
	if b.Healthy() {
		t.Fatal("Healthy with Redis down")
	}
	out := make([]backend.Decision, 1)
	if _, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: backend.Limit{Rate: 1, Period: time.Second, Burst: 1}, Cost: 1}}, out); !errors.Is(err, backend.ErrUnavailable) {
		t.Fatalf("Decide with Redis down: %v, want ErrUnavailable", err)
	}
	r.Start()
	deadline := time.Now().Add(5 * time.Second)
	for !b.Healthy() {
		if time.Now().After(deadline) {
			t.Fatal("not healthy 5s after Redis started")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestParseURL(t *testing.T) {
	for _, tc := range []struct {
		name, url, want string
		user, pass      string
		err             string
	}{
		{name: "single", url: "redis://127.0.0.1:6379", want: "single 127.0.0.1:6379"},
		{name: "single db and auth", url: "redis://u:p%40ss@h:1/2", want: "single h:1 db 2", user: "u", pass: "p@ss"},
		{name: "single tls", url: "rediss://h:6380", want: "single h:6380 tls"},
		{name: "sentinel", url: "redis-sentinel://u:p@s1:26379,s2/mymaster?db=3&sentinel_password=sp", want: "sentinel s1:26379,s2:26379 master mymaster db 3", user: "u", pass: "p"},
		{name: "sentinel db in path", url: "rediss-sentinel://s1/m/4", want: "sentinel s1:26379 master m db 4 tls"},
		{name: "cluster", url: "redis-cluster://a:7000,b:7001,c", want: "cluster a:7000,b:7001,c:6379"},
		{name: "cluster tls auth", url: "rediss-cluster://:secret@a:7000", want: "cluster a:7000 tls", pass: "secret"},
		{name: "no scheme", url: "localhost:6379", err: "no scheme"},
		{name: "unknown scheme", url: "memcached://h", err: `scheme "memcached"`},
		{name: "sentinel without master", url: "redis-sentinel://s1:26379", err: "master name"},
		{name: "cluster with db", url: "redis-cluster://a:7000/1", err: "no databases"},
		{name: "unknown parameter", url: "redis-cluster://a:7000?pool=3", err: `unknown parameter "pool"`},
		{name: "password hidden in errors", url: "redis-cluster://u:hunter2@a:7000/1", err: "u:xxx@"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseURL(tc.url)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || strings.Contains(err.Error(), "hunter2") {
					t.Fatalf("ParseURL(%q) error %v, want one containing %q and no password", tc.url, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.String() != tc.want || got.Username != tc.user || got.Password != tc.pass {
				t.Fatalf("ParseURL(%q) = %q user %q pass %q, want %q user %q pass %q", tc.url, got, got.Username, got.Password, tc.want, tc.user, tc.pass)
			}
			if strings.Contains(got.String(), "p@ss") || (tc.pass != "" && strings.Contains(got.String(), tc.pass)) {
				t.Fatalf("String() %q shows the password", got)
			}
		})
	}
}

func TestStoredKey(t *testing.T) {
	long := strings.Repeat("v", maxRawKey+1)
	for _, tc := range []struct{ name, key, want string }{
		{"plain", "7:example6:api_key3:abc#0", "rls:7:example6:api_key3:abc#0"},
		{"hash tag neutralised", "3:a{b}", "rls:{}3:a{b}"},
		{"long", long, "rls:sha256:"},
		{"looks hashed", "sha256:x", "rls:sha256:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := storedKey("rls:", tc.key)
			if !strings.HasPrefix(got, tc.want) || (!strings.HasSuffix(tc.want, ":") && got != tc.want) {
				t.Fatalf("storedKey(%q) = %q, want %q", tc.key, got, tc.want)
			}
			if len(got) > len("rls:")+maxRawKey+2 {
				t.Fatalf("storedKey(%q) is %d bytes long", tc.key, len(got))
			}
		})
	}
	if storedKey("", long) == storedKey("", long+"x") || storedKey("", "sha256:x") == storedKey("", "sha256:y") {
		t.Fatal("distinct long keys stored alike")
	}
}

func TestSlot(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"123456789", 0x31C3 % slotCount},
		{"foo", 12182},
		{"bar", 5061},
	} {
		if got := slot(tc.key); got != tc.want {
			t.Errorf("slot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
	b := newTestBackend(t, clusterEnv, Options{})
	for _, key := range []string{"foo", "{user1000}.following", "foo{}{bar}", "{}3:a{b}", "rls:{}x{y}z", "a{b"} {
		want, err := b.rdb.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got := slot(key); got != int(want) {
			t.Errorf("slot(%q) = %d, Redis says %d", key, got, want)
		}
	}
}

// TestLocalCacheDroppedWhenCharged: a cached denial is dropped once a smaller request on the
// key is admitted, so the next denial reports what remains now, not what remained then.
func TestLocalCacheDroppedWhenCharged(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{LocalCacheSize: 10})
	l := backend.Limit{Rate: 10, Period: time.Hour, Burst: 10}
	decide := func(cost int64) backend.Decision {
		t.Helper()
		out := make([]backend.Decision, 1)
		if _, err := b.Decide(context.Background(), []backend.Request{{Key: "k", Limit: l, Cost: cost}}, out); err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	for _, step := range []struct {
		cost      int64
		allowed   bool
		remaining int64
	}{{8, true, 2}, {5, false, 2}, {1, true, 1}, {5, false, 1}} {
		if d := decide(step.cost); d.Allowed != step.allowed || d.Remaining != step.remaining {
			t.Fatalf("cost %d: %+v, want allowed=%v remaining %d", step.cost, d, step.allowed, step.remaining)
		}
	}
	if h := b.CacheHits(); h != 0 {
		t.Fatalf("%d answers from the cache, want 0 (the denial was dropped when the key was charged)", h)
	}
}

// TestParseURLRefusesAddresses: an address that can never be dialed is refused at parse time,
// naming it and why, where it used to be accepted and the breaker then stayed open for ever.
func TestParseURLRefusesAddresses(t *testing.T) {
	for _, tc := range []struct{ url, err string }{
		{"redis://127.0.0.1:99999", `port "99999": want a number from 1 to 65535`},
		{"redis://127.0.0.1:0", `port "0"`},
		{"redis://127.0.0.1:abc", `invalid port ":abc"`},
		{"redis://:6379", "no host"},
		{"redis://", "no host"},
		{"rediss://u:hunter2@:6380", "no host"},
		{"redis-cluster://a:7000,b:99999", `address "b:99999": port "99999"`},
		{"redis-cluster://a:7000,:7001", `address ":7001": no host`},
		{"redis-cluster://a:x", `address "a:x": port "x"`},
		{"redis-sentinel://s1:26379,s2:65536/m", `address "s2:65536"`},
		{"redis-sentinel://::1/m", `address "::1": want host:port`},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := ParseURL(tc.url)
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "redis url") {
				t.Fatalf("ParseURL(%q): %v, want an error containing %q", tc.url, err, tc.err)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
	for _, ok := range []string{"redis://[::1]:6379", "redis://h", "redis-cluster://[::1]:7000,h:65535", "unix:///run/redis.sock", "redis-sentinel://s1/m"} {
		if _, err := ParseURL(ok); err != nil {
			t.Errorf("ParseURL(%q): %v", ok, err)
		}
	}
}

// TestParseURLHidesPasswords: no error of any URL form, valid or not, shows a password or any
// part of one, nor RedactURL's display of it.
func TestParseURLHidesPasswords(t *testing.T) {
	const pw = "Hunter2pw" // found whole; each case also checks its own fragments
	for _, tc := range []struct {
		url    string
		secret []string // what must not appear, besides pw
	}{
		{"redis://u:" + pw + "@h:99999", nil},
		{"redis://u:" + pw + "@h:abc", nil},
		{"rediss://:" + pw + "@h:1/x", nil},
		{"redis://" + pw + "@h:1?bad_option=1", nil},
		{"redis://u:" + pw + "%zz@h:1", []string{"%zz"}},
		{"redis://u:pa#" + pw + "@h:1", []string{"pa#"}},
		{"redis://u:pa?" + pw + "@h:1", []string{"pa?"}},
		{"redis://u:p a" + pw + "@h:1", []string{"p a"}},
		{"unix://u:" + pw + "@/run/r.sock?db=x", nil},
		{"unix://u:" + pw + "@", nil},
		{"redis-sentinel://u:" + pw + "@s1:26379/m?sentinel_password=" + pw + "&x=1", nil},
		{"redis-sentinel://s1:26379/m?sentinel_password=" + pw + "%zz", []string{"%zz"}},
		{"redis-sentinel://s1:26379?sentinel_password=" + pw, nil},
		{"redis-sentinel://s1:99999/m?sentinel_password=a@" + pw, nil},
		{"redis-sentinel://u:" + pw + "%zz@s1:26379/m", []string{"%zz"}},
		{"redis-cluster://u:" + pw + "@a:7000/1", nil},
		{"redis-cluster://u:p%" + pw + "@a:7000", []string{"p%"}},
		{"rediss-cluster://:" + pw + "@a:x", nil},
		{"u:" + pw + "@h:6379", nil},
		{"memcached://u:" + pw + "@h", nil},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := ParseURL(tc.url)
			if err == nil {
				t.Fatalf("ParseURL(%q) accepted it", tc.url)
			}
			for _, s := range append([]string{pw, strings.ToLower(pw)}, tc.secret...) {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error shows %q: %v", s, err)
				}
				if shown := RedactURL(tc.url); strings.Contains(shown, s) {
					t.Errorf("RedactURL shows %q: %s", s, shown)
				}
			}
		})
	}
}

// A key longer than maxCachedKeyBytes is never cached, so that the cache's count bound also
// bounds its memory: a client's keys can be as long as its request.
func TestLocalCacheSkipsLongKeys(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{LocalCacheSize: 10})
	counter := &commandCounter{calls: make(chan string, 1000)}
	b.rdb.AddHook(counter)
	l := backend.Limit{Rate: 1, Period: time.Hour, Burst: 1}
	for _, tc := range []struct {
		key   string
		calls int
	}{{strings.Repeat("k", maxCachedKeyBytes), 0}, {strings.Repeat("k", maxCachedKeyBytes+1), 5}} {
		r := backend.Request{Key: tc.key, Limit: l, Cost: 1}
		out := make([]backend.Decision, 1)
		for range 2 {
			if _, err := b.Decide(context.Background(), []backend.Request{r}, out); err != nil {
				t.Fatal(err)
			}
		}
		counter.count()
		for range 5 {
			if _, err := b.Decide(context.Background(), []backend.Request{r}, out); err != nil || out[0].Allowed {
				t.Fatalf("%d-byte key: %+v %v, want denied", len(tc.key), out[0], err)
			}
		}
		if n := counter.count(); n != tc.calls {
			t.Fatalf("5 denied requests on a %d-byte key sent %d Redis commands, want %d", len(tc.key), n, tc.calls)
		}
	}
}
