package service

import (
	"context"
	"io"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/decisionlog"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/rlstest"
)

// BenchmarkDecisionLog measures one decision of a one-descriptor request inside the service with
// the decision log off and on, in the same run: on with nothing to write (every request admitted,
// denials only), on with every request denied (one key, throttled: a line a second), and on for
// every decision of the rule unthrottled (--decision-log-rules '*' --decision-log-interval 0),
// the lines written to io.Discard. cpu-ns/op is the figure to read on a shared machine.
func BenchmarkDecisionLog(b *testing.B) {
	rs, err := descriptors.Parse(map[string][]byte{"b.yaml": []byte(`
domain: bench
descriptors:
  - key: open
    rate_limit: {unit: day, requests_per_unit: 1000000000, burst: 1000000000}
  - key: shut
    rate_limit: {unit: day, requests_per_unit: 0}
`)})
	if err != nil {
		b.Fatal(err)
	}
	req := func(key string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: "k1"}}}}}
	}
	for _, v := range []struct {
		name string
		log  *decisionlog.Options
		key  string
	}{
		{"off", nil, "open"},
		{"on-admitted", &decisionlog.Options{Interval: time.Second}, "open"},
		{"off-denied", nil, "shut"},
		{"on-denied", &decisionlog.Options{Interval: time.Second}, "shut"},
		{"on-every", &decisionlog.Options{Rules: []string{"*"}}, "open"},
	} {
		b.Run(v.name, func(b *testing.B) {
			m, _ := backend.NewMemory(backend.MemoryOptions{})
			opts := Options{Backend: m}
			if v.log != nil {
				l, err := decisionlog.New(io.Discard, *v.log)
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				opts.DecisionLog = l
			}
			svc, err := New(rs, opts)
			if err != nil {
				b.Fatal(err)
			}
			r := req(v.key)
			ctx := context.Background()
			b.ReportAllocs()
			cpu0 := rlstest.ProcessCPU(b)
			for b.Loop() {
				if _, err := svc.ShouldRateLimit(ctx, r); err != nil {
					b.Fatal(err)
				}
			}
			rlstest.ReportCPU(b, cpu0)
		})
	}
}
