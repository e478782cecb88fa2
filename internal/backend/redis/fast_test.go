package redis

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/limit"
)

// TestFastPathMatchesGeneral runs the script and the script without its fast path (FAST_FLAGS
// matching no request) on the same random calls, at the same fixed instant, on two copies of
// the same keys: the same replies, byte for byte, the same stored values and the same expiries.
// The calls are one-key batches, merged as coalescing sends them, mostly of the fast path's
// shape (enforced GCRA charges without overdraft) on keys that hold nothing, a state of their
// limit's terms, of another limit's, the text form, or another algorithm's state, mixed with
// requests of other shapes on the same keys (refunds, quota, overdraft, costs of 0), and with
// thresholds that refuse them. After about half of the rounds one key takes a lease (a charge of
// its cost and the lease's hits, of the fast path's shape) and gives it back a random time
// later, before, while and after time restores its hits: the give-back reads what both paths
// stored and the instant and reset the charge replied, as lease.go does.
func TestFastPathMatchesGeneral(t *testing.T) {
	b := newTestBackend(t, singleEnv, Options{})
	ctx := context.Background()
	generalSource := strings.Replace(scriptSource, fmt.Sprintf("local FAST_FLAGS = %d\n", fastFlags), "local FAST_FLAGS = -1\n", 1)
	if generalSource == scriptSource {
		t.Fatal("the script renders no FAST_FLAGS line to replace")
	}
	now := time.Now().UnixMicro()
	if s := os.Getenv("RLS_TEST_FAST_SEED"); s != "" { // a failed run's seed, to run it again
		var err error
		if now, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatal(err)
		}
	}
	seed := uint64(now)
	t.Logf("seed %d (RLS_TEST_FAST_SEED runs it again)", seed)
	rng := rand.New(rand.NewPCG(35, seed))
	keys := make([]string, 4)
	for i := range keys {
		keys[i] = fmt.Sprintf("fast-%d", i)
	}
	// eval runs args (decideArgs and the like) with the script source.
	eval := func(round int, source string, args []any) string {
		t.Helper()
		args[0], args[1] = "eval", source
		reply, err := b.rdb.Do(ctx, args...).Text()
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		return reply
	}
	// compare checks that both copies of every key hold the same value and expiry, the
	// general path's copy having been written after the fast path's, from start.
	compare := func(round int, phase string, start time.Time) {
		t.Helper()
		between := time.Since(start)
		for _, k := range keys {
			var vals [2]string
			var expiry [2]time.Duration
			for n, copyPrefix := range []string{"a:", "b:"} {
				v, err := b.rdb.Get(ctx, b.prefix+copyPrefix+k).Result()
				if err != nil && err != goredis.Nil {
					t.Fatal(err)
				}
				ttl, err := b.rdb.PExpireTime(ctx, b.prefix+copyPrefix+k).Result()
				if err != nil {
					t.Fatal(err)
				}
				vals[n], expiry[n] = v, ttl
			}
			if vals[0] != vals[1] {
				t.Fatalf("round %d key %s after %s: fast path stored %x, general path %x", round, k, phase, vals[0], vals[1])
			}
			// The same time to live leaves the later copy later by at most the time the
			// round took, never earlier.
			if d := expiry[1] - expiry[0]; d < 0 || d > between+time.Millisecond {
				t.Fatalf("round %d key %s after %s: fast path's expiry %v, general path's %v", round, k, phase, expiry[0], expiry[1])
			}
		}
	}
	fastShaped, leased, givenBack := 0, 0, 0
	for round := range 300 {
		now += rng.Int64N(3_000_000)
		limits := make([]limit.Limit, len(keys))
		var pipe []string // key, value pairs to set on both copies
		for i := range keys {
			limits[i] = randomLimit(rng)
			var v string
			switch rng.IntN(6) {
			case 0: // none
			case 1: // the text form earlier versions stored
				s := randomState(rng, now, limits[i])
				v = fmt.Sprintf("%d %d %d %d", s.TAT, s.Frac, s.Rate, s.Period)
			case 2: // another algorithm's state
				v = encodeState(backend.State{Alg: limit.Algorithm(1 + rng.IntN(3)), TAT: now + 1000, Frac: 1, Rate: 5, Period: 1000, Log: []int64{now - 10, 1}})
			default:
				v = encodeState(randomState(rng, now, limits[i]))
			}
			pipe = append(pipe, keys[i], v)
		}
		start := time.Now() // both copies are written, then called, in order a, b
		for _, copyPrefix := range []string{"a:", "b:"} {
			for i := 0; i < len(pipe); i += 2 {
				k := b.prefix + copyPrefix + pipe[i]
				var err error
				if pipe[i+1] == "" {
					err = b.rdb.Del(ctx, k).Err()
				} else {
					err = b.rdb.Set(ctx, k, pipe[i+1], time.Hour).Err()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		var calls [2][]*call
		for range 1 + rng.IntN(6) {
			k := rng.IntN(len(keys))
			l := limits[k]
			r := backend.Request{Limit: l, Cost: 1 + rng.Int64N(3)}
			switch rng.IntN(8) {
			case 0:
				r.Cost = randomCost(rng, l) // 0 too, and beyond the burst
			case 1:
				r.Refund = true
			case 2:
				r.Mode = backend.Mode(rng.IntN(3))
			case 3:
				r.Limit.Overdraft = true
			case 4:
				r.Limit = randomLimit(rng) // another limit on the same key
			}
			if r.Mode == backend.Enforce && !r.Refund && !r.Limit.Overdraft && r.Limit.ClampCost(r.Cost) >= 1 {
				fastShaped++
			}
			threshold := []int64{0, 0, 0, -1, 1}[rng.IntN(5)]
			for n, copyPrefix := range []string{"a:", "b:"} {
				c := &call{threshold: threshold}
				c.add(b.prefix+copyPrefix+keys[k], &r, now)
				calls[n] = append(calls[n], c)
			}
		}
		var replies [2]string
		for n, source := range []string{scriptSource, generalSource} {
			var args []any
			if len(calls[n]) == 1 {
				args = decideArgs("sha", now, calls[n][0])
			} else {
				args = mergedArgs("sha", now, calls[n])
			}
			replies[n] = eval(round, source, args)
		}
		if replies[0] != replies[1] {
			t.Fatalf("round %d: fast path replied %x\n general path %x", round, replies[0], replies[1])
		}
		compare(round, "the calls", start)

		// A lease on one of the keys, after those charges: its charge (of the fast path's
		// shape), then, some time later, its give-back, which reads what the charges before it
		// and the lease's charge stored, and the instant and reset the charge replied.
		if rng.IntN(2) == 0 {
			continue
		}
		k := rng.IntN(len(keys))
		l := limits[k]
		hits := 1 + rng.Int64N(max(1, min(l.Burst-1, 1000)))
		r := backend.Request{Limit: l, Cost: 1 + hits}
		var charge [2]*call
		for n, source := range []string{scriptSource, generalSource} {
			charge[n] = &call{}
			charge[n].add(b.prefix+[]string{"a:", "b:"}[n]+keys[k], &r, now)
			replies[n] = eval(round, source, decideArgs("sha", now, charge[n]))
		}
		if replies[0] != replies[1] {
			t.Fatalf("round %d: a lease's charge: fast path replied %x\n general path %x", round, replies[0], replies[1])
		}
		compare(round, "a lease's charge", start)
		c := charge[0]
		if err := decodeDecide(replies[0], c); err != nil {
			t.Fatal(err)
		}
		if !c.charged {
			continue
		}
		leased++
		g := leftover{lim: l, hits: hits, expires: c.now + int64(15*time.Second/time.Microsecond)}
		g.heldUntil, _ = (&leases{}).validity(&r, &c.dec[0], c.now)
		// Given back before time restored any of the lease's hits, part of them, or all (up to
		// a year on: the round's instant stays where the script's bounds hold). Half the
		// give-backs come while the lease holds hits still, so that enough of them give back
		// some whatever the seed.
		reset := int64(c.dec[0].ResetAfter / time.Microsecond)
		span := min(2*reset, int64(365*24*time.Hour/time.Microsecond))
		if rng.IntN(2) == 0 {
			span = g.heldUntil - now
		}
		at := now + rng.Int64N(max(1, span))
		for n, source := range []string{scriptSource, generalSource} {
			key := b.prefix + []string{"a:", "b:"}[n] + keys[k]
			args := giveBackArgs("sha", at, []string{key}, appendGiveBack(nil, &g))
			replies[n] = eval(round, source, args)
		}
		if replies[0] != replies[1] {
			t.Fatalf("round %d: a give-back: fast path's keys replied %x\n general path's %x", round, replies[0], replies[1])
		}
		given, _, err := decodeGiven(replies[0], 1)
		if err != nil {
			t.Fatal(err)
		}
		if given[0] > 0 {
			givenBack++
		}
		compare(round, "a give-back", start)
	}
	t.Logf("%d leases charged, %d given back", leased, givenBack)
	if leased < 50 || givenBack < 10 {
		t.Fatalf("only %d leases charged, %d given back", leased, givenBack)
	}
	if fastShaped < 500 {
		t.Fatalf("only %d requests of the fast path's shape", fastShaped)
	}
}

// TestFastPathWritesAKeyOnce: a merged call whose batches all charge one key (a hot key's
// callers coalesced) writes it once, with its last state, on a Redis of the test's own.
func TestFastPathWritesAKeyOnce(t *testing.T) {
	b, _ := newOwnBackend(t, Options{})
	ctx := context.Background()
	// A request an hour: nothing comes back between the call and the check after it.
	l := limit.Limit{Rate: 1, Period: time.Hour, Burst: 1000}
	const n = 20
	calls := make([]*call, n)
	for i := range calls {
		calls[i] = &call{}
		r := backend.Request{Limit: l, Cost: 1}
		calls[i].add(storedKey(b.prefix, "hot"), &r, 0)
	}
	if err := b.rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.rdb.Do(ctx, b.callArgs(mergedArgs(script.Hash(), 0, calls))...).Err(); err != nil {
		t.Fatal(err)
	}
	if got := commandStat(t, b, "calls", "cmdstat_psetex:"); got != 1 {
		t.Errorf("%d batches charging one key: %v PSETEX, want 1", n, got)
	}
	// The state written is the last batch's: one more request finds n charged.
	out := make([]backend.Decision, 1)
	if _, err := b.Decide(ctx, []backend.Request{{Key: "hot", Limit: l, Cost: 1}}, out); err != nil {
		t.Fatal(err)
	}
	if want := l.Burst - n - 1; out[0].Remaining != want {
		t.Errorf("remaining %d after %d charges and one more, want %d", out[0].Remaining, n, want)
	}
}
