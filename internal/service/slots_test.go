package service

import (
	"context"
	"net/http"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

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
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(rs, Options{Backend: m, Metrics: metrics})
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
	// /v1/keys (rls inspect) shows the slots held: r2 and r3.
	w, res := keysRequest(t, svc.KeysHandler(KeysOptions{}), http.MethodGet, "domain=llm&descriptor=user=alice", "")
	if w.Code != http.StatusOK || len(res.Descriptors) != 1 || len(res.Descriptors[0].Limits) != 2 {
		t.Fatalf("inspect: %d %s", w.Code, w.Body)
	}
	if kl := res.Descriptors[0].Limits[1]; kl.Algorithm != "concurrency" || kl.SlotsHeld != 2 || kl.Remaining != 0 || kl.InDebt || kl.ResetAfter != 60 {
		t.Errorf("inspect: %+v, want 2 slots held, none free", kl)
	}
	for op, want := range map[string]float64{"acquired": 3, "refused": 2, "released": 1} {
		if got := slotOpsCount(t, reg, op); got != want {
			t.Errorf("rls_slot_operations_total{op=%q} = %v, want %v", op, got, want)
		}
	}
}

// slotOpsCount reads rls_slot_operations_total{op} from reg.
func slotOpsCount(t *testing.T, reg *prometheus.Registry, op string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "rls_slot_operations_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "op" && lp.GetValue() == op {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestSlotIDNeverALabel: under detailed_metric, the rule label is the descriptor's entries
// without its slot entries, so that slot ids never become label values.
func TestSlotIDNeverALabel(t *testing.T) {
	t.Parallel()
	rs, err := descriptors.Parse(map[string][]byte{"llm.yaml": []byte(`domain: llm
descriptors:
  - key: model
    detailed_metric: true
    concurrency: {max_in_flight: 2, slot_lifetime: 1m}
`)})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(rs, Options{Backend: m, Metrics: metrics})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"id-1", "id-2"} {
		if _, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "llm",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{desc("model", "m", SlotEntry, id)}}); err != nil {
			t.Fatal(err)
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "rls_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "rule" && lp.GetValue() != "model=m" {
					t.Errorf("rule label %q, want model=m", lp.GetValue())
				}
			}
		}
	}
}
