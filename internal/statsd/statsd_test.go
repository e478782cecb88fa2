package statsd

import (
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/service"
)

func entries(kv ...string) []*ratelimitv3.RateLimitDescriptor_Entry {
	var es []*ratelimitv3.RateLimitDescriptor_Entry
	for i := 0; i < len(kv); i += 2 {
		es = append(es, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// TestStatsKeys holds the store's keys to envoyproxy/ratelimit's: key_value for a level matched
// by its value, key alone for one matched by its key, values holding '/' (Envoy Gateway's),
// request values only where the rule asks, IPv4 dots and ':' sanitised.
func TestStatsKeys(t *testing.T) {
	for _, tc := range []struct {
		name    string
		rule    *descriptors.Rule
		domain  string
		entries []*ratelimitv3.RateLimitDescriptor_Entry
		want    string
	}{
		{"value", &descriptors.Rule{Domain: "shop", Path: "api_key=k1"}, "shop", entries("api_key", "k1"), "shop.api_key_k1"},
		{"key alone", &descriptors.Rule{Domain: "shop", Path: "api_key"}, "shop", entries("api_key", "anyone"), "shop.api_key"},
		{"two levels", &descriptors.Rule{Domain: "shop", Path: "path=checkout/method"}, "shop", entries("path", "checkout", "method", "GET"), "shop.path_checkout.method"},
		{"envoy gateway", &descriptors.Rule{Domain: "default/eg/http", Path: "httproute/default/backend/rule/0/match/0=httproute/default/backend/rule/0/match/0/rule-0-match-0"},
			"default/eg/http", entries("httproute/default/backend/rule/0/match/0", "httproute/default/backend/rule/0/match/0", "rule-0-match-0", "u1"),
			"default/eg/http.httproute/default/backend/rule/0/match/0_httproute/default/backend/rule/0/match/0.rule-0-match-0"},
		{"wildcard", &descriptors.Rule{Domain: "shop", Path: "path=/api/*"}, "shop", entries("path", "/api/v1"), "shop.path_/api/*"},
		{"detailed", &descriptors.Rule{Domain: "shop", Path: "user", DetailedMetric: true}, "shop", entries("user", "alice"), "shop.user_alice"},
		{"value_to_metric", &descriptors.Rule{Domain: "shop", Path: "path=checkout/user", ValueToMetric: true}, "shop", entries("path", "checkout", "user", "bob"), "shop.path_checkout.user_bob"},
		{"override: keys only", nil, "shop", entries("user", "alice"), "shop.user"},
		{"sanitised", &descriptors.Rule{Domain: "shop", Path: "remote_address", DetailedMetric: true}, "shop", entries("remote_address", "10.0.0.1"), "shop.remote_address_10_0_0_1"},
		{"colon and bar", &descriptors.Rule{Domain: "shop", Path: "k=a:b|c"}, "shop", entries("k", "a:b|c"), "shop.k_a_b_c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := NewStore(0, 0)
			st.Count(service.StatsDecision{Domain: tc.domain, Rule: tc.rule, Entries: tc.entries, Hits: 1, Outcome: service.StatsWithin})
			ss := st.Series()
			if len(ss) != 1 || ss[0].Key != tc.want {
				var keys []string
				for _, s := range ss {
					keys = append(keys, s.Key)
				}
				t.Fatalf("series %q, want %q", keys, tc.want)
			}
		})
	}
}

// TestOutcomesCounted holds the counters to envoyproxy/ratelimit's: every hit in total_hits; an
// admitted one in within_limit, and near_limit too when near; a denied one in over_limit, and
// shadow_mode too in shadow mode.
func TestOutcomesCounted(t *testing.T) {
	st := NewStore(0, 0)
	r := &descriptors.Rule{Domain: "d", Path: "k"}
	for _, c := range []struct {
		hits uint64
		o    service.StatsOutcome
	}{{1, service.StatsWithin}, {2, service.StatsNear}, {3, service.StatsOver}, {4, service.StatsShadow}} {
		st.Count(service.StatsDecision{Domain: "d", Rule: r, Entries: entries("k", "v"), Hits: c.hits, Outcome: c.o})
	}
	s := st.Series()[0]
	want := map[string]uint64{"total_hits": 10, "within_limit": 3, "near_limit": 2, "over_limit": 7, "shadow_mode": 4}
	for n, v := range want {
		if got := s.Value(n); got != v {
			t.Errorf("%s = %d, want %d", n, got, v)
		}
	}
}

// TestSeriesBounded: a detailed_metric rule keeps at most its cap of values, the rest in its
// overflow series; the store at most its bound of series, the rest in one overflow series.
func TestSeriesBounded(t *testing.T) {
	st := NewStore(3, 6)
	r := &descriptors.Rule{Domain: "d", Path: "user", DetailedMetric: true}
	for _, u := range []string{"a", "b", "c", "d", "e", "a"} {
		st.Count(service.StatsDecision{Domain: "d", Rule: r, Entries: entries("user", u), Hits: 1, Outcome: service.StatsWithin})
	}
	var keys []string
	for _, s := range st.Series() {
		keys = append(keys, s.Key)
	}
	if want := []string{"d.user_a", "d.user_b", "d.user_c", "d.user._overflow_"}; !slices.Equal(keys, want) {
		t.Fatalf("series %q, want %q", keys, want)
	}
	if got := st.Series()[3].Value("total_hits"); got != 2 {
		t.Errorf("overflow total_hits = %d, want 2", got)
	}
	for i := range 10 {
		st.Count(service.StatsDecision{Domain: "d", Entries: entries("k"+string(rune('a'+i)), "v"), Hits: 1, Outcome: service.StatsOver})
	}
	ss := st.Series()
	if len(ss) != 7 || ss[6].Key != OverflowKey || ss[6].Value("over_limit") != 8 {
		t.Fatalf("past the bound: %d series, the last %q with %d over_limit; want 7, %q with 8", len(ss), ss[len(ss)-1].Key, ss[len(ss)-1].Value("over_limit"), OverflowKey)
	}
}

// TestMapKey holds the Prometheus labels to envoyproxy/ratelimit's default mapper's.
func TestMapKey(t *testing.T) {
	for key, want := range map[string][]string{
		"shop.api_key_k1":          {"domain=shop", "key1=api_key_k1"},
		"shop.path_a.method":       {"domain=shop", "key1=path_a", "key2=method"},
		"shop.path_a.method.x_y.z": {"domain=shop", "key1=path_a", "key2=method"},
		OverflowKey:                nil,
	} {
		labels, values, ok := MapKey(key)
		var got []string
		for i := range labels {
			got = append(got, labels[i]+"="+values[i])
		}
		if !slices.Equal(got, want) || ok != (want != nil) {
			t.Errorf("MapKey(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
}

// listen returns a UDP socket on loopback and a function that reads its lines until want are
// all there (or 5 s pass).
func listen(t *testing.T) (addr string, read func(want int) []string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.LocalAddr().String(), func(want int) []string {
		var lines []string
		buf := make([]byte, 65536)
		pc.SetReadDeadline(time.Now().Add(5 * time.Second))
		for len(lines) < want {
			n, _, err := pc.ReadFrom(buf)
			if err != nil {
				t.Fatalf("read %q, then: %v", lines, err)
			}
			if n > maxDatagram {
				t.Errorf("datagram of %d bytes, above %d", n, maxDatagram)
			}
			lines = append(lines, strings.Split(string(buf[:n]), "\n")...)
		}
		return lines
	}
}

// TestSinkLines holds the lines sent to envoyproxy/ratelimit's: plain statsd with EXTRA_TAGS in
// the name as lyft/gostats puts them, DogStatsD with tags and a mogrifier; only what changed
// since the last flush, as deltas; many series split into datagrams that fit a 1500-byte MTU.
func TestSinkLines(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	tags, err := ParseTags("team:edge,env:test")
	if err != nil {
		t.Fatal(err)
	}
	mogs, err := ParseMogrifiers(`[{"pattern":"^ratelimit\\.service\\.rate_limit\\.([^.]+)\\.([^.]+)\\.total_hits$","name":"ratelimit.hits","tags":{"domain":"$1","descriptor":"$2"}}]`)
	if err != nil {
		t.Fatal(err)
	}
	r := &descriptors.Rule{Domain: "shop", Path: "api_key=k1"}
	for _, tc := range []struct {
		name string
		cfg  Config
		want []string
	}{
		{"statsd", Config{Tags: tags}, []string{
			"ratelimit.service.rate_limit.shop.api_key_k1.total_hits.__env=test.__team=edge:3|c",
			"ratelimit.service.rate_limit.shop.api_key_k1.over_limit.__env=test.__team=edge:1|c",
			"ratelimit.service.rate_limit.shop.api_key_k1.within_limit.__env=test.__team=edge:2|c",
		}},
		{"dogstatsd", Config{Tags: tags, DogStatsD: true, Mogrifiers: mogs}, []string{
			"ratelimit.hits:3|c|#env:test,team:edge,descriptor:api_key_k1,domain:shop",
			"ratelimit.service.rate_limit.shop.api_key_k1.over_limit:1|c|#env:test,team:edge",
			"ratelimit.service.rate_limit.shop.api_key_k1.within_limit:2|c|#env:test,team:edge",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, read := listen(t)
			st := NewStore(0, 0)
			tc.cfg.Addr, tc.cfg.Interval = addr, time.Hour
			s, err := NewSink(tc.cfg, st, nil, log)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Stop()
			count := func(o service.StatsOutcome) {
				st.Count(service.StatsDecision{Domain: "shop", Rule: r, Entries: entries("api_key", "k1"), Hits: 1, Outcome: o})
			}
			count(service.StatsWithin)
			count(service.StatsWithin)
			count(service.StatsOver)
			s.Flush()
			got := read(3)
			slices.Sort(got)
			want := slices.Sorted(slices.Values(tc.want))
			if !slices.Equal(got, want) {
				t.Fatalf("sent\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			// Nothing new: nothing sent. Then one more over: its delta only.
			s.Flush()
			count(service.StatsOver)
			s.Flush()
			got = read(2)
			if strings.Contains(strings.Join(got, "\n"), "within_limit") || !strings.Contains(strings.Join(got, "\n"), ":1|c") {
				t.Fatalf("second flush sent %q: want total_hits and over_limit by 1 only", got)
			}
		})
	}
	t.Run("datagrams", func(t *testing.T) {
		addr, read := listen(t)
		st := NewStore(1000, 0)
		s, err := NewSink(Config{Addr: addr, Interval: time.Hour}, st, nil, log)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		dr := &descriptors.Rule{Domain: "shop", Path: "user", DetailedMetric: true}
		for i := range 200 {
			st.Count(service.StatsDecision{Domain: "shop", Rule: dr, Entries: entries("user", strings.Repeat("u", 20)+string(rune('A'+i))), Hits: 1, Outcome: service.StatsWithin})
		}
		s.Flush()
		if got := read(400); len(got) != 400 {
			t.Fatalf("%d lines, want 400", len(got))
		}
	})
}

// TestSinkDownBlocksNothing: with nothing listening at the statsd address, counting and flushing
// go on (a flush's failed write is logged, not retried), from many goroutines at once.
func TestSinkDownBlocksNothing(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := pc.LocalAddr().String()
	pc.Close() // down: writes get ICMP port unreachable
	st := NewStore(0, 0)
	s, err := NewSink(Config{Addr: addr, Interval: time.Millisecond}, st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &descriptors.Rule{Domain: "d", Path: "k", DetailedMetric: g%2 == 0}
			for i := range 2000 {
				st.Count(service.StatsDecision{Domain: "d", Rule: r, Entries: entries("k", string(rune('a'+i%26))), Hits: 1, Outcome: service.StatsOutcome(i % 4)})
			}
		}()
	}
	wg.Wait()
	s.Stop()
	var total uint64
	for _, sr := range st.Series() {
		total += sr.Value("total_hits")
	}
	if total != 16000 {
		t.Errorf("total_hits summed over series: %d, want 16000", total)
	}
}

// TestSinkUnresolvedName: a statsd server whose name does not resolve does not keep the sink from
// being made, nor a flush from ending; counts go on being kept.
func TestSinkUnresolvedName(t *testing.T) {
	st := NewStore(0, 0)
	s, err := NewSink(Config{Addr: "statsd.invalid:8125", Interval: time.Hour}, st, nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	st.Count(service.StatsDecision{Domain: "d", Rule: &descriptors.Rule{Domain: "d", Path: "k"}, Entries: entries("k", "v"), Hits: 1})
	s.Flush()
	s.Stop()
	if got := st.Series()[0].Value("total_hits"); got != 1 {
		t.Errorf("total_hits = %d, want 1", got)
	}
}
