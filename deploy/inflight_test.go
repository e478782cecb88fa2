package deploy_test

import (
	"os"
	"slices"
	"testing"

	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/envoytest"
	"github.com/rls-project/rls/internal/limit"
	"github.com/rls-project/rls/internal/service"
)

// TestInflightBootstrap checks what docs/concurrency.md says of envoy-inflight.yaml: the route
// acquires at request time with the request's id as the slot entry and, when the stream is
// done, sends the same descriptor with the release entry; the rule that descriptor matches in
// rules-inflight has a concurrency limit. (Strict decoding and validation of every
// typed_config: TestEnvoyBootstrapsParseAndValidate.)
func TestInflightBootstrap(t *testing.T) {
	t.Parallel()
	bs := envoytest.Load(t, "envoy/envoy-inflight.yaml")
	var hcm *hcmv3.HttpConnectionManager
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if h := envoytest.Unpack[*hcmv3.HttpConnectionManager](t, f.GetTypedConfig()); h != nil {
					hcm = h
				}
			}
		}
	}
	if hcm == nil {
		t.Fatal("no HTTP connection manager")
	}
	if !hcm.GetUseRemoteAddress().GetValue() || hcm.GetPreserveExternalRequestId() {
		t.Error("an edge proxy that keeps clients' x-request-id lets a client name another request's slot")
	}
	var global *httprlv3.RateLimit
	for _, f := range hcm.GetHttpFilters() {
		if g := envoytest.Unpack[*httprlv3.RateLimit](t, f.GetTypedConfig()); g != nil {
			global = g
		}
	}
	if global == nil {
		t.Fatal("no ratelimit filter")
	}
	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
	per := envoytest.Unpack[*httprlv3.RateLimitPerRoute](t, route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"])
	if per == nil || len(per.GetRateLimits()) != 2 {
		t.Fatalf("route: want two rate_limits, got %v", per)
	}
	acquire, release := per.GetRateLimits()[0], per.GetRateLimits()[1]
	if acquire.GetApplyOnStreamDone() || !release.GetApplyOnStreamDone() {
		t.Fatal("want the acquire at request time and the release when the stream is done")
	}
	n := len(acquire.GetActions())
	if len(release.GetActions()) != n+1 || !slices.EqualFunc(acquire.GetActions(), release.GetActions()[:n], sameAction) {
		t.Fatal("the release must send the acquire's descriptor and then the release entry")
	}
	slot := acquire.GetActions()[n-1].GetRequestHeaders()
	if slot.GetHeaderName() != "x-request-id" || slot.GetDescriptorKey() != service.SlotEntry {
		t.Errorf("the acquire's last entry: %v, want x-request-id as %s", slot, service.SlotEntry)
	}
	if g := release.GetActions()[n].GetGenericKey(); g.GetDescriptorKey() != service.ReleaseEntry {
		t.Errorf("the release's last entry: %v, want %s", g, service.ReleaseEntry)
	}

	// The rule the descriptor matches (its entries but the slot's) holds a concurrency limit.
	data, err := os.ReadFile("envoy/rules-inflight/llm_inflight.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := descriptors.Parse(map[string][]byte{"llm_inflight.yaml": data})
	if err != nil {
		t.Fatal(err)
	}
	var entries []descriptors.Entry
	for _, a := range acquire.GetActions()[:n-1] {
		entries = append(entries, descriptors.Entry{Key: a.GetRequestHeaders().GetDescriptorKey(), Value: "v"})
	}
	r := rs.Match(global.GetDomain(), entries)
	if r == nil || !slices.ContainsFunc(r.Limits, func(l descriptors.Limit) bool { return l.Spec.Algorithm == limit.Concurrency }) {
		t.Fatalf("domain %s: no concurrency limit for %v", global.GetDomain(), entries)
	}
}
