package service

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/statekey"
)

// TestSlotEntries: a rule's concurrency limit acquires the slot its descriptor's rls_slot names,
// on the rule its other entries match; rls_release releases it and charges none of the rule's
// rate limits; the slot entries are no part of the rate limits' keys.
func TestSlotEntries(t *testing.T) {
	t.Parallel()
	rs, err := descriptors.Parse(map[string][]byte{"llm.yaml": []byte(`domain: llm
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
    concurrency: {max_in_flight: 2, slot_lifetime: 1m}
`)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	m, _ := backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return now }})
	svc, err := New(rs, Options{Backend: m})
	if err != nil {
		t.Fatal(err)
	}
	ask := func(kv ...string) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "llm", Descriptors: []*ratelimitv3.RateLimitDescriptor{desc(kv...)}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i, id := range []string{"r1", "r2"} {
		if r := ask("user", "alice", SlotEntry, id); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != uint32(1-i) {
			t.Fatalf("acquire %s: %v", id, r)
		}
	}
	if r := ask("user", "alice", SlotEntry, "r3"); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("third in flight: %v", r)
	}
	if r := ask("user", "alice", SlotEntry, "r1", ReleaseEntry, "1"); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("release: %v", r)
	}
	if r := ask("user", "alice", SlotEntry, "r3"); r.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("acquire after release: %v", r)
	}
	// Acquires r1, r2, r3 (and the refused r3) charged the rate; the release did not.
	if r := ask("user", "alice"); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("without a slot id: %v, want the acquire denied", r)
	}
	rateKey := string(append(statekey.AppendField(statekey.AppendField(statekey.AppendField(nil, "llm"), "user"), "alice"), "#0"...))
	out := make([]backend.Decision, 1)
	if _, err := m.Decide(context.Background(), []backend.Request{{Key: rateKey, Limit: rs.Match("llm", []descriptors.Entry{{Key: "user", Value: "alice"}}).Limits[0].Spec}}, out); err != nil || out[0].Remaining != 7 {
		t.Fatalf("rate: %+v %v, want 7 remaining (3 charges)", out[0], err)
	}
}
