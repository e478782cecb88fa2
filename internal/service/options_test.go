package service

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

func askCodes(t *testing.T, f *fixture, n int, kv ...string) string {
	t.Helper()
	var out []string
	for range n {
		r := f.ask(t, desc(kv...))
		out = append(out, r.OverallCode.String()+"/"+r.Statuses[0].Code.String())
	}
	return strings.Join(out, " ")
}

func TestGlobalShadowMode(t *testing.T) {
	// ip allows 2 per second: the third is denied, unless every rule is in shadow mode.
	if got, want := askCodes(t, newFixture(t, Options{}), 3, "ip", "a"), "OK/OK OK/OK OVER_LIMIT/OVER_LIMIT"; got != want {
		t.Errorf("without: %s, want %s", got, want)
	}
	f := newFixture(t, Options{ShadowMode: true})
	if got, want := askCodes(t, f, 3, "ip", "a"), "OK/OK OK/OK OK/OK"; got != want {
		t.Errorf("--shadow-mode: %s, want %s", got, want)
	}
	// Counted as shadow_mode, as a rule's own shadow_mode is.
	if got := f.outcomeCount(t, "shadow_mode"); got != 1 {
		t.Errorf("shadow_mode outcomes %v, want 1", got)
	}
}

func TestGlobalQuotaMode(t *testing.T) {
	f := newFixture(t, Options{QuotaMode: true})
	var last *rlsv3.RateLimitResponse
	for range 3 {
		last = f.ask(t, desc("ip", "q"))
	}
	md := last.GetDynamicMetadata().AsMap()
	if md["quotaModeEnabled"] != true {
		t.Fatalf("metadata %v: want quotaModeEnabled as for a rule with quota_mode", md)
	}
	if v, _ := md["quotaModeViolations"].([]any); len(v) != 1 {
		t.Errorf("quotaModeViolations %v, want the one descriptor", md["quotaModeViolations"])
	}
	if got := newFixture(t, Options{}).ask(t, desc("ip", "q")).GetDynamicMetadata(); got != nil {
		t.Errorf("without --quota-mode: metadata %v, want none", got)
	}
}

func TestNoRulesYet(t *testing.T) {
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	svc, err := New(nil, Options{Backend: m})
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: nil})
	if status.Code(err) == codes.Unavailable {
		t.Fatalf("an invalid request must still be InvalidArgument first: %v", err)
	}
	_, err = svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("ip", "a")}})
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
	resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("ip", "a")}})
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit == nil {
		t.Fatalf("with rules: %v %v", resp, err)
	}
	rec := httptest.NewRecorder()
	svc.RLConfigHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/rlconfig", nil))
	if body := rec.Body.String(); !strings.Contains(body, "api.ip: unit=SECOND requests_per_unit=2") || !strings.Contains(body, "api.plan_free: unit=DAY requests_per_unit=3") {
		t.Errorf("/rlconfig:\n%s", body)
	}
}

// outcomeCount sums rls_decisions_total for outcome.
func (f *fixture) outcomeCount(t *testing.T, outcome string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "rls_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
