package replay

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/descriptors"
)

// TestKeyCountsBounds: exact while no more keys than counters were denied; past that, m
// counters whatever the keys, every key denied more than total/m times among them, and every
// count within its own bounds (Denied - Over <= true <= Denied) and high by at most total/m.
func TestKeyCountsBounds(t *testing.T) {
	rng := rand.New(rand.NewPCG(35, 1))
	const m = 64
	c := newKeyCounts(m)
	exact := map[string]int64{}
	for i := range 1000 {
		k := fmt.Sprintf("k%d", i%m)
		c.add(k)
		exact[k]++
	}
	for _, kc := range c.top(m) {
		if kc.Over != 0 || kc.Denied != exact[kc.Key] {
			t.Fatalf("%d keys in %d counters: %+v, want exactly %d", len(exact), m, kc, exact[kc.Key])
		}
	}
	// A skewed stream of 100,000 keys.
	z := rand.NewZipf(rng, 1.1, 1, 99_999)
	var total int64 = 1000
	for range 200_000 {
		k := fmt.Sprintf("z%d", z.Uint64())
		c.add(k)
		exact[k]++
		total++
	}
	if len(c.index) != m || len(c.heap) != m {
		t.Fatalf("%d keys indexed, %d counters: want %d", len(c.index), len(c.heap), m)
	}
	listed := map[string]bool{}
	for _, kc := range c.top(m) {
		listed[kc.Key] = true
		if n := exact[kc.Key]; kc.Denied-kc.Over > n || n > kc.Denied || kc.Denied-n > total/m {
			t.Errorf("%s counted %d (over by at most %d), denied %d times (total %d)", kc.Key, kc.Denied, kc.Over, n, total)
		}
	}
	heavy := 0
	for k, n := range exact {
		if n > total/m {
			heavy++
			if !listed[k] {
				t.Errorf("%s denied %d times of %d, more than total/m, is not counted", k, n, total)
			}
		}
	}
	if heavy == 0 {
		t.Fatal("no key heavier than total/m: the stream tests nothing")
	}
}

// TestReplayLongAndWide: a replay over 40 days of logs with 50,000 keys denied holds its
// bounds (the counters, the spans) and reports the same totals as it counted, in at most
// maxBuckets buckets covering every request, and the busiest key first.
func TestReplayLongAndWide(t *testing.T) {
	rs, err := descriptors.Parse(map[string][]byte{"rules.yaml": []byte(`domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
`)})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(rs, Options{})
	run := &Run{Sets: []*Engine{e}, Names: []string{"rules.yaml"}}
	start := time.Date(2026, 10, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	const days, requests = 40, 300_000
	step := int64(days*24*time.Hour/time.Microsecond) / requests
	for i := range requests {
		user := fmt.Sprintf("u%d", i/2%50_000) // twice in a row: the second denied
		if i%10 == 0 {
			user = "busy"
		}
		req := Request{Time: start + int64(i)*step, Domain: "shop", Descs: []Desc{{Entries: []descriptors.Entry{{Key: "user", Value: user}}, Hits: 1}}}
		if err := run.Decide(&req); err != nil {
			t.Fatal(err)
		}
	}
	rep := run.Report()
	if len(rep.Rules) != 1 {
		t.Fatalf("%d rules", len(rep.Rules))
	}
	r := rep.Rules[0]
	se := r.series[0]
	if len(se.spans) > maxSpans || se.width < 2 {
		t.Errorf("the series holds %d spans %d s wide: want at most %d, and wider than a second over %d days", len(se.spans), se.width, maxSpans, days)
	}
	t.Logf("%d requests, %d denied", r.Requests[0], r.Denied[0])
	if n := len(r.keys[0].heap); n != minCounted {
		t.Errorf("%d keys counted, want %d", n, minCounted)
	}
	if len(r.Series[0]) > maxBuckets {
		t.Errorf("%d buckets, want at most %d", len(r.Series[0]), maxBuckets)
	}
	var admitted, denied int64
	for i, b := range r.Series[0] {
		admitted += b.Admitted
		denied += b.Denied
		if i > 0 && b.Start <= r.Series[0][i-1].Start {
			t.Errorf("bucket %d starts at %d, not after the one before", i, b.Start)
		}
	}
	if admitted+denied != r.Requests[0] || denied != r.Denied[0] {
		t.Errorf("the series counts %d admitted and %d denied, the rule %d requests and %d denied", admitted, denied, r.Requests[0], r.Denied[0])
	}
	if first := r.Series[0][0].Start; first > start {
		t.Errorf("the first bucket starts at %d, after the first request (%d)", first, start)
	}
	if top := r.Top[0]; len(top) == 0 || top[0].Key != "user=busy" {
		t.Errorf("top denied keys %v: want user=busy first", top)
	}
}
