package service

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/rlstest"
	"github.com/rls-project/rls/internal/top"
)

const topRules = `
domain: d
descriptors:
  - key: user
    rate_limits:
      - {unit: second, requests_per_unit: 2, name: per_second}
      - {unit: minute, requests_per_unit: 100}
  - key: ip
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// TestTopObservesDecisions: each descriptor matched by a rule counts once under its rule, by
// the limit that answers for it, as the descriptor it came from; shadow mode's would-be
// denials count as denials; an override counts nowhere.
func TestTopObservesDecisions(t *testing.T) {
	t.Parallel()
	rs, err := descriptors.Parse(map[string][]byte{"r.yaml": []byte(topRules)})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	tp := top.New(top.Config{Keys: 8, MaxBytes: top.DefaultMaxBytes})
	svc, err := New(rs, Options{Backend: m, Top: tp})
	if err != nil {
		t.Fatal(err)
	}
	req := &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "u,1"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "ip", Value: "10.0.0.1"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: "o"}},
			Limit: &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: 1}},
	}}
	for range 5 {
		if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	rep := tp.Report(top.Query{Window: top.Windows["1m"], Keys: 8})
	want := map[string]top.KeyReport{
		"user": {Descriptor: "user=u%2C1", Hits: 5, Denials: 3, Remaining: 0, Limit: 2},
		"ip":   {Descriptor: "ip=10.0.0.1", Hits: 5, Denials: 4, Remaining: 0, Limit: 1},
	}
	if len(rep.Rules) != 2 {
		t.Fatalf("rules %+v, want user and ip", rep.Rules)
	}
	for _, r := range rep.Rules {
		if len(r.Keys) != 1 || r.Keys[0] != want[r.Rule] {
			t.Errorf("rule %s: keys %+v, want %+v", r.Rule, r.Keys, want[r.Rule])
		}
	}
}

// BenchmarkTopTalkers is the decision path with the top talkers off and on, metrics on as in
// production, over a Zipf draw of a million users; cpu-ns/op, the process's CPU time, is the
// figure to compare on a busy machine.
func BenchmarkTopTalkers(b *testing.B) {
	rs, err := descriptors.Parse(map[string][]byte{"b.yaml": []byte(`
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 100}
`)})
	if err != nil {
		b.Fatal(err)
	}
	z := rand.NewZipf(rand.New(rand.NewPCG(1, 1)), 1.1, 1, 999_999)
	reqs := make([]*rlsv3.RateLimitRequest, 1<<14)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*ratelimitv3.RateLimitDescriptor{
			{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: strconv.FormatUint(z.Uint64(), 10)}}},
		}}
	}
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			m, _ := backend.NewMemory(backend.MemoryOptions{})
			opts := Options{Backend: m}
			if opts.Metrics, err = NewMetrics(prometheus.NewRegistry(), 0.8); err != nil {
				b.Fatal(err)
			}
			if on {
				opts.Top = top.New(top.Config{Keys: top.DefaultKeys, MaxBytes: top.DefaultMaxBytes})
			}
			svc, err := New(rs, opts)
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			b.ReportAllocs()
			cpu := rlstest.ProcessCPU(b)
			defer rlstest.ReportCPU(b, cpu)
			b.RunParallel(func(pb *testing.PB) {
				i := rand.IntN(len(reqs))
				for pb.Next() {
					i = (i + 1) & (len(reqs) - 1)
					if _, err := svc.ShouldRateLimit(ctx, reqs[i]); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
