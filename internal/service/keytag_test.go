package service

import (
	"context"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

// keysOf translates req under rules and returns each limit's backend key, in order.
func keysOf(t *testing.T, rules string, req *rlsv3.RateLimitRequest) []string {
	t.Helper()
	rs, err := descriptors.Parse(map[string][]byte{"k.yaml": []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	s, err := New(rs, Options{Backend: m})
	if err != nil {
		t.Fatal(err)
	}
	var w work
	s.translate(rs, req, &w, true)
	var keys []string
	for _, it := range w.items {
		keys = append(keys, it.req.Key)
	}
	return keys
}

// TestKeysNameTheLimit: a singular rate_limit's key ends "#0", as before (whatever its name); a
// limit of a rate_limits list is keyed by its name, else its period and algorithm, so a reload
// that removes or reorders the list's limits leaves each limit with its own key; an override's
// key is never a rule's.
func TestKeysNameTheLimit(t *testing.T) {
	const prefix = "1:k4:user2:u1#"
	rules := func(limits ...string) string {
		r := "domain: k\ndescriptors:\n  - key: single\n    rate_limit: {unit: day, requests_per_unit: 5, name: n}\n  - key: user\n    rate_limits:\n"
		for _, l := range limits {
			r += "      - " + l + "\n"
		}
		return r
	}
	const (
		second = "{unit: second, requests_per_unit: 10, burst: 10}"
		day    = "{unit: day, requests_per_unit: 20}"
		named  = "{unit: hour, requests_per_unit: 20, name: hourly}"
	)
	user := &rlsv3.RateLimitRequest{Domain: "k", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u1")}}
	for _, tc := range []struct {
		name   string
		limits []string
		want   []string
	}{
		{"both", []string{second, day, named}, []string{"p1s/gcra", "p86400s/gcra", "n6:hourly"}},
		{"per-second removed", []string{day, named}, []string{"p86400s/gcra", "n6:hourly"}},
		{"swapped", []string{named, day, second}, []string{"n6:hourly", "p86400s/gcra", "p1s/gcra"}},
		{"one left", []string{day}, []string{"p86400s/gcra"}},
	} {
		got := keysOf(t, rules(tc.limits...), user)
		var want []string
		for _, w := range tc.want {
			want = append(want, prefix+w)
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: keys %q, want %q", tc.name, got, want)
		}
	}

	// The singular form keeps "#0", whatever its name.
	single := &rlsv3.RateLimitRequest{Domain: "k", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("single", "x")}}
	if got := keysOf(t, rules(day), single); len(got) != 1 || got[0] != "1:k6:single1:x#0" {
		t.Errorf("singular rate_limit: keys %q, want [1:k6:single1:x#0]", got)
	}

	// An override of the same entries is keyed apart from every limit of the rule.
	over := desc("user", "u1")
	over.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 20, Unit: 4, UnitMultiplier: wrapperspb.UInt32(1)}
	got := keysOf(t, rules(second, day), &rlsv3.RateLimitRequest{Domain: "k", Descriptors: []*ratelimitv3.RateLimitDescriptor{over}})
	if len(got) != 1 || got[0] != prefix+"o20/86400" {
		t.Errorf("override: keys %q, want [%so20/86400]", got, prefix)
	}
}

// TestRateLimitsListSurvivesSwap: through the service and the memory store, limits of a list
// swapped by a reload keep their own state: the spent daily limit still denies (keyed by place,
// it read the per-second limit's full state and admitted).
func TestRateLimitsListSurvivesSwap(t *testing.T) {
	parse := func(limits string) *descriptors.RuleSet {
		t.Helper()
		rs, err := descriptors.Parse(map[string][]byte{"k.yaml": []byte("domain: k\ndescriptors:\n  - key: user\n    rate_limits:\n" + limits)})
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	const (
		second = "      - {unit: second, requests_per_unit: 10, burst: 10}\n"
		day    = "      - {unit: day, requests_per_unit: 3}\n"
	)
	now := time.Unix(1_800_000_000, 0)
	m, _ := backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return now }})
	s, err := New(parse(second+day), Options{Backend: m})
	if err != nil {
		t.Fatal(err)
	}
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := s.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "k", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u1")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for range 3 {
		ask()
	}
	now = now.Add(2 * time.Second) // the per-second limit full again, the day's still spent
	s.SetRules(parse(day + second))
	resp := ask()
	if st := resp.Statuses[0]; resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_DAY {
		t.Fatalf("after the swap: %v, want OVER_LIMIT by the spent daily limit", resp)
	}
}

// BenchmarkShouldRateLimitList is BenchmarkShouldRateLimit's bare case with a rate_limits list
// of three limits (unnamed, named, a calendar window) on one descriptor: what a key tag costs.
func BenchmarkShouldRateLimitList(b *testing.B) {
	rs, err := descriptors.Parse(map[string][]byte{"b.yaml": []byte(`
domain: bench
descriptors:
  - key: api_key
    rate_limits:
      - {unit: second, requests_per_unit: 1000000000, burst: 1000000000}
      - {unit: day, requests_per_unit: 1000000000, name: daily}
      - {unit: month, requests_per_unit: 1000000000, algorithm: fixed_window, timezone: Asia/Tokyo}
`)})
	if err != nil {
		b.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "k1"}}},
	}}
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	svc, err := New(rs, Options{Backend: m})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := svc.ShouldRateLimit(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
