package service

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/decisionlog"
	"github.com/rls-project/rls/internal/descriptors"
)

// TestDecisionLogHook: the service tells the decision log what it asks for, one record per
// descriptor from the limit that answered: denials (shadow mode's as shadow, answered OK), the
// admitted decisions of the rules named, never an override's or a descriptor no rule matched;
// the caller of a POST /json is its address.
func TestDecisionLogHook(t *testing.T) {
	t.Parallel()
	rs, err := descriptors.Parse(map[string][]byte{"d.yaml": []byte(`
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: path
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: plan
    rate_limits:
      - {name: hourly, unit: hour, requests_per_unit: 5}
      - {name: daily, unit: day, requests_per_unit: 100}
`)})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	dl, err := decisionlog.New(&out, decisionlog.Options{Rules: []string{"d/plan"}})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	svc, err := New(rs, Options{Backend: m, DecisionLog: dl})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(descs ...*ratelimitv3.RateLimitDescriptor) {
		t.Helper()
		if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: descs}); err != nil {
			t.Fatal(err)
		}
	}
	d := func(k, v string) *ratelimitv3.RateLimitDescriptor {
		return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: k, Value: v}}}
	}
	over := d("user", "o")
	over.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: 1}
	ask(d("user", "a"))                   // admitted: not logged
	ask(d("user", "a"), d("nothing", "")) // denied; the other descriptor has no rule
	ask(d("path", "/"))                   // shadow: denied, answered OK
	ask(d("plan", "p"))                   // admitted, but its rule is named
	ask(over)                             // an override's denial: not logged
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"a"}]}]}`))
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = "192.0.2.7:4321"
	svc.JSONHandler().ServeHTTP(rec, req)
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("/json: %d %s", rec.Code, rec.Body)
	}
	if err := dl.Close(); err != nil {
		t.Fatal(err)
	}
	var got []decisionlog.Record
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		r, err := decisionlog.Parse([]byte(l))
		if err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		got = append(got, r)
	}
	if len(got) != 4 {
		t.Fatalf("%d lines, want 4:\n%s", len(got), out.String())
	}
	want := []struct {
		rule, limit, code, caller string
		shadow                    bool
		remaining                 int64
	}{
		{"user", "", "OVER_LIMIT", "unknown", false, 0},
		{"path", "", "OK", "unknown", true, 0},
		{"plan", "hourly", "OK", "unknown", false, 4},
		{"user", "", "OVER_LIMIT", "192.0.2.7", false, 0},
	}
	for i, w := range want {
		g := got[i]
		if g.Rule != w.rule || g.Limit != w.limit || g.Code != w.code || g.Caller != w.caller || g.Shadow != w.shadow ||
			g.Remaining != w.remaining || g.Domain != "d" || g.HitsAddend != 1 || g.Count != 1 {
			t.Errorf("line %d: %+v, want %+v", i+1, g, w)
		}
	}
	if got[0].ResetSeconds <= 0 || got[0].ResetSeconds > 3600 {
		t.Errorf("a denial's reset_seconds %v: want the wait, under an hour", got[0].ResetSeconds)
	}
}
