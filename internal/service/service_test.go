package service

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/limit"
)

const rules = `
domain: api
descriptors:
  - key: key
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_key}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: plan
    value: free
    rate_limits:
      - {unit: second, requests_per_unit: 5, name: free_second}
      - {unit: day, requests_per_unit: 3, name: free_daily}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 100, name: gold, replaces: [{name: per_key}]}
  - key: open
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: quota
    quota_mode: true
    metadata: {backend: primary}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: fail_allow
    failure_mode: allow
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: fail_deny
    failure_mode: deny
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: fail_local
    failure_mode: local
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: team
    value: "t-*"
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`

type fixture struct {
	svc   *Service
	reg   *prometheus.Registry
	clock time.Time
}

func newFixture(t *testing.T, opts Options) *fixture {
	t.Helper()
	rs, err := descriptors.Parse(map[string][]byte{"api.yaml": []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{clock: time.Unix(1_800_000_000, 0), reg: prometheus.NewRegistry()}
	if opts.Metrics == nil {
		// As in production: the failure path once panicked only with metrics on.
		if opts.Metrics, err = NewMetrics(f.reg, 0.8); err != nil {
			t.Fatal(err)
		}
	}
	if opts.Backend == nil {
		m, err := backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return f.clock }})
		if err != nil {
			t.Fatal(err)
		}
		opts.Backend = m
	}
	if opts.Local == nil {
		opts.Local, _ = backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return f.clock }})
	}
	f.svc, err = New(rs, opts)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (f *fixture) ask(t *testing.T, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(ds))
	}
	return resp
}

func codesOf(resp *rlsv3.RateLimitResponse) string {
	var b strings.Builder
	b.WriteString(resp.OverallCode.String())
	for _, s := range resp.Statuses {
		b.WriteString(" " + s.Code.String())
	}
	return b.String()
}

func TestStatuses(t *testing.T) {
	f := newFixture(t, Options{})
	for i := range 3 {
		r := f.ask(t, desc("key", "k1"))
		st := r.Statuses[0]
		if codesOf(r) != "OK OK" || st.LimitRemaining != uint32(2-i) || st.CurrentLimit.GetName() != "per_key" ||
			st.CurrentLimit.GetRequestsPerUnit() != 3 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("request %d: %v", i+1, r)
		}
		if want := time.Duration(i+1) * 20 * time.Second; st.DurationUntilReset.AsDuration() != want {
			t.Fatalf("request %d: reset %v, want %v", i+1, st.DurationUntilReset.AsDuration(), want)
		}
	}
	f.clock = f.clock.Add(5 * time.Second)
	r := f.ask(t, desc("key", "k1"))
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT" || r.Statuses[0].DurationUntilReset.AsDuration() != 15*time.Second {
		t.Fatalf("4th request: %v, want OVER_LIMIT with 15s until this request is admitted", r)
	}
	f.clock = f.clock.Add(15 * time.Second)
	if r := f.ask(t, desc("key", "k1")); codesOf(r) != "OK OK" {
		t.Fatalf("after the retry time: %v", r)
	}
}

func TestNoLimit(t *testing.T) {
	f := newFixture(t, Options{})
	tests := []struct {
		name      string
		domain    string
		d         *ratelimitv3.RateLimitDescriptor
		remaining uint32
	}{
		{"unknown domain", "nope", desc("key", "k"), 0},
		{"no rule matches", "api", desc("unknown", "x"), 0},
		{"deeper than the rules", "api", desc("key", "k", "more", "x"), 0},
		{"unlimited", "api", desc("open", "x"), math.MaxUint32},
		{"no entries", "api", desc(), 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for range 5 {
				resp, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: tc.domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{tc.d}})
				if err != nil {
					t.Fatal(err)
				}
				st := resp.Statuses[0]
				if codesOf(resp) != "OK OK" || st.CurrentLimit != nil || st.LimitRemaining != tc.remaining {
					t.Fatalf("got %v", resp)
				}
			}
		})
	}
}

func TestHits(t *testing.T) {
	f := newFixture(t, Options{})
	ctx := context.Background()
	r, err := f.svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("key", "h")}})
	if err != nil || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("hits_addend 2: %v %v", r, err)
	}
	check := desc("key", "h")
	check.HitsAddend = wrapperspb.UInt64(0)
	r, _ = f.svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{check}})
	if codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("explicit 0 checks only, overriding the request's 5: %v", r)
	}
	refund := desc("key", "h")
	refund.HitsAddend = wrapperspb.UInt64(1)
	refund.IsNegativeHits = true
	r, _ = f.svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{refund}})
	if codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("refund of 1: %v", r)
	}
	big := desc("key", "h")
	big.HitsAddend = wrapperspb.UInt64(math.MaxUint64)
	r, _ = f.svc.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{big}})
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT" || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("huge hits: %v", r)
	}
}

func TestOverride(t *testing.T) {
	f := newFixture(t, Options{})
	d := desc("key", "o")
	d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(30)}
	r := f.ask(t, d)
	st := r.Statuses[0]
	if codesOf(r) != "OK OK" || st.CurrentLimit.GetRequestsPerUnit() != 1 || st.CurrentLimit.GetUnitMultiplier().GetValue() != 30 || st.DurationUntilReset.AsDuration() != 30*time.Second {
		t.Fatalf("override 1 per 30s: %v", r)
	}
	if r := f.ask(t, d); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("second within 30s: %v", r)
	}
	// A multiplier of 1 is left out of the answer: absent means 1.
	d1 := desc("key", "o1")
	d1.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_SECOND, UnitMultiplier: wrapperspb.UInt32(1)}
	if r := f.ask(t, d1); codesOf(r) != "OK OK" || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 1 || r.Statuses[0].CurrentLimit.UnitMultiplier != nil {
		t.Fatalf("override 1 per second: %v", r)
	}
	// An override applies even where no rule matches, as in the reference service.
	u := desc("unmatched", "x")
	u.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_HOUR}
	if r := f.ask(t, u); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("override 0/hour: %v", r)
	}
}

func TestAllOrNothing(t *testing.T) {
	f := newFixture(t, Options{})
	for range 2 {
		f.ask(t, desc("ip", "1.1.1.1"))
	}
	r := f.ask(t, desc("key", "aon"), desc("ip", "1.1.1.1"))
	if codesOf(r) != "OVER_LIMIT OK OVER_LIMIT" || r.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("got %v, want the key's status OK with nothing consumed (remaining 3)", r)
	}
	if r := f.ask(t, desc("key", "aon")); r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("key after the denied request: %v, want remaining 2", r)
	}
}

func TestRateLimitsList(t *testing.T) {
	f := newFixture(t, Options{})
	r := f.ask(t, desc("plan", "free"))
	if st := r.Statuses[0]; st.CurrentLimit.GetName() != "free_daily" || st.LimitRemaining != 2 {
		t.Fatalf("first: %v, want the daily limit (least remaining, 2)", r)
	}
	f.ask(t, desc("plan", "free"))
	f.ask(t, desc("plan", "free"))
	r = f.ask(t, desc("plan", "free"))
	if st := r.Statuses[0]; codesOf(r) != "OVER_LIMIT OVER_LIMIT" || st.CurrentLimit.GetName() != "free_daily" || st.DurationUntilReset.AsDuration() != 8*time.Hour {
		t.Fatalf("4th: %v, want the daily limit denying, admitted again in 8h", r)
	}
}

func TestReplaces(t *testing.T) {
	f := newFixture(t, Options{})
	for i := range 5 {
		r := f.ask(t, desc("key", "rep"), desc("plan", "gold"))
		if codesOf(r) != "OK OK OK" || r.Statuses[0].CurrentLimit != nil || r.Statuses[1].CurrentLimit.GetName() != "gold" {
			t.Fatalf("request %d: %v, want per_key replaced by gold", i, r)
		}
	}
}

func TestShadowAndQuota(t *testing.T) {
	f := newFixture(t, Options{})
	f.ask(t, desc("shadow", "s"))
	r := f.ask(t, desc("shadow", "s"), desc("key", "sq"))
	if codesOf(r) != "OK OK OK" || r.Statuses[0].LimitRemaining != 0 || r.Statuses[1].LimitRemaining != 2 {
		t.Fatalf("shadow over: %v", r)
	}
	r = f.ask(t, desc("quota", "q"))
	if md, _ := r.DynamicMetadata.AsMap()["metadata"].(map[string]any); codesOf(r) != "OK OK" || md["backend"] != "primary" {
		t.Fatalf("quota within: %v", r)
	}
	r = f.ask(t, desc("quota", "q"), desc("quota", "q2"))
	md := r.DynamicMetadata.AsMap()
	if codesOf(r) != "OK OVER_LIMIT OK" || md["quotaModeEnabled"] != true || len(md["quotaModeViolations"].([]any)) != 1 {
		t.Fatalf("one quota over: %v", r)
	}
	r = f.ask(t, desc("quota", "q"), desc("quota", "q2"))
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("every quota over: %v", r)
	}
}

func TestShareThreshold(t *testing.T) {
	f := newFixture(t, Options{})
	f.ask(t, desc("team", "t-a"))
	f.ask(t, desc("team", "t-b"))
	if r := f.ask(t, desc("team", "t-c")); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("third team sharing 2/hour: %v", r)
	}
}

func TestInvalidArgument(t *testing.T) {
	f := newFixture(t, Options{})
	long := strings.Repeat("x", limit.MaxValueBytes+1)
	many := make([]*ratelimitv3.RateLimitDescriptor, limit.MaxDescriptors+1)
	for i := range many {
		many[i] = desc("key", "k")
	}
	deep := desc()
	for range limit.MaxEntries + 1 {
		deep.Entries = append(deep.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: "k", Value: "v"})
	}
	withOverride := func(u typev3.RateLimitUnit, mult *wrapperspb.UInt32Value) *ratelimitv3.RateLimitDescriptor {
		d := desc("key", "k")
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: u, UnitMultiplier: mult}
		return d
	}
	tests := []struct {
		name string
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{"empty domain", &rlsv3.RateLimitRequest{Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}}, "domain must not be empty"},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}, "descriptors must not be empty"},
		{"empty key", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("", "v")}}, "descriptors[0].entries[0]: key must not be empty"},
		{"long value", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", long)}}, "value longer than"},
		{"long key", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(long, "v")}}, "key longer than"},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many}, "65 descriptors: at most 64"},
		{"too many entries", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{deep}}, "33 entries: at most 32"},
		{"override unit unknown", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{withOverride(typev3.RateLimitUnit_UNKNOWN, nil)}}, "descriptors[0].limit: unit UNKNOWN"},
		{"override unit out of range", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{withOverride(typev3.RateLimitUnit(42), nil)}}, "descriptors[0].limit: unit 42"},
		{"override multiplier 0", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{withOverride(typev3.RateLimitUnit_SECOND, wrapperspb.UInt32(0))}}, "unit_multiplier must be > 0"},
		{"domain not UTF-8", &rlsv3.RateLimitRequest{Domain: "a\xff", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v")}}, "domain is not valid UTF-8"},
		{"key not UTF-8", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "v"), desc("k\xc0", "v")}}, "descriptors[1].entries[0]: key is not valid UTF-8"},
		{"value not UTF-8", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("k", "\xed\xa0\x80")}}, "descriptors[0].entries[0]: value is not valid UTF-8"},
		{"null descriptor", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{nil}}, "descriptors[0] is null"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := f.svc.ShouldRateLimit(context.Background(), tc.req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want InvalidArgument containing %q", err, tc.want)
			}
		})
	}
}

// failing is a backend whose store is down.
type failing struct{}

func (failing) Decide(context.Context, []backend.Request, []backend.Decision) (bool, error) {
	return false, errors.Join(backend.ErrUnavailable, errors.New("connection refused"))
}
func (failing) Close() error { return nil }

func TestFailureModes(t *testing.T) {
	tests := []struct {
		name     string
		def      FailureMode
		ds       []*ratelimitv3.RateLimitDescriptor
		want     string // codes, or "UNAVAILABLE"
		repeated string // the answer to the same request a second time
	}{
		{"default error", FailError, []*ratelimitv3.RateLimitDescriptor{desc("key", "k")}, "UNAVAILABLE", "UNAVAILABLE"},
		{"default error, two descriptors", FailError, []*ratelimitv3.RateLimitDescriptor{desc("key", "k"), desc("ip", "1")}, "UNAVAILABLE", "UNAVAILABLE"},
		{"default error, a limit list", FailError, []*ratelimitv3.RateLimitDescriptor{desc("plan", "free")}, "UNAVAILABLE", "UNAVAILABLE"},
		{"error rule after an allow rule", FailError, []*ratelimitv3.RateLimitDescriptor{desc("fail_allow", "x"), desc("key", "k"), desc("fail_deny", "x")}, "UNAVAILABLE", "UNAVAILABLE"},
		{"default unset is error", FailureMode(0), []*ratelimitv3.RateLimitDescriptor{desc("key", "k"), desc("ip", "1")}, "UNAVAILABLE", "UNAVAILABLE"},
		{"default allow", FailAllow, []*ratelimitv3.RateLimitDescriptor{desc("key", "k")}, "OK OK", "OK OK"},
		{"default deny", FailDeny, []*ratelimitv3.RateLimitDescriptor{desc("key", "k")}, "OVER_LIMIT OVER_LIMIT", "OVER_LIMIT OVER_LIMIT"},
		{"default local", FailLocal, []*ratelimitv3.RateLimitDescriptor{desc("fail_allow", "x"), desc("fail_local", "x")}, "OK OK OK", "OVER_LIMIT OK OVER_LIMIT"},
		{"rule allow over default error", FailError, []*ratelimitv3.RateLimitDescriptor{desc("fail_allow", "x")}, "OK OK", "OK OK"},
		{"rule deny over default allow", FailAllow, []*ratelimitv3.RateLimitDescriptor{desc("fail_deny", "x"), desc("key", "k")}, "OVER_LIMIT OVER_LIMIT OK", "OVER_LIMIT OVER_LIMIT OK"},
		{"rule local", FailError, []*ratelimitv3.RateLimitDescriptor{desc("fail_local", "x")}, "OK OK", "OVER_LIMIT OVER_LIMIT"},
		{"one error rule fails the request", FailAllow, []*ratelimitv3.RateLimitDescriptor{desc("fail_allow", "x"), desc("key", "k")}, "OK OK OK", "OK OK OK"},
		{"no limit needs no backend", FailError, []*ratelimitv3.RateLimitDescriptor{desc("unknown", "x")}, "OK OK", "OK OK"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, Options{Backend: failing{}, FailureMode: tc.def})
			for i, want := range []string{tc.want, tc.repeated} {
				resp, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: tc.ds})
				got := ""
				if err != nil {
					got = status.Code(err).String()
					if status.Code(err) == codes.Unavailable {
						got = "UNAVAILABLE"
					}
				} else {
					got = codesOf(resp)
					for j, st := range resp.Statuses {
						key := tc.ds[j].Entries[0].Key
						byAllow := key == "fail_allow" || (tc.def == FailAllow && key == "key")
						if byAllow && st.CurrentLimit != nil {
							t.Errorf("request %d: status %d answered by failure mode allow reports a limit: %v", i+1, j, st)
						}
					}
				}
				if got != want {
					t.Fatalf("request %d: got %s, want %s", i+1, got, want)
				}
			}
		})
	}
}

func TestCostAboveBurst(t *testing.T) {
	f := newFixture(t, Options{})
	d := desc("key", "cost")
	d.HitsAddend = wrapperspb.UInt64(5) // per_key: 3 a minute, burst 3
	for i := range 2 {
		r := f.ask(t, d)
		st := r.Statuses[0]
		if codesOf(r) != "OVER_LIMIT OVER_LIMIT" || st.DurationUntilReset != nil || st.LimitRemaining != 3 {
			t.Fatalf("request %d, cost 5 above burst 3: %v, want OVER_LIMIT with 3 remaining (nothing charged) and no duration_until_reset: no wait admits it", i+1, r)
		}
	}
}

func TestNoRulesYet(t *testing.T) {
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	svc, err := New(nil, Options{Backend: m})
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: nil})
	if status.Code(err) == codes.Unavailable {
		t.Fatalf("an invalid request must still be InvalidArgument first: %v", err)
	}
	_, err = svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("ip", "a")}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no rules") {
		t.Fatalf("before rules: %v, want UNAVAILABLE no rules loaded yet", err)
	}
	for _, h := range []http.Handler{svc.RulesHandler(), svc.RLConfigHandler()} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("debug handler before rules: %d", rec.Code)
		}
	}
	rs, err := descriptors.Parse(map[string][]byte{"api.yaml": []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	svc.SetRules(rs)
	resp, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("ip", "a")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit == nil {
		t.Fatalf("with rules: %v %v", resp, err)
	}
	rec := httptest.NewRecorder()
	svc.RLConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
	if body := rec.Body.String(); !strings.Contains(body, "api.ip: unit=SECOND requests_per_unit=2") || !strings.Contains(body, "api.plan_free: unit=DAY requests_per_unit=3") {
		t.Errorf("/rlconfig:\n%s", body)
	}
}
