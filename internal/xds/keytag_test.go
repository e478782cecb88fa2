package xds

import (
	"testing"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rls-project/rls/internal/descriptors"
)

// TestXDSRulesKeyedAsFiles: a rule delivered over xDS (RateLimitConfig carries one limit per
// descriptor, a named one here) keys its limit as the same rule in a file does, "0", so state
// is shared by both ways of delivering the rules and unchanged by naming the limit.
func TestXDSRulesKeyedAsFiles(t *testing.T) {
	rs, err := Rules([]*rlconfv3.RateLimitConfig{{Name: "k", Domain: "k", Descriptors: []*rlconfv3.RateLimitDescriptor{{
		Key: "user", RateLimit: &rlconfv3.RateLimitPolicy{Unit: rlconfv3.RateLimitUnit_DAY, RequestsPerUnit: 20, Name: "daily"},
	}}}}, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	file, err := descriptors.Parse(map[string][]byte{"k.yaml": []byte("domain: k\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 20, name: daily}\n")})
	if err != nil {
		t.Fatal(err)
	}
	entries := []descriptors.Entry{{Key: "user", Value: "u1"}}
	x, f := rs.Match("k", entries), file.Match("k", entries)
	if x == nil || f == nil || len(x.Limits) != 1 || x.Limits[0].KeyTag != "0" || x.Limits[0].KeyTag != f.Limits[0].KeyTag {
		t.Fatalf("xDS rule %+v, file rule %+v: want one limit each, both tagged \"0\"", x, f)
	}
}
