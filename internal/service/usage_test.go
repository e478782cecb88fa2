package service

import (
	"context"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

const tokenRules = `
domain: ai
descriptors:
  - key: api_key
    descriptors:
      - key: model
        rate_limit: {unit: minute, requests_per_unit: 1000, overdraft: true}
  - key: plain_key
    descriptors:
      - key: model
        rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 2}
`

type usageFixture struct {
	svc   *Service
	mem   *backend.Memory
	clock time.Time
}

func newUsageFixture(t *testing.T) *usageFixture {
	t.Helper()
	rs, err := descriptors.Parse(map[string][]byte{"ai.yaml": []byte(tokenRules)})
	if err != nil {
		t.Fatal(err)
	}
	f := &usageFixture{clock: time.Unix(1_800_000_000, 0)}
	if f.mem, err = backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return f.clock }}); err != nil {
		t.Fatal(err)
	}
	if f.svc, err = New(rs, Options{Backend: f.mem}); err != nil {
		t.Fatal(err)
	}
	return f
}

// tokens is a descriptor with a per-descriptor hits_addend (nil: none).
func tokens(key, model string, hits *uint64) *ratelimitv3.RateLimitDescriptor {
	d := desc(key, "k1", "model", model)
	if hits != nil {
		d.HitsAddend = wrapperspb.UInt64(*hits)
	}
	return d
}

func u64(v uint64) *uint64 { return &v }

func (f *usageFixture) ask(t *testing.T, hits uint32, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := f.svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// TestUsageSequence: usage reported after the fact, through the service: 800 then 5000 tokens on
// a 1000-a-minute key put it 4800 tokens in debt, and checks are denied for 4.8 minutes, with
// limit_remaining 0 and duration_until_reset the time until repaid; without overdraft the 5000
// are denied and not charged.
func TestUsageSequence(t *testing.T) {
	f := newUsageFixture(t)
	for _, tc := range []struct {
		name      string
		key       string
		hits      *uint64
		reqHits   uint32
		advance   time.Duration
		code      string
		remaining uint32
		reset     time.Duration
	}{
		{"check", "api_key", u64(0), 0, 0, "OK OK", 1000, 0},
		{"report 800", "api_key", u64(800), 0, 0, "OK OK", 200, 48 * time.Second},
		{"report 5000: over, charged, answered as the key is after it", "api_key", u64(5000), 0, 0, "OVER_LIMIT OVER_LIMIT", 0, 288 * time.Second},
		{"check in debt", "api_key", u64(0), 0, 0, "OVER_LIMIT OVER_LIMIT", 0, 288 * time.Second},
		{"request-level hits_addend 0 means 1: denied in debt", "api_key", nil, 0, 0, "OVER_LIMIT OVER_LIMIT", 0, 288*time.Second + 60*time.Millisecond},
		{"check a microsecond before repaid", "api_key", u64(0), 0, 288*time.Second + 60*time.Millisecond - time.Microsecond, "OVER_LIMIT OVER_LIMIT", 0, time.Microsecond},
		{"check when repaid: 0 remaining is admitted", "api_key", u64(0), 0, time.Microsecond, "OK OK", 0, 60 * time.Second},
		{"plain: report 800", "plain_key", u64(800), 0, 0, "OK OK", 200, 48 * time.Second},
		{"plain: report 5000 denied, not charged, no wait said (none admits it)", "plain_key", u64(5000), 0, 0, "OVER_LIMIT OVER_LIMIT", 200, 0},
		{"plain: check admitted", "plain_key", u64(0), 0, 0, "OK OK", 200, 48 * time.Second},
		{"plain: request-level hits_addend 150", "plain_key", nil, 150, 0, "OK OK", 50, 57 * time.Second},
	} {
		f.clock = f.clock.Add(tc.advance)
		r := f.ask(t, tc.reqHits, tokens(tc.key, "m", tc.hits))
		st := r.Statuses[0]
		if codesOf(r) != tc.code || st.LimitRemaining != tc.remaining || st.DurationUntilReset.AsDuration() != tc.reset {
			t.Fatalf("%s: %s remaining %d reset %v, want %s %d %v", tc.name, codesOf(r), st.LimitRemaining, st.DurationUntilReset.AsDuration(), tc.code, tc.remaining, tc.reset)
		}
	}
	// Another model is another key: untouched.
	if r := f.ask(t, 0, tokens("api_key", "other", u64(0))); codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 1000 {
		t.Fatalf("another key: %v", r)
	}
}

// TestUsageAllOrNothing: an overdraft report beside an ordinary limit that denies is charged
// nowhere; beside one that admits, both are charged and the answer is OVER_LIMIT.
func TestUsageAllOrNothing(t *testing.T) {
	f := newUsageFixture(t)
	f.ask(t, 0, desc("route", "r"), desc("route", "r")) // route: 0 of 2 left
	r := f.ask(t, 0, tokens("api_key", "m", u64(5000)), desc("route", "r"))
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("report beside a denial: %s", codesOf(r))
	}
	if r := f.ask(t, 0, tokens("api_key", "m", u64(0))); codesOf(r) != "OK OK" || r.Statuses[0].LimitRemaining != 1000 {
		t.Fatalf("after a refused batch: %v, want nothing charged", r)
	}
	r = f.ask(t, 0, tokens("api_key", "m", u64(5000)), desc("route", "other"))
	if codesOf(r) != "OVER_LIMIT OVER_LIMIT OK" || r.Statuses[1].LimitRemaining != 1 {
		t.Fatalf("report beside an admission: %v", r)
	}
	if r := f.ask(t, 0, tokens("api_key", "m", u64(0))); codesOf(r) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("after a charged batch: %v, want the key in debt", r)
	}
}
