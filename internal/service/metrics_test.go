package service

import (
	"context"
	"fmt"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

func TestDetailedMetricCap(t *testing.T) {
	rs, err := descriptors.Parse(map[string][]byte{"api.yaml": []byte(`
domain: api
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 10}
`)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	log, buf := logBuffer()
	mb, _ := backend.NewMemory(backend.MemoryOptions{})
	svc, err := New(rs, Options{Backend: mb, Metrics: m, Logger: log, DetailedMetricValues: 3})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 50 {
		for _, key := range []string{"user", "path"} {
			if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
				Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(key, fmt.Sprint("v", i))}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	svc.SetRules(rs) // a reload does not lift the cap
	svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("user", "new")}})

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
	if strings.Contains(buf.String(), "v3") {
		t.Fatalf("a warning carries a descriptor value:\n%s", buf)
	}
}
