package rlqs

import (
	"maps"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/rls-project/rls/internal/descriptors"
)

// TestBucketIDBounds: the largest id Envoy's builders make is accepted; one pair, one key byte
// or one value byte more is refused with the bound named.
func TestBucketIDBounds(t *testing.T) {
	pairs := func(n, key, value int) map[string]string {
		m := map[string]string{}
		for i := range n {
			k := string(rune('a'+i)) + strings.Repeat("k", key-1)
			m[k] = strings.Repeat("v", value)
		}
		return m
	}
	if _, err := parseBucketID(pairs(8, 128, 512)); err != nil {
		t.Errorf("8 pairs of 128-byte keys and 512-byte values: %v", err)
	}
	for _, tc := range []struct {
		name string
		m    map[string]string
		want string
	}{
		{"9 pairs", pairs(9, 1, 1), "9 pairs, more than 8"},
		{"129-byte key", pairs(1, 129, 1), "key longer than 128 bytes"},
		{"513-byte value", pairs(1, 1, 513), "value longer than 512 bytes"},
	} {
		if _, err := parseBucketID(tc.m); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", tc.name, err, tc.want)
		}
	}
}

// TestKeyEntries: a key reads back as its domain and pairs, whatever they hold, each a part of
// the key; the BucketId sent is the one reported.
func TestKeyEntries(t *testing.T) {
	for _, m := range []map[string]string{
		{"k": "v"},
		{"a|1:b=2": "=|:", "": "x", "z": ""},
		{"api_key": strings.Repeat("é", 100), "ip": "10.0.0.1"},
	} {
		id := make(bucketID, 0, len(m))
		for k, v := range m {
			id = append(id, descriptors.Entry{Key: k, Value: v})
		}
		slices.SortFunc(id, func(a, b descriptors.Entry) int { return strings.Compare(a.Key, b.Key) })
		key := id.key("dom|1:x")
		domain, got, ok := entries(key)
		if !ok || domain != "dom|1:x" || !slices.Equal(got, id) {
			t.Errorf("%q read back as %q %v %v", key, domain, got, ok)
		}
		if pm := bucketProto(key).GetBucket(); !maps.Equal(pm, m) {
			t.Errorf("BucketId of %q: %v, want %v", key, pm, m)
		}
	}
	for _, bad := range []string{"", "x", "3:ab", "1:a|1:k", "1:a|1:k=5:v", "1:a1:k=1:v"} {
		if _, _, ok := entries(bad); ok {
			t.Errorf("%q read as a key", bad)
		}
	}
}

// TestRedisKeyDigest: a bucket's Redis key holds no client text and no hash tag, and two ids
// have two keys.
func TestRedisKeyDigest(t *testing.T) {
	r := &Redis{prefix: "p:"}
	a := bucketID{{Key: "api_key", Value: "secret-123{x}"}}.key("d")
	b := bucketID{{Key: "api_key", Value: "secret-124{x}"}}.key("d")
	ka, kb := r.key(a), r.key(b)
	for _, k := range []string{ka, kb} {
		if strings.Contains(k, "secret") || strings.ContainsAny(k, "{}") || !strings.HasPrefix(k, "p:rlqs:") || len(k) != len("p:rlqs:")+2*digestSize {
			t.Errorf("key %q: want p:rlqs: and a hex digest only", k)
		}
	}
	if ka == kb {
		t.Errorf("two ids, one key %q", ka)
	}
}

// TestTargetsByIdentity: the streams of one identity ("identity/stream" ids) are one proxy:
// they share one max-min fair part, whatever their number; ids without an identity are a
// proxy each, as before.
func TestTargetsByIdentity(t *testing.T) {
	lim := Budget{Rate: 1000, PeriodMs: 1000, Burst: 100} // capacity 969
	b := newBucketState()
	for _, id := range []string{"ca/1", "ca/2", "ca/3", "ca/4", "r-1"} {
		b.proxies[id] = &proxyState{Demand: 2000, SeenUntil: 10}
	}
	got := b.targets(lim, 0)
	a := got["ca/1"] + got["ca/2"] + got["ca/3"] + got["ca/4"]
	if a != 485 || got["r-1"] != 484 {
		t.Errorf("identity ca's four streams %d, r-1 %d (%v), want 485 and 484", a, got["r-1"], got)
	}
	// A stream of the identity that wants little keeps what it wants; its siblings split the rest.
	b.proxies["ca/1"].Demand = 10
	got = b.targets(lim, 0)
	if got["ca/1"] != 11 || got["ca/2"]+got["ca/3"]+got["ca/4"] != 485-11 {
		t.Errorf("with ca/1 wanting 10/s: %v", got)
	}
	// Without identities the division is the flat one.
	flat := newBucketState()
	for _, id := range []string{"r-1", "r-2", "r-3"} {
		flat.proxies[id] = &proxyState{Demand: 2000, SeenUntil: 10}
	}
	if got := flat.targets(lim, 0); got["r-1"]+got["r-2"]+got["r-3"] != 969 || got["r-3"] != 323 {
		t.Errorf("three proxies without identities: %v, want 969 split evenly", got)
	}
}

// TestMaxProxies: a bucket at Budget.MaxProxies refuses a new proxy, recording nothing, and goes
// on deciding for the proxies it has.
func TestMaxProxies(t *testing.T) {
	m := NewMemory()
	lim := Budget{Rate: 100, PeriodMs: 1000, Burst: 10, MaxProxies: 2}
	seen := Seen{Demand: 10, Until: 5000, Report: true}
	for _, p := range []string{"a", "b"} {
		if d, _ := m.Assign(t.Context(), "k", p, lim, seen, 1, 3000); d.Refused {
			t.Fatalf("proxy %s refused", p)
		}
	}
	if d, _ := m.Assign(t.Context(), "k", "c", lim, seen, 2, 3000); !d.Refused {
		t.Errorf("a third proxy: %+v, want refused", d)
	}
	if st, _ := m.Peek(t.Context(), "k"); len(st) != 2 {
		t.Errorf("the bucket counts %v, want a and b", sortedIDs(st))
	}
	if d, _ := m.Assign(t.Context(), "k", "a", lim, seen, 3, 3000); d.Refused {
		t.Error("a proxy it has was refused")
	}
}

// TestDemandEstimate: reports of 1 or 2 requests every 300 ms (a proxy at 5/s) are seen as 5/s,
// not 3.3 and 6.7 by turns; a shift of demand is taken whole at its first report.
func TestDemandEstimate(t *testing.T) {
	var w demandWindow
	var got float64
	for i := range 40 {
		got = w.estimate(float64(1+i%2), 0.3)
	}
	if got < 4.8 || got > 5.2 {
		t.Errorf("1 and 2 requests by turns every 300 ms: %.2f/s, want 5", got)
	}
	for range 20 {
		w.estimate(286, 0.3)
	}
	if got := w.estimate(6, 0.3); got != 20 {
		t.Errorf("955/s, then 6 requests in 300 ms: %.1f/s, want 20 at once", got)
	}
	if got := w.estimate(286, 0.3); math.Abs(got-286/0.3) > 1e-9 {
		t.Errorf("20/s, then 286 requests in 300 ms: %.1f/s, want 953 at once", got)
	}
}

// TestDecisionSettledOver: a proxy alone at its target is settled (ticks may leave it be); a
// proxy joining a bucket another holds whole is left waiting and names the holder as over its
// target, to be woken; once the holder has given back, both hold their targets, and neither
// settles while they divide the bucket.
func TestDecisionSettledOver(t *testing.T) {
	lim := Budget{Rate: 960, PeriodMs: 1000, Burst: 192}
	const ttl = 1000
	b := newBucketState()
	report := func(id string, now int64) Decision {
		b.advance(lim, now)
		b.prune(now)
		p := b.proxy(id)
		p.Demand, p.SeenUntil = 2000, now+ttl
		return b.decide(id, lim, now, ttl, true)
	}
	if d := report("a", 0); !d.Settled || d.Target != 930 || len(d.Over) != 0 {
		t.Fatalf("a alone: %+v, want settled at 930", d)
	}
	if d := report("b", 10); d.Settled || d.Share.Rate != 0 || !slices.Equal(d.Over, []string{"a"}) {
		t.Fatalf("b joining: %+v, want waiting with a over its target", d)
	}
	b.advance(lim, 20)
	if d := b.decide("a", lim, 20, ttl, false); d.Settled || d.Share.Rate != 465 || !slices.Equal(d.Waiting, []string{"b"}) {
		t.Fatalf("a woken: %+v, want 465 and b waiting (not settled: two proxies divide the bucket)", d)
	}
	if d := b.decide("b", lim, 30, ttl, false); d.Settled || d.Share.Rate != 465 || len(d.Over) != 0 {
		t.Fatalf("b woken: %+v, want 465, nobody over", d)
	}
}

// TestMemoryMaxKept: buckets whose streams ended keep their spent budgets (a monthly limit's for
// days), but no more of them than maxKept: past it a sweep forgets those nobody holds.
func TestMemoryMaxKept(t *testing.T) {
	m := NewMemory()
	m.maxKept = 2
	lim := Budget{Rate: 1000, PeriodMs: 30 * 24 * 3600 * 1000, Burst: 1000} // a month
	for i := range 5 {
		k := bucketID{{Key: "k", Value: string(rune('a' + i))}}.key("d")
		if _, err := m.Assign(t.Context(), k, "p", lim, Seen{Demand: 1, Until: 2000, Report: true}, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		if err := m.Leave(t.Context(), k, "p", 1500); err != nil {
			t.Fatal(err)
		}
	}
	m.Sweep(1500) // the proxies still hold their shares: nothing to forget
	if n := m.Len(); n != 5 {
		t.Fatalf("%d buckets kept while their shares are held, want 5", n)
	}
	m.Sweep(5000) // holds ended, budgets still refilling for weeks
	if n := m.Len(); n != 2 {
		t.Errorf("%d buckets kept after the holds ended, want maxKept (2)", n)
	}
}

// TestDemandFallFollowed: a proxy at 270/s whose demand falls to 20/s in the middle of a
// report is seen at 20/s by the report after the straddling one, not decayed towards it over
// several as when the straddling report was averaged in.
func TestDemandFallFollowed(t *testing.T) {
	var w demandWindow
	for range 20 {
		w.estimate(81, 0.3) // 270/s
	}
	w.estimate(20, 0.3) // straddles the fall
	if got := w.estimate(6, 0.3); got != 20 {
		t.Fatalf("the first report all after the fall: %.1f/s, want 20", got)
	}
	if got := w.estimate(6, 0.3); got != 20 {
		t.Fatalf("the next: %.1f/s, want 20", got)
	}
}
