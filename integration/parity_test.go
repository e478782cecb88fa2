package integration

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/redistest"
)

// Where rls answers as envoyproxy/ratelimit does for setups written for it: a rule's metadata in
// the response (where the proxy reads it, which wins), and limit overrides in unknown domains.

// serviceRules are the service_with_quota rules of envoyproxy/ratelimit's example configuration
// (examples/ratelimit/config/example.yaml), and two rules whose metadata overlap.
const serviceRules = `
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota:
        name: "service_1"
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota:
        name: "service_2"
  - key: tier
    value: gold
    rate_limit: {unit: hour, requests_per_unit: 100}
    metadata: {route: {cluster: gold, pool: a}}
  - key: tier
    value: silver
    rate_limit: {unit: hour, requests_per_unit: 100}
    metadata: {route: {cluster: silver, zone: b}}
  - key: banned
    rate_limit: {unit: hour, requests_per_unit: 0}
    metadata: {route: {cluster: banned}}
`

// metaString reads the response's dynamic metadata at path, as Envoy's
// %DYNAMIC_METADATA(envoy.filters.http.ratelimit:path...)% does: "" where there is nothing.
func metaString(resp *rlsv3.RateLimitResponse, path ...string) string {
	v := structpb.NewStructValue(resp.GetDynamicMetadata())
	for _, p := range path {
		v = v.GetStructValue().GetFields()[p]
	}
	return v.GetStringValue()
}

// TestMultiserviceTokenQuota replays envoyproxy/ratelimit's
// integration-test/scripts/multiservice-tokenquota.sh against the descriptors its example proxy
// sends (examples/envoy/proxy.yaml, /multiservice-tokenquota): a check of both services (hits
// 0) at request time, the one that served charged 1 when the stream is done, and the proxy
// routing to %DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service_with_quota:name)%.
// service_1 (1 a minute) serves twice, service_2 (2 a minute) three times, then the request is
// denied. The charge after the fact goes past the limit: --overdraft counts it, as
// envoyproxy/ratelimit counts every hit.
func TestMultiserviceTokenQuota(t *testing.T) {
	rules := writeRules(t, map[string]string{"rl.yaml": serviceRules})
	for _, be := range []struct {
		name string
		args func() []string
	}{
		{"memory", func() []string { return []string{"--backend", "memory"} }},
		{"redis", func() []string {
			return []string{"--backend", "redis", "--redis-url", "redis://" + redistest.Start(t).Addr()}
		}},
	} {
		t.Run(be.name, func(t *testing.T) {
			p := startRLS(t, nil, append([]string{"--config", rules, "--overdraft"}, be.args()...)...)
			c := p.client(t)
			check := func() *rlsv3.RateLimitResponse {
				t.Helper()
				resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*ratelimitv3.RateLimitDescriptor{
					withHitsAddend(d("service", "service_1"), 0), withHitsAddend(d("service", "service_2"), 0)}})
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			for i, want := range []string{"service_1", "service_1", "service_2", "service_2", "service_2", ""} {
				resp := check()
				served := metaString(resp, "metadata", "service_with_quota", "name")
				if want == "" {
					if resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || served != "" {
						t.Fatalf("request %d: %s, metadata %v; want OVER_LIMIT with no service", i+1, codes_(resp), resp.GetDynamicMetadata())
					}
					break
				}
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || served != want {
					t.Fatalf("request %d: %s, routed to %q (metadata %v); want OK, %s", i+1, codes_(resp), served, resp.GetDynamicMetadata(), want)
				}
				// The stream done: the service that served is charged 1.
				if _, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*ratelimitv3.RateLimitDescriptor{
					withHitsAddend(d("service", served), 1)}}); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestFirstMetadataWins: when several passing descriptors' rules set a key, the first
// descriptor's value wins and objects merge key by key; a denied descriptor adds nothing, while
// one that passed adds its metadata though the request is denied.
func TestFirstMetadataWins(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"rl.yaml": serviceRules}), "--backend", "memory")
	c := p.client(t)
	for _, tc := range []struct {
		name              string
		ds                []*ratelimitv3.RateLimitDescriptor
		code              rlsv3.RateLimitResponse_Code
		cluster, pool, zn string
	}{
		{"gold first", []*ratelimitv3.RateLimitDescriptor{d("tier", "gold"), d("tier", "silver")}, rlsv3.RateLimitResponse_OK, "gold", "a", "b"},
		{"silver first", []*ratelimitv3.RateLimitDescriptor{d("tier", "silver"), d("tier", "gold")}, rlsv3.RateLimitResponse_OK, "silver", "a", "b"},
		{"denied first", []*ratelimitv3.RateLimitDescriptor{d("banned", "x"), d("tier", "silver")}, rlsv3.RateLimitResponse_OVER_LIMIT, "silver", "", "b"},
	} {
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: tc.ds})
		if err != nil {
			t.Fatal(err)
		}
		got := [3]string{metaString(resp, "metadata", "route", "cluster"), metaString(resp, "metadata", "route", "pool"), metaString(resp, "metadata", "route", "zone")}
		if resp.GetOverallCode() != tc.code || got != [3]string{tc.cluster, tc.pool, tc.zn} {
			t.Errorf("%s: %s, metadata route %q; want %s, %q", tc.name, codes_(resp), got, tc.code, [3]string{tc.cluster, tc.pool, tc.zn})
		}
		if metaString(resp, "route", "cluster") != "" {
			t.Errorf("%s: metadata at the top level too: %v", tc.name, resp.GetDynamicMetadata())
		}
	}
}

// TestOverrideInUnknownDomain: a descriptor's limit override in a domain no rule defines is
// answered OK with no current_limit, however low the override and whatever the hits, as
// envoyproxy/ratelimit answers (its GetLimit returns no limit for an unknown domain); in a
// known domain it applies even where no rule matches.
func TestOverrideInUnknownDomain(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"rl.yaml": serviceRules}), "--backend", "memory")
	c := p.client(t)
	override := func(domain string, hits uint32) *rlsv3.RateLimitResponse {
		t.Helper()
		desc := d("tier", "override-me")
		desc.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hits, Descriptors: []*ratelimitv3.RateLimitDescriptor{desc}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i, hits := range []uint32{0, 1, 5, 0} {
		if resp := override("nowhere", hits); codes_(resp) != "OK OK" || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Fatalf("unknown domain, request %d (hits %d): %v, want OK with no current_limit", i+1, hits, resp)
		}
	}
	if resp := override("rl", 0); codes_(resp) != "OK OK" || resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit() != 1 {
		t.Fatalf("known domain, no rule matching: %v, want the override's 1 an hour", resp)
	}
	if resp := override("rl", 0); codes_(resp) != "OVER_LIMIT OVER_LIMIT" {
		t.Fatalf("known domain, second request: %v, want the override denying", resp)
	}
}

func withHitsAddend(desc *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
	desc.HitsAddend = wrapperspb.UInt64(hits)
	return desc
}
