package service

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

func askCodes(t *testing.T, f *fixture, n int, kv ...string) string {
	t.Helper()
	var out []string
	for range n {
		r := f.ask(t, desc(kv...))
		out = append(out, r.OverallCode.String()+"/"+r.Statuses[0].Code.String())
	}
	return strings.Join(out, " ")
}

func TestGlobalShadowMode(t *testing.T) {
	// ip allows 2 per second: the third is denied, unless every rule is in shadow mode.
	if got, want := askCodes(t, newFixture(t, Options{}), 3, "ip", "a"), "OK/OK OK/OK OVER_LIMIT/OVER_LIMIT"; got != want {
		t.Errorf("without: %s, want %s", got, want)
	}
	f := newFixture(t, Options{ShadowMode: true})
	if got, want := askCodes(t, f, 3, "ip", "a"), "OK/OK OK/OK OK/OK"; got != want {
		t.Errorf("--shadow-mode: %s, want %s", got, want)
	}
	// Counted as shadow_mode, as a rule's own shadow_mode is.
	if got := f.outcomeCount(t, "shadow_mode"); got != 1 {
		t.Errorf("shadow_mode outcomes %v, want 1", got)
	}
}

func TestGlobalQuotaMode(t *testing.T) {
	f := newFixture(t, Options{QuotaMode: true})
	var last *rlsv3.RateLimitResponse
	for range 3 {
		last = f.ask(t, desc("ip", "q"))
	}
	md := last.GetDynamicMetadata().AsMap()
	if md["quotaModeEnabled"] != true {
		t.Fatalf("metadata %v: want quotaModeEnabled as for a rule with quota_mode", md)
	}
	if v, _ := md["quotaModeViolations"].([]any); len(v) != 1 {
		t.Errorf("quotaModeViolations %v, want the one descriptor", md["quotaModeViolations"])
	}
	if got := newFixture(t, Options{}).ask(t, desc("ip", "q")).GetDynamicMetadata(); got != nil {
		t.Errorf("without --quota-mode: metadata %v, want none", got)
	}
}

// outcomeCount sums rls_decisions_total for outcome.
func (f *fixture) outcomeCount(t *testing.T, outcome string) float64 {
	t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, mf := range mfs {
		if mf.GetName() != "rls_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					n += m.GetCounter().GetValue()
				}
			}
		}
	}
	return n
}
