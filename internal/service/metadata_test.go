package service

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

// metadataRules are envoyproxy/ratelimit's example of quota-based service selection
// (examples/ratelimit/config/example.yaml), and rules whose metadata overlap.
const metadataRules = `
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: service_1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota: {name: service_2}
  - key: a
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {tier: a, nested: {x: from_a, only_a: 1}}
  - key: b
    rate_limit: {unit: hour, requests_per_unit: 10}
    metadata: {tier: b, b: true, nested: {x: from_b, only_b: 2}}
  - key: s
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {shadowed: yes}
  - key: deny
    rate_limit: {unit: hour, requests_per_unit: 0}
`

func newMetadataService(t *testing.T, opts Options, load descriptors.Options) *Service {
	t.Helper()
	rs, err := descriptors.ParseWith(map[string][]byte{"rl.yaml": []byte(metadataRules)}, load)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	if opts.Backend, err = backend.NewMemory(backend.MemoryOptions{Now: func() time.Time { return now }}); err != nil {
		t.Fatal(err)
	}
	svc, err := New(rs, opts)
	if err != nil {
		t.Fatal(err)
	}
	return svc
}

// metaOf asks svc and returns the codes and the dynamic metadata as JSON ("" for none).
func metaOf(t *testing.T, svc *Service, ds ...*ratelimitv3.RateLimitDescriptor) (string, string) {
	t.Helper()
	resp, err := svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: ds})
	if err != nil {
		t.Fatal(err)
	}
	if resp.DynamicMetadata == nil {
		return codesOf(resp), ""
	}
	b, err := json.Marshal(resp.DynamicMetadata.AsMap())
	if err != nil {
		t.Fatal(err)
	}
	return codesOf(resp), string(b)
}

// TestMetadataAsRatelimit: a rule's metadata is nested under "metadata", the first passing
// descriptor's value of a key wins (objects merged key by key), and a descriptor that did not
// pass adds none, as envoyproxy/ratelimit's ratelimitToMetadata does.
func TestMetadataAsRatelimit(t *testing.T) {
	t.Run("service selection", func(t *testing.T) {
		// envoyproxy/ratelimit's multiservice-tokenquota script: checks (hits 0) of both
		// services, the one that served charged 1 once the response is sent. Charged after
		// the fact, past the limit: with overdraft, as envoyproxy/ratelimit counts.
		svc := newMetadataService(t, Options{}, descriptors.Options{Overdraft: true})
		both := func() []*ratelimitv3.RateLimitDescriptor {
			return []*ratelimitv3.RateLimitDescriptor{withHits(desc("service", "service_1"), 0), withHits(desc("service", "service_2"), 0)}
		}
		const s1 = `{"metadata":{"service_with_quota":{"name":"service_1"}},"quotaModeEnabled":true,"quotaModeViolations":[]}`
		const s2 = `{"metadata":{"service_with_quota":{"name":"service_2"}},"quotaModeEnabled":true,"quotaModeViolations":[0]}`
		steps := []struct {
			codes, md string
			serve     string // charged after the check
		}{
			{"OK OK OK", s1, "service_1"},
			{"OK OK OK", s1, "service_1"},
			{"OK OVER_LIMIT OK", s2, "service_2"},
			{"OK OVER_LIMIT OK", s2, "service_2"},
			{"OK OVER_LIMIT OK", s2, "service_2"},
			{"OVER_LIMIT OVER_LIMIT OVER_LIMIT", `{"quotaModeEnabled":true,"quotaModeViolations":[0,1]}`, ""},
		}
		for i, st := range steps {
			codes, md := metaOf(t, svc, both()...)
			if codes != st.codes || md != st.md {
				t.Fatalf("request %d: %s %s, want %s %s", i+1, codes, md, st.codes, st.md)
			}
			if st.serve != "" {
				metaOf(t, svc, withHits(desc("service", st.serve), 1))
			}
		}
	})
	t.Run("first wins", func(t *testing.T) {
		svc := newMetadataService(t, Options{}, descriptors.Options{})
		for i, tc := range []struct {
			ds []*ratelimitv3.RateLimitDescriptor
			md string
		}{
			{[]*ratelimitv3.RateLimitDescriptor{desc("b", "1"), desc("a", "1")},
				`{"metadata":{"b":true,"nested":{"only_a":1,"only_b":2,"x":"from_b"},"tier":"b"}}`},
			// a is over its 1 an hour now: it adds nothing, though b passes and the
			// request is denied.
			{[]*ratelimitv3.RateLimitDescriptor{desc("a", "1"), desc("b", "1")},
				`{"metadata":{"b":true,"nested":{"only_b":2,"x":"from_b"},"tier":"b"}}`},
			{[]*ratelimitv3.RateLimitDescriptor{desc("a", "2"), desc("b", "2")},
				`{"metadata":{"b":true,"nested":{"only_a":1,"only_b":2,"x":"from_a"},"tier":"a"}}`},
			// The rules' own metadata were not changed by the merges.
			{[]*ratelimitv3.RateLimitDescriptor{desc("a", "3")}, `{"metadata":{"nested":{"only_a":1,"x":"from_a"},"tier":"a"}}`},
			// A rule without metadata, a descriptor no rule matches, one denied: none.
			{[]*ratelimitv3.RateLimitDescriptor{desc("deny", "x"), desc("nothing", "x")}, ``},
		} {
			if _, md := metaOf(t, svc, tc.ds...); md != tc.md {
				t.Errorf("request %d: metadata %s, want %s", i, md, tc.md)
			}
		}
	})
	t.Run("shadow mode", func(t *testing.T) {
		// A shadow rule over its limit passes (status OK): its metadata counts. Under
		// --shadow-mode a denied descriptor did not pass, though the answer is OK.
		svc := newMetadataService(t, Options{}, descriptors.Options{})
		for i := range 2 {
			if codes, md := metaOf(t, svc, desc("s", "1")); codes != "OK OK" || md != `{"metadata":{"shadowed":"yes"}}` {
				t.Errorf("shadow rule, request %d: %s %s", i, codes, md)
			}
		}
		svc = newMetadataService(t, Options{ShadowMode: true}, descriptors.Options{})
		metaOf(t, svc, desc("a", "1"))
		if codes, md := metaOf(t, svc, desc("a", "1"), desc("b", "1")); codes != "OK OK OK" || md != `{"metadata":{"b":true,"nested":{"only_b":2,"x":"from_b"},"tier":"b"}}` {
			t.Errorf("--shadow-mode, a over: %s %s, want b's metadata only", codes, md)
		}
	})
}

func withHits(d *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(hits)
	return d
}
