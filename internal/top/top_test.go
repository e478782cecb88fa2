package top

import (
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/rls-project/rls/internal/statekey"
)

// backendKey encodes a descriptor as the service's keys are: statekey fields, '#', the tag.
func backendKey(domain, tag string, kv ...string) string {
	b := statekey.AppendField(nil, domain)
	for _, f := range kv {
		b = statekey.AppendField(b, f)
	}
	return string(append(append(b, '#'), tag...))
}

func TestKeyText(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ key, want string }{
		{backendKey("d", "0", "user", "u1"), "user=u1"},
		{backendKey("d", "per_minute", "api", "k#1", "model", "m:2"), "api=k#1,model=m:2"},
		{backendKey("d", "1s/gcra", "a", "x,y=z%"), "a=x%2Cy%3Dz%25"},
		{backendKey("d#1", "0", "1:2", "#0"), "1:2=#0"},
		{string(statekey.AppendField(append(statekey.AppendField(statekey.AppendField(nil, "d"), "ip"), '*'), "10.*")) + "#0", "ip=*10.*"},
		{backendKey("d", "0", "k", strings.Repeat("é", 100)), "k=" + strings.Repeat("é", 63) + "…"},
	} {
		ident := keyIdentity(c.key)
		if !strings.HasPrefix(c.key, ident) || c.key[len(ident)] != '#' {
			t.Errorf("keyIdentity(%q) = %q: want the key up to its tag", c.key, ident)
		}
		if got := descriptorText(ident, false); got != c.want {
			t.Errorf("descriptorText(%q) = %q, want %q", ident, got, c.want)
		}
	}
	// A counter keeps the first bytes of a long key, and renders them cut, whole characters.
	for _, v := range []string{strings.Repeat("é", 100), "x" + strings.Repeat("é", 100), strings.Repeat("€", 60)} {
		var c counter
		c.setIdent(keyIdentity(backendKey("domain", "0", "k", v)))
		got := c.text()
		if !c.cut || !utf8.ValidString(got) || !strings.HasSuffix(got, "…") || !strings.HasPrefix("k="+v, strings.TrimSuffix(got, "…")) || len(got) < 100 {
			t.Errorf("a counter of k=%s renders %q", v, got)
		}
	}
	// Every limit of a rule counts the descriptor as one key.
	if keyIdentity(backendKey("d", "0", "u", "1")) != keyIdentity(backendKey("d", "per#day", "u", "1")) {
		t.Error("the tag changes the identity")
	}
}

// zipfStream returns n draws of keys 0..keys-1 under a Zipf law of exponent s, and their exact counts.
func zipfStream(seed uint64, n, keys int, s float64) ([]uint64, map[uint64]int64) {
	z := rand.NewZipf(rand.New(rand.NewPCG(seed, seed)), s, 1, uint64(keys-1))
	out := make([]uint64, n)
	exact := map[uint64]int64{}
	for i := range out {
		out[i] = z.Uint64()
		exact[out[i]]++
	}
	return out, exact
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// TestZipfAccuracy: under a Zipf stream over 1M keys spread across the slots of both windows,
// the true top 10 keys by hits and by denials are all reported, every key's counts are within
// its stated error of the exact counts, and that error within hits / counters.
func TestZipfAccuracy(t *testing.T) {
	t.Parallel()
	const n, keys, limit = 100_000, 1_000_000, 50
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 5, 0, time.UTC)}
	tp := New(Config{Keys: 64, MaxBytes: DefaultMaxBytes, Now: clock.Now})
	stream, _ := zipfStream(1, n, keys, 1.1)
	hits := map[uint64]int64{}
	denials := map[uint64]int64{}
	for i, k := range stream {
		if i%(n/50) == 0 && i > 0 {
			clock.Add(time.Second) // 50 s in all: every draw is in both windows
		}
		hits[k]++
		denied := hits[k] > limit // a fixed budget per key: the heaviest are denied most
		if denied {
			denials[k]++
		}
		v := strconv.FormatUint(k, 10)
		tp.Observe(clock.Now(), &Observation{Domain: "d", Rule: "user", Key: backendKey("d", "0", "user", v),
			Cost: 1, Denied: denied, Remaining: max(limit-hits[k], 0), Limit: limit})
	}
	for _, w := range []string{"1m", "10m"} {
		for _, byHits := range []bool{false, true} {
			rep := tp.Report(Query{Window: Windows[w], ByHits: byHits, Keys: 64})
			if len(rep.Rules) != 1 || rep.Rules[0].Hits != n {
				t.Fatalf("%s: %+v: want one rule with %d hits", w, rep.Rules, n)
			}
			r := rep.Rules[0]
			if r.MaxError > int64(n/64) {
				t.Errorf("%s: max error %d past hits/counters %d", w, r.MaxError, n/64)
			}
			got := map[uint64]KeyReport{}
			for _, k := range r.Keys {
				id, err := strconv.ParseUint(strings.TrimPrefix(k.Descriptor, "user="), 10, 64)
				if err != nil {
					t.Fatal(err)
				}
				got[id] = k
				if k.Error > r.MaxError {
					t.Errorf("%s %s: error %d past the rule's %d", w, k.Descriptor, k.Error, r.MaxError)
				}
				if d := hits[id] - k.Hits; d > k.Error || -d > k.Error {
					t.Errorf("%s %s: %d hits reported, %d true, error %d", w, k.Descriptor, k.Hits, hits[id], k.Error)
				}
				if k.Denials > denials[id] || denials[id] > k.Denials+k.Error {
					t.Errorf("%s %s: %d denials reported, %d true, error %d", w, k.Descriptor, k.Denials, denials[id], k.Error)
				}
			}
			exact := hits
			if !byHits {
				exact = denials
			}
			for _, id := range topN(exact, 10) {
				if _, ok := got[id]; !ok {
					t.Errorf("%s by hits %v: key %d (%d) of the true top 10 not reported", w, byHits, id, exact[id])
				}
			}
		}
	}
}

func topN(counts map[uint64]int64, n int) []uint64 {
	ids := make([]uint64, 0, len(counts))
	for id := range counts {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b uint64) int { return int(counts[b] - counts[a]) })
	return ids[:n]
}

// TestWindowsSlide: hits leave the last minute after 60–70 s and the last ten minutes after
// 10–11 min.
func TestWindowsSlide(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	tp := New(Config{Keys: 4, MaxBytes: DefaultMaxBytes, Now: clock.Now})
	tp.Observe(clock.Now(), &Observation{Domain: "d", Rule: "r", Key: backendKey("d", "0", "k", "v"), Cost: 3, Denied: true})
	hits := func(w string) int64 {
		rep := tp.Report(Query{Window: Windows[w], Keys: 1})
		if len(rep.Rules) == 0 {
			return 0
		}
		return rep.Rules[0].Keys[0].Hits
	}
	if hits("1m") != 3 || hits("10m") != 3 {
		t.Fatalf("hits %d and %d, want 3 and 3", hits("1m"), hits("10m"))
	}
	clock.Add(69 * time.Second)
	if hits("1m") != 3 {
		t.Fatal("gone from the last minute after 69 s")
	}
	clock.Add(time.Second)
	if hits("1m") != 0 || hits("10m") != 3 {
		t.Fatalf("after 70 s: %d and %d, want 0 and 3", hits("1m"), hits("10m"))
	}
	clock.Add(11*time.Minute - 70*time.Second)
	if hits("10m") != 0 {
		t.Fatal("still in the last ten minutes after 11 min")
	}
}

// TestMemoryCap: 10M distinct keys (200,000 under the race detector) over a few rules grow the
// heap by no more than the configured cap, and rules past it are not counted.
func TestMemoryCap(t *testing.T) {
	n := 10_000_000
	if raceEnabled {
		n = 200_000 // the race detector makes each observation some 20 times slower
	}
	const keys = 64
	capBytes := 3 * RuleBytes(keys) // room for three rules of the four
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tp := New(Config{Keys: keys, MaxBytes: capBytes})
	now := time.Now()
	// Values of 10 bytes, and one in eight of 140 (whose texts are cut), their digits rewritten
	// in place.
	var obs [2]Observation
	var digits [2][]byte
	for j, l := range []int{10, 140} {
		key := statekey.AppendField(statekey.AppendField(nil, "d"), "user")
		key = statekey.AppendField(key, strings.Repeat("0", l))
		digits[j] = key[len(key)-10:]
		key = append(key, "#0"...)
		obs[j] = Observation{Domain: "d", Cost: 1, Key: unsafe.String(&key[0], len(key))}
	}
	rules := []string{"r0", "r1", "r2", "r3"}
	for i := range n {
		if i%100_000 == 0 {
			now = now.Add(time.Second) // through every slot of both rings
		}
		j := 0
		if i%8 == 0 {
			j = 1
		}
		o := &obs[j]
		o.Rule = rules[i%4]
		for d, v := len(digits[j])-1, i; d >= 0 && v > 0; d, v = d-1, v/10 {
			digits[j][d] = byte('0' + v%10)
		}
		tp.Observe(now, o)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d distinct keys: heap grew %d bytes, cap %d", n, grown, capBytes)
	if grown > capBytes {
		t.Errorf("heap grew %d bytes, past the cap of %d", grown, capBytes)
	}
	rep := tp.Report(Query{Window: Windows["10m"], Keys: keys})
	if len(rep.Rules) != 3 || rep.Untracked != int64(n/4) {
		t.Errorf("%d rules counted, %d hits untracked: want 3 and %d", len(rep.Rules), rep.Untracked, n/4)
	}
	runtime.KeepAlive(tp)
}

// TestIdleRulesMakeRoom: a rule idle for the long window gives its reservation to a new one.
func TestIdleRulesMakeRoom(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	tp := New(Config{Keys: 8, MaxBytes: RuleBytes(8), Now: clock.Now})
	now := clock.Now()
	o := &Observation{Domain: "d", Rule: "a", Key: backendKey("d", "0", "k", "v")}
	tp.Observe(now, o)
	o.Rule = "b"
	tp.Observe(now.Add(time.Minute), o)
	if tp.untracked.Load() != 1 {
		t.Fatal("a second rule was counted past the cap")
	}
	clock.Add(12 * time.Minute)
	tp.Observe(clock.Now(), o)
	rep := tp.Report(Query{Window: Windows["10m"], Keys: 1})
	if len(rep.Rules) != 1 || rep.Rules[0].Rule != "b" {
		t.Fatalf("rules %+v: want b alone", rep.Rules)
	}
}

// TestConcurrentObserve: observers and readers at once, for the race detector.
func TestConcurrentObserve(t *testing.T) {
	t.Parallel()
	tp := New(Config{Keys: 16, MaxBytes: 3 * RuleBytes(16)})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			o := &Observation{Domain: "d", Cost: 1}
			for i := range 5000 {
				o.Rule = "r" + strconv.Itoa((i+g)%5)
				o.Key = backendKey("d", "0", "k", strconv.Itoa(i%300))
				o.Denied = i%3 == 0
				tp.Observe(time.Now(), o)
			}
		}()
	}
	for range 20 {
		_ = tp.Report(Query{Window: Windows["1m"], Keys: 5})
	}
	wg.Wait()
	rep := tp.Report(Query{Window: Windows["1m"], Keys: 5})
	var total int64
	for _, r := range rep.Rules {
		total += r.Hits
	}
	if total+rep.Untracked != 4*5000 {
		t.Errorf("%d counted and %d untracked, want %d in all", total, rep.Untracked, 4*5000)
	}
}

// TestHandler: /debug/top's parameters, its bounds and its answer.
func TestHandler(t *testing.T) {
	t.Parallel()
	tp := New(Config{Keys: 8, MaxBytes: DefaultMaxBytes})
	for i := range 100 {
		for _, rule := range []string{"a", "b"} {
			tp.Observe(time.Now(), &Observation{Domain: "d", Rule: rule, Key: backendKey("d", "0", "k", strconv.Itoa(i%20)),
				Cost: 1, Denied: i%2 == 0, Remaining: 1, Limit: 10})
		}
	}
	srv := httptest.NewServer(tp.Handler())
	defer srv.Close()
	for _, c := range []struct {
		query string
		code  int
		rules int
		keys  int
	}{
		{"", 200, 2, 8},
		{"?rule=a&sort=hits&window=10m&keys=3", 200, 1, 3},
		{"?keys=1000", 200, 2, 8},
		{"?domain=other", 200, 0, 0},
		{"?window=5m", 400, 0, 0},
		{"?sort=size", 400, 0, 0},
		{"?keys=0", 400, 0, 0},
	} {
		resp, err := http.Get(srv.URL + c.query)
		if err != nil {
			t.Fatal(err)
		}
		var rep Report
		err = json.NewDecoder(resp.Body).Decode(&rep)
		resp.Body.Close()
		if resp.StatusCode != c.code {
			t.Errorf("%s: status %d, want %d", c.query, resp.StatusCode, c.code)
			continue
		}
		if c.code != 200 {
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.query, err)
		}
		if len(rep.Rules) != c.rules {
			t.Errorf("%s: %d rules, want %d", c.query, len(rep.Rules), c.rules)
			continue
		}
		for _, r := range rep.Rules {
			if len(r.Keys) != c.keys {
				t.Errorf("%s: %d keys, want %d", c.query, len(r.Keys), c.keys)
			}
		}
	}
	var nilTop *Top
	rec := httptest.NewRecorder()
	nilTop.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/top", nil))
	if rec.Code != http.StatusNotFound {
		t.Errorf("off: status %d, want 404", rec.Code)
	}
}

// TestPageSelfContained: the page loads nothing from elsewhere.
func TestPageSelfContained(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"http://", "https://", "@import", "src=", "url("} {
		if strings.Contains(string(page), bad) {
			t.Errorf("page.html holds %q: it must load nothing from elsewhere", bad)
		}
	}
	rec := httptest.NewRecorder()
	PageHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/debug/top.html", nil))
	if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("Content-Security-Policy %q", csp)
	}
}

// TestSummaryInvariants: under random weighted adds of keys whose hashes collide in their low
// bits (long probes, removals that move entries back), every counter is found in the index at
// its place, the heap holds, and the counts sum to the total, as space-saving's do.
func TestSummaryInvariants(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 3))
	for _, m := range []int{1, 2, 8, 64} {
		s := newSummary(m)
		s.reset(0)
		for i := range 20_000 {
			h := r.Uint64N(uint64(4*m))<<20 | r.Uint64N(4) // few distinct low bits
			s.add(h, &Observation{Cost: 1 + r.Int64N(3)}, "1:d")
			if i%97 != 0 {
				continue
			}
			var sum int64
			for j := range s.cs {
				c := &s.cs[j]
				sum += c.count
				if p, ok := s.find(c.hash); !ok || s.index[p] != int32(j) {
					t.Fatalf("m=%d: counter %d (hash %x) not found at its place", m, j, c.hash)
				}
				if int(s.heap[c.pos]) != j {
					t.Fatalf("m=%d: counter %d not at its heap place", m, j)
				}
			}
			used := 0
			for _, v := range s.index {
				if v >= 0 {
					used++
				}
			}
			if used != len(s.cs) || sum != s.total {
				t.Fatalf("m=%d: %d places used for %d counters; counts sum to %d, total %d", m, used, len(s.cs), sum, s.total)
			}
			for k := 1; k < len(s.heap); k++ {
				if s.less(k, (k-1)/2) {
					t.Fatalf("m=%d: heap broken at %d", m, k)
				}
			}
		}
	}
}

func BenchmarkObserve(b *testing.B) {
	tp := New(Config{Keys: DefaultKeys, MaxBytes: DefaultMaxBytes})
	stream, _ := zipfStream(2, 1<<16, 1_000_000, 1.1)
	keys := make([]string, len(stream))
	for i, k := range stream {
		keys[i] = backendKey("d", "0", "user", strconv.FormatUint(k, 10))
	}
	now := time.Now()
	o := &Observation{Domain: "d", Rule: "user", Cost: 1}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		o.Key = keys[i&(1<<16-1)]
		tp.Observe(now, o)
	}
}
