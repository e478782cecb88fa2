package descriptors

import (
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/limit"
)

// TestConcurrencyRule: a concurrency field beside rate_limit makes a Concurrency limit of its
// own key tag after the rule's rate limits; alone, the rule's only limit.
func TestConcurrencyRule(t *testing.T) {
	t.Parallel()
	rs, err := Parse(map[string][]byte{"f.yaml": []byte(`domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 60}
    concurrency: {max_in_flight: 20, slot_lifetime: 10m}
  - key: model
    concurrency: {max_in_flight: 3, slot_lifetime: 1500ms}
    shadow_mode: true
`)})
	if err != nil {
		t.Fatal(err)
	}
	r := rs.Match("d", []Entry{{"user", "alice"}})
	if r == nil || len(r.Limits) != 2 {
		t.Fatalf("user: %+v", r)
	}
	c := r.Limits[1]
	want := limit.Limit{Rate: 20, Burst: 20, Period: 10 * time.Minute, Algorithm: limit.Concurrency}
	if c.Spec != want || c.KeyTag != "c" || r.Limits[0].KeyTag != "0" {
		t.Errorf("concurrency limit %+v, want spec %+v and tag c", c, want)
	}
	r = rs.Match("d", []Entry{{"model", "m"}})
	if r == nil || len(r.Limits) != 1 || r.Limits[0].Spec.Period != 1500*time.Millisecond || !r.ShadowMode {
		t.Fatalf("model: %+v", r)
	}
}

// TestConcurrencyErrors: each mistake in a concurrency field is reported at its file and line.
func TestConcurrencyErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ body, want string }{
		{"    concurrency: {max_in_flight: 0, slot_lifetime: 1m}\n", "f.yaml:4: domain \"d\": descriptor k: concurrency: max_in_flight 0 must be from 1 to 10000"},
		{"    concurrency: {max_in_flight: 10001, slot_lifetime: 1m}\n", "f.yaml:4: domain \"d\": descriptor k: concurrency: max_in_flight 10001 must be from 1 to 10000"},
		{"    concurrency:\n      max_in_flight: 2\n      slot_lifetime: soon\n", "f.yaml:6: domain \"d\": descriptor k: concurrency: slot_lifetime \"soon\": want a duration"},
		{"    concurrency:\n      max_in_flight: 2\n      slot_lifetime: 25h\n", "f.yaml:6: domain \"d\": descriptor k: concurrency: slot_lifetime 25h is longer than 24h0m0s"},
		{"    concurrency:\n      max_in_flight: 2\n      slot_lifetime: 1500us\n", "f.yaml:6: domain \"d\": descriptor k: concurrency: slot_lifetime 1500us must be a whole number of milliseconds"},
		{"    concurrency: {slot_lifetime: 1m}\n", "f.yaml:4: domain \"d\": descriptor k: concurrency: max_in_flight is required"},
		{"    concurrency: {max_in_flight: 2}\n", "f.yaml:4: domain \"d\": descriptor k: concurrency: slot_lifetime is required"},
		{"    concurrency: {max_in_flight: 2, slot_lifetime: 1m, burst: 3}\n", "f.yaml:4"},
		{"    concurrency: 5\n", "f.yaml:4: domain \"d\": descriptor k: concurrency must be a mapping"},
		{"    quota_mode: true\n    concurrency: {max_in_flight: 2, slot_lifetime: 1m}\n", "f.yaml:4: domain \"d\": descriptor k: quota_mode does not apply with concurrency"},
	} {
		_, err := Parse(map[string][]byte{"f.yaml": []byte("domain: d\ndescriptors:\n  - key: k\n" + tc.body)})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.body, err, tc.want)
		}
	}
}
