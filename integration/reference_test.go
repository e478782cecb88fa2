package integration

import (
	"math"
	"path/filepath"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestReferenceRuleFiles loads rule files written for envoyproxy/ratelimit, unchanged, and
// checks that rls answers what that service answers for requests within one of its windows:
// the same codes, current limits and remaining counts. (The two differ across window edges,
// where a fixed window admits up to twice the limit, and in what a denied request costs.)
func TestReferenceRuleFiles(t *testing.T) {
	p := startRLS(t, nil, "--config", filepath.Join(repoRoot(), "integration", "testdata", "reference"))
	c := p.client(t)
	ctx := ctxT(t)

	type want struct {
		code      rlsv3.RateLimitResponse_Code
		rpu       uint32 // 0: no current_limit
		unit      rlsv3.RateLimitResponse_RateLimit_Unit
		name      string
		remaining uint32
	}
	OK, OVER := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	DAY, MIN, SEC, HOUR := rlsv3.RateLimitResponse_RateLimit_DAY, rlsv3.RateLimitResponse_RateLimit_MINUTE, rlsv3.RateLimitResponse_RateLimit_SECOND, rlsv3.RateLimitResponse_RateLimit_HOUR
	steps := []struct {
		name    string
		domain  string
		ds      []*ratelimitv3.RateLimitDescriptor
		overall rlsv3.RateLimitResponse_Code
		want    []want
	}{
		{"nested marketing 1", "messaging", []*ratelimitv3.RateLimitDescriptor{d("message_type", "marketing", "to_number", "2061234567"), d("to_number", "2061234567")}, OK,
			[]want{{OK, 5, DAY, "", 4}, {OK, 100, DAY, "", 99}}},
		{"nested marketing 2", "messaging", []*ratelimitv3.RateLimitDescriptor{d("message_type", "marketing", "to_number", "2061234567"), d("to_number", "2061234567")}, OK,
			[]want{{OK, 5, DAY, "", 3}, {OK, 100, DAY, "", 98}}},
		{"other message type misses", "messaging", []*ratelimitv3.RateLimitDescriptor{d("message_type", "receipt", "to_number", "2061234567")}, OK,
			[]want{{OK, 0, 0, "", 0}}},
		{"default per ip", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("remote_address", "10.1.1.1")}, OK, []want{{OK, 10, MIN, "", 9}}},
		{"black-listed ip", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("remote_address", "50.0.0.5")}, OVER, []want{{OVER, 0, SEC, "", 0}}},
		{"wildcard 1", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("client_id", "mobile_a")}, OK, []want{{OK, 2, HOUR, "", 1}}},
		{"wildcard other value, own bucket", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("client_id", "mobile_b")}, OK, []want{{OK, 2, HOUR, "", 1}}},
		{"wildcard 2", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("client_id", "mobile_a")}, OK, []want{{OK, 2, HOUR, "", 0}}},
		{"wildcard 3", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("client_id", "mobile_a")}, OVER, []want{{OVER, 2, HOUR, "", 0}}},
		{"shadow 1", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("path", "/beta")}, OK, []want{{OK, 1, HOUR, "", 0}}},
		{"shadow over is OK", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("path", "/beta")}, OK, []want{{OK, 1, HOUR, "", 0}}},
		{"unlimited", "edge_proxy_per_ip", []*ratelimitv3.RateLimitDescriptor{d("source_cluster", "internal")}, OK, []want{{OK, 0, 0, "", math.MaxUint32}}},
		{"replaces 1", "example_replaces", []*ratelimitv3.RateLimitDescriptor{d("key1", "value1", "subkey1", "x"), d("key1", "value1", "subkey2", "y")}, OK,
			[]want{{OK, 2, MIN, "bkthomps", 1}, {OK, 0, 0, "", 0}}},
		{"replaces 2", "example_replaces", []*ratelimitv3.RateLimitDescriptor{d("key1", "value1", "subkey1", "x"), d("key1", "value1", "subkey2", "y")}, OK,
			[]want{{OK, 2, MIN, "bkthomps", 0}, {OK, 0, 0, "", 0}}},
		{"replaced limit alone applies", "example_replaces", []*ratelimitv3.RateLimitDescriptor{d("key1", "value1", "subkey2", "y")}, OVER,
			[]want{{OVER, 0, MIN, "banned_limit", 0}}},
	}
	for _, s := range steps {
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: s.domain, Descriptors: s.ds})
		if err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		if resp.OverallCode != s.overall {
			t.Errorf("%s: overall %v, want %v", s.name, resp.OverallCode, s.overall)
		}
		for i, w := range s.want {
			st := resp.Statuses[i]
			l := st.CurrentLimit
			wantLimit := w.rpu != 0 || w.code == OVER
			if st.Code != w.code || st.LimitRemaining != w.remaining || (l != nil) != wantLimit ||
				(l != nil && (l.RequestsPerUnit != w.rpu || l.Unit != w.unit || l.Name != w.name)) {
				t.Errorf("%s: status %d = %v, want %+v", s.name, i, st, w)
			}
		}
	}
}
