package service

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/backend"
)

const algorithmRules = `domain: api
descriptors:
  - key: user
    rate_limits:
      - {unit: minute, requests_per_unit: 3}
      - {unit: month, requests_per_unit: 3, algorithm: fixed_window, timezone: Asia/Tokyo, name: monthly}
      - {unit: minute, requests_per_unit: 3, algorithm: sliding_window, name: sw}
      - {unit: minute, requests_per_unit: 3, algorithm: sliding_log, name: sl}
`

// TestAlgorithmsNamed: the explain endpoint and rls_rule_algorithm name each limit's algorithm,
// and a request under all four is admitted whole or not at all.
func TestAlgorithmsNamed(t *testing.T) {
	rs, m, reg := rulesWithMetrics(t, algorithmRules)
	now := time.Date(2026, 1, 31, 14, 59, 0, 0, time.UTC) // 23:59 in Tokyo
	mem, err := backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(rs, Options{Backend: mem, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		if mf.GetName() != "rls_rule_algorithm" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			got = append(got, fmt.Sprintf("%s %v", strings.Join(ls, ","), m.GetGauge().GetValue()))
		}
	}
	if want := "algorithm=fixed_window,domain=api,rule=monthly 1; algorithm=gcra,domain=api,rule=user 1; " +
		"algorithm=sliding_log,domain=api,rule=sl 1; algorithm=sliding_window,domain=api,rule=sw 1"; strings.Join(got, "; ") != want {
		t.Fatalf("rls_rule_algorithm:\n got %s\nwant %s", strings.Join(got, "; "), want)
	}
	rec := httptest.NewRecorder()
	hr := httptest.NewRequest(http.MethodPost, "/debug/explain",
		strings.NewReader(`{"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "u"}]}]}`))
	hr.Header.Set("Content-Type", "application/json")
	svc.ExplainHandler().ServeHTTP(rec, hr)
	for _, s := range []string{`"algorithm": "gcra"`, `"algorithm": "fixed_window",` + "\n" + `          "timezone": "Asia/Tokyo"`, `"algorithm": "sliding_window"`, `"algorithm": "sliding_log"`} {
		if !strings.Contains(rec.Body.String(), s) {
			t.Errorf("explain does not say %s:\n%s", s, rec.Body.String())
		}
	}
	ask := func() rlsv3.RateLimitResponse_Code {
		resp, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "u")}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.OverallCode
	}
	for i := range 3 {
		if c := ask(); c != rlsv3.RateLimitResponse_OK {
			t.Fatalf("request %d: %v", i, c)
		}
	}
	if c := ask(); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("request 4: %v", c)
	}
	// At 00:00 on February 1st in Tokyo the month is back, but the sliding window still counts
	// the previous minute whole; a minute later every limit admits again.
	now = now.Add(time.Minute)
	if c := ask(); c != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("at 00:00 on the 1st in Tokyo: %v, want OVER_LIMIT from the sliding window", c)
	}
	now = now.Add(time.Minute)
	if c := ask(); c != rlsv3.RateLimitResponse_OK {
		t.Fatalf("at 00:01 on the 1st in Tokyo: %v", c)
	}
}
