package xds_test

import (
	"fmt"
	"testing"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"go.yaml.in/yaml/v3"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/xds"
)

// bigConfig is a RateLimitConfig of n descriptors, each with a nested one, as Envoy Gateway
// builds for n route rules.
func bigConfig(n int) *rlconfv3.RateLimitConfig {
	c := &rlconfv3.RateLimitConfig{Name: "big", Domain: "big"}
	for i := range n {
		c.Descriptors = append(c.Descriptors, &rlconfv3.RateLimitDescriptor{
			Key: fmt.Sprintf("route-%d", i), Value: fmt.Sprintf("route-%d", i),
			Descriptors: []*rlconfv3.RateLimitDescriptor{{Key: "user",
				RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: uint32(i + 1)}}},
		})
	}
	return c
}

// BenchmarkRules loads a snapshot of 1,000 route rules; BenchmarkParseYAML loads the same rules
// from the YAML file they become, the baseline: the difference is the conversion.
func BenchmarkRules(b *testing.B) {
	cs := []*rlconfv3.RateLimitConfig{bigConfig(1000)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := xds.Rules(cs, descriptors.Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseYAML(b *testing.B) {
	rs, err := xds.Rules([]*rlconfv3.RateLimitConfig{bigConfig(1000)}, descriptors.Options{})
	if err != nil {
		b.Fatal(err)
	}
	_ = rs
	// The same file, written by hand in the rule format.
	type limit struct {
		Unit            string `yaml:"unit"`
		RequestsPerUnit int    `yaml:"requests_per_unit"`
	}
	type inner struct {
		Key       string `yaml:"key"`
		RateLimit limit  `yaml:"rate_limit"`
	}
	type outer struct {
		Key         string  `yaml:"key"`
		Value       string  `yaml:"value"`
		Descriptors []inner `yaml:"descriptors"`
	}
	var ds []outer
	for i := range 1000 {
		ds = append(ds, outer{Key: fmt.Sprintf("route-%d", i), Value: fmt.Sprintf("route-%d", i),
			Descriptors: []inner{{Key: "user", RateLimit: limit{Unit: "minute", RequestsPerUnit: i + 1}}}})
	}
	data, err := yaml.Marshal(map[string]any{"domain": "big", "descriptors": ds})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := descriptors.Parse(map[string][]byte{"big.yaml": data}); err != nil {
			b.Fatal(err)
		}
	}
}
