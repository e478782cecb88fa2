package replay_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/replay"
	"github.com/rls-project/rls/internal/replay/replaytest"
	"github.com/rls-project/rls/internal/service"
)

// randomRules is a rule set of every kind of limit and option replay must decide as the
// service does: the four algorithms, rate_limits lists, replaces, shadow and quota mode, a
// wildcard with share_threshold, nesting and an unlimited rule, with random rates.
func randomRules(t testing.TB, rng *rand.Rand) *descriptors.RuleSet {
	t.Helper()
	algs := []string{"gcra", "fixed_window", "sliding_window", "sliding_log"}
	r := func() int { return rng.IntN(6) }
	b := func() bool { return rng.IntN(2) == 0 }
	yaml := fmt.Sprintf(`
domain: d
descriptors:
  - key: a
    shadow_mode: %v
    rate_limit: {unit: second, requests_per_unit: %d, burst: %d}
  - key: a
    value: x
    rate_limits:
      - {name: fast, unit: second, requests_per_unit: %d, algorithm: %s}
      - {name: slow, unit: minute, requests_per_unit: %d, algorithm: %s}
  - key: b
    quota_mode: %v
    rate_limit: {unit: second, requests_per_unit: %d, algorithm: %s}
  - key: c
    quota_mode: %v
    rate_limit: {unit: second, unit_multiplier: 3, requests_per_unit: %d, algorithm: sliding_log}
  - key: w
    value: "p*"
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: %d, algorithm: fixed_window}
  - key: r
    rate_limit: {name: big, unit: second, requests_per_unit: %d, replaces: [{name: fast}]}
  - key: n
    descriptors:
      - key: m
        rate_limit: {unit: second, requests_per_unit: %d, algorithm: sliding_window}
  - key: u
    rate_limit: {unlimited: true}
`, b(), r()+1, r()+1, r(), algs[rng.IntN(4)], r()*5+1, algs[rng.IntN(4)], b(), r()+1, algs[rng.IntN(4)], b(), r()+1, r()+1, r()+3, r()+1)
	rs, err := descriptors.Parse(map[string][]byte{"r.yaml": []byte(yaml)})
	if err != nil {
		t.Fatalf("%v\n%s", err, yaml)
	}
	return rs
}

// randomRequest draws a request of one to three descriptors at now.
func randomRequest(rng *rand.Rand, now int64) *replay.Request {
	pool := [][]descriptors.Entry{
		{{Key: "a", Value: "1"}}, {{Key: "a", Value: "2"}}, {{Key: "a", Value: "x"}}, {{Key: "b", Value: "1"}},
		{{Key: "c", Value: "1"}}, {{Key: "w", Value: "p1"}}, {{Key: "w", Value: "p2"}}, {{Key: "w", Value: "q"}},
		{{Key: "r", Value: "1"}}, {{Key: "n", Value: "1"}, {Key: "m", Value: "2"}}, {{Key: "u", Value: "1"}},
		{{Key: "none", Value: "1"}},
	}
	req := &replay.Request{Time: now, Domain: "d"}
	for range 1 + rng.IntN(3) {
		d := replay.Desc{Entries: pool[rng.IntN(len(pool))], Hits: 1}
		switch rng.IntN(10) {
		case 0:
			d.Hits = 0
		case 1:
			d.Hits = int64(2 + rng.IntN(3))
		case 2:
			d.Refund = true
		}
		req.Descs = append(req.Descs, d)
	}
	return req
}

// TestReplayEqualsDecideBatch is the property: over random rule sets and random streams of
// requests, replay's Engine answers every request as the service does when its store is
// backend.DecideBatch and nothing else (pure), deciding at the same times. So replay's
// translation (matching, keys, replaces, modes, costs) is the service's, and its decisions
// DecideBatch's.
func TestReplayEqualsDecideBatch(t *testing.T) {
	t.Parallel()
	for seed := range uint64(24) {
		rng := rand.New(rand.NewPCG(seed, 38))
		rs := randomRules(t, rng)
		p := replaytest.NewPure()
		svc, err := service.New(rs, service.Options{Backend: p})
		if err != nil {
			t.Fatal(err)
		}
		e := replay.NewEngine(rs, replay.Options{})
		now := time.Date(2026, 12, 3, 18, 0, 0, 0, time.UTC).UnixMicro() + rng.Int64N(1e6)
		for i := range 300 {
			if rng.IntN(3) > 0 {
				now += rng.Int64N(400_000)
			}
			req := randomRequest(rng, now)
			p.Now = now
			resp, err := svc.ShouldRateLimit(context.Background(), replaytest.ToProto(req))
			if err != nil {
				t.Fatal(err)
			}
			admitted, items, err := e.Decide(req)
			if err != nil {
				t.Fatal(err)
			}
			replaytest.SameAnswer(t, fmt.Sprintf("seed %d, request %d %+v", seed, i, req.Descs), admitted, items, resp)
		}
		if e.Keys() != len(p.States) {
			t.Fatalf("seed %d: replay holds %d keys, the store %d", seed, e.Keys(), len(p.States))
		}
	}
}
