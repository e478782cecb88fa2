package integration

import (
	"fmt"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/rls-project/rls/internal/envoytest"
)

// TestEnvoyInflightDescriptors plays Envoy running deploy/envoy/envoy-inflight.yaml against the
// real rls loaded with deploy/envoy/rules-inflight: it derives from the route's two rate limits
// the descriptors Envoy sends when a request arrives (the acquire) and when its stream is done
// (the release), and checks what docs/concurrency.md promises: 20 requests of a key in flight,
// the 21st refused until one ends; a stream's end releases its slot once, however often it is
// sent; a refused request's end frees nothing; another key is untouched.
func TestEnvoyInflightDescriptors(t *testing.T) {
	t.Parallel()
	bs := envoytest.Load(t, envoyFile("envoy-inflight.yaml"))
	var hcm *hcmv3.HttpConnectionManager
	var global *httprlv3.RateLimit
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, f := range l.GetFilterChains()[0].GetFilters() {
			if h := envoytest.Unpack[*hcmv3.HttpConnectionManager](t, f.GetTypedConfig()); h != nil {
				hcm = h
			}
		}
	}
	for _, f := range hcm.GetHttpFilters() {
		if g := envoytest.Unpack[*httprlv3.RateLimit](t, f.GetTypedConfig()); g != nil {
			global = g
		}
	}
	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
	per := envoytest.Unpack[*httprlv3.RateLimitPerRoute](t, route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"])

	// derive is Envoy's descriptor derivation for one phase, for a request with headers.
	derive := func(headers map[string]string, streamDone bool) []*ratelimitv3.RateLimitDescriptor {
		var out []*ratelimitv3.RateLimitDescriptor
	limits:
		for _, rl := range per.GetRateLimits() {
			if rl.GetApplyOnStreamDone() != streamDone {
				continue
			}
			desc := &ratelimitv3.RateLimitDescriptor{}
			for _, a := range rl.GetActions() {
				switch {
				case a.GetRequestHeaders() != nil:
					rh := a.GetRequestHeaders()
					v, ok := headers[rh.GetHeaderName()]
					if !ok {
						continue limits
					}
					desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rh.GetDescriptorKey(), Value: v})
				case a.GetGenericKey() != nil:
					g := a.GetGenericKey()
					key := g.GetDescriptorKey()
					if key == "" {
						key = "generic_key"
					}
					desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: g.GetDescriptorValue()})
				default:
					t.Fatalf("action %v is not modelled", a)
				}
			}
			out = append(out, desc)
		}
		return out
	}

	p := startRLS(t, nil, "--config", envoyFile("rules-inflight"))
	c := p.client(t)
	ok := func(headers map[string]string, streamDone bool) bool {
		t.Helper()
		descs := derive(headers, streamDone)
		if len(descs) != 1 {
			t.Fatalf("%v (stream done %v): %d descriptors, want 1", headers, streamDone, len(descs))
		}
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: global.GetDomain(), Descriptors: descs})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
	}
	request := func(key string, id int) map[string]string {
		return map[string]string{"x-api-key": key, "x-request-id": fmt.Sprintf("req-%d", id)}
	}

	for i := range 20 {
		if !ok(request("k1", i), false) {
			t.Fatalf("request %d of 20 in flight refused", i)
		}
	}
	if ok(request("k1", 20), false) {
		t.Fatal("a 21st request in flight admitted")
	}
	ok(request("k1", 20), true) // the refused request's end frees nothing
	if ok(request("k1", 21), false) {
		t.Fatal("a refused request's release freed a slot")
	}
	ok(request("k1", 0), true)
	ok(request("k1", 0), true) // sent twice
	if !ok(request("k1", 22), false) {
		t.Fatal("the release of request 0 freed no slot")
	}
	if ok(request("k1", 23), false) {
		t.Fatal("a release sent twice freed two slots")
	}
	if !ok(request("k2", 0), false) {
		t.Fatal("another API key refused")
	}
}
