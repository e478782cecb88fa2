package service

import (
	"fmt"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

// detailedRules put values in metric labels: user by the request's value, path by the matched one.
const detailedRules = `
domain: api
descriptors:
  - {key: user, detailed_metric: true, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: path, value_to_metric: true, rate_limit: {unit: second, requests_per_unit: 10}}
`

// TestDetailedMetricCap: detailed_metric and value_to_metric label at most
// DetailedMetricValues values per rule, the rest under <rule>/_overflow_, with one warning per
// rule that names no value; a reload keeps the cap.
func TestDetailedMetricCap(t *testing.T) {
	rs, m, reg := rulesWithMetrics(t, detailedRules)
	log, buf := logBuffer()
	mb, _ := backend.NewMemory(backend.MemoryOptions{})
	svc, err := New(rs, Options{Backend: mb, Metrics: m, Logger: log, DetailedMetricValues: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		for _, key := range []string{"user", "path"} {
			if _, err := svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "api",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(key, fmt.Sprint("v", i))}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	svc.SetRules(rs) // a reload does not lift the cap
	svc.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "new")}})

	rules := map[string]float64{} // rule label → hits
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "rls_hits_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetName() == "rule" {
					rules[lp.GetValue()] += s.GetCounter().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"user=v0": 1, "user=v1": 1, "user=v2": 1, "user/_overflow_": 48,
		"path=v0": 1, "path=v1": 1, "path=v2": 1, "path/_overflow_": 47}
	if fmt.Sprint(rules) != fmt.Sprint(want) {
		t.Fatalf("series by rule: %v\nwant %v", rules, want)
	}
	if n := strings.Count(buf.String(), "level=WARN"); n != 2 {
		t.Fatalf("%d warnings, want one per rule:\n%s", n, buf)
	}
	for _, line := range strings.Split(buf.String(), "\n") {
		if !strings.Contains(line, "level=DEBUG") && strings.Contains(line, "v3") {
			t.Fatalf("a line above debug carries a descriptor value:\n%s", line)
		}
	}
}

// rulesWithMetrics parses rules, the file api.yaml, and makes metrics on a registry of their own.
func rulesWithMetrics(t *testing.T, rules string) (*descriptors.RuleSet, *Metrics, *prometheus.Registry) {
	t.Helper()
	rs, err := descriptors.Parse(map[string][]byte{"api.yaml": []byte(rules)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	return rs, m, reg
}
