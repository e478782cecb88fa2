package deploy_test

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	luav3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3"
	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/proto"

	"github.com/rls-project/rls/internal/envoytest"
)

// tokensBootstrap is the token-limit example: a check at request time and a report of the
// tokens used when the stream is done.
const tokensBootstrap = "envoy-tokens.yaml"

// TestTokenBootstrap checks what deploy/envoy/README.md says of envoy-tokens.yaml: the route
// sends a check (hits_addend 0) and, at stream end, a report whose hits come from the dynamic
// metadata the Lua filter sets, both for the same descriptor; the domain's rule has overdraft
// on every limit; the filter answers 429 with Retry-After. (Strict decoding and validation of
// every typed_config: TestEnvoyBootstrapsParseAndValidate.)
func TestTokenBootstrap(t *testing.T) {
	bs := envoytest.Load(t, "envoy/"+tokensBootstrap)
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
	var names []string
	var lua *luav3.Lua
	var global *httprlv3.RateLimit
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
		if l := envoytest.Unpack[*luav3.Lua](t, f.GetTypedConfig()); l != nil {
			lua = l
		}
		if g := envoytest.Unpack[*httprlv3.RateLimit](t, f.GetTypedConfig()); g != nil {
			global = g
		}
	}
	if want := []string{"envoy.filters.http.lua", "envoy.filters.http.ratelimit", "envoy.filters.http.router"}; !slices.Equal(names, want) {
		t.Fatalf("HTTP filters %q, want %q", names, want)
	}
	if global.GetFailureModeDeny() || !global.GetEnableRetryAfterHeader() || global.GetRateLimitedStatus().GetCode() != 429 ||
		(global.GetRequestType() != "both" && global.GetRequestType() != "") {
		t.Errorf("ratelimit filter: %v", global)
	}

	vhs := hcm.GetRouteConfig().GetVirtualHosts()
	if len(vhs) != 1 || len(vhs[0].GetRoutes()) != 1 || len(vhs[0].GetRateLimits()) > 0 || len(vhs[0].GetRoutes()[0].GetRoute().GetRateLimits()) > 0 {
		t.Fatal("want one virtual host with one route, its rate limits in typed_per_filter_config only (hits_addend is honoured only there)")
	}
	per := envoytest.Unpack[*httprlv3.RateLimitPerRoute](t, vhs[0].GetRoutes()[0].GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"])
	if per == nil || len(per.GetRateLimits()) != 2 {
		t.Fatalf("route: want a RateLimitPerRoute with two rate_limits, got %v", per)
	}
	check, report := per.GetRateLimits()[0], per.GetRateLimits()[1]
	if check.GetApplyOnStreamDone() || check.GetHitsAddend().GetNumber() == nil || check.GetHitsAddend().GetNumber().GetValue() != 0 {
		t.Errorf("first rate limit: want a request-time check with hits_addend number 0, got %v", check)
	}
	if !report.GetApplyOnStreamDone() || report.GetHitsAddend().GetNumber() != nil || report.GetHitsAddend().GetIsNegativeHits() {
		t.Errorf("second rate limit: want apply_on_stream_done with a hits_addend format, got %v", report)
	}
	m := regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:)]+):([^:)]+)\)%$`).FindStringSubmatch(report.GetHitsAddend().GetFormat())
	if m == nil {
		t.Fatalf("report's hits_addend format %q: want one %%DYNAMIC_METADATA(namespace:key)%%", report.GetHitsAddend().GetFormat())
	}
	if src := lua.GetDefaultSourceCode().GetInlineString(); !strings.Contains(src, fmt.Sprintf(`dynamicMetadata():set(%q, %q,`, m[1], m[2])) {
		t.Errorf("the Lua filter does not set %s:%s", m[1], m[2])
	}
	// Both actions must name the same descriptor, or the report charges another key.
	if len(check.GetActions()) == 0 || len(check.GetActions()) != len(report.GetActions()) {
		t.Fatal("the check and the report have different actions")
	}
	var path []string
	for i, a := range check.GetActions() {
		if !sameAction(a, report.GetActions()[i]) {
			t.Errorf("action %d differs between the check and the report", i)
		}
		rh := a.GetRequestHeaders()
		if rh == nil {
			t.Fatalf("action %d: only request_headers actions are expected", i)
		}
		path = append(path, rh.GetDescriptorKey())
	}

	// The domain's rule for that descriptor, every limit with overdraft.
	rf, ok := ruleFilesOf(t, kindTokens)[global.GetDomain()]
	if !ok {
		t.Fatalf("domain %q has no file in envoy/rules-tokens", global.GetDomain())
	}
	nodes := rf.Descriptors
	for depth, key := range path {
		found := false
		for _, d := range nodes {
			if d.Key == key && d.Value == "" {
				found = true
				if depth < len(path)-1 {
					nodes = d.Descriptors
					continue
				}
				if len(d.RateLimits) == 0 {
					t.Fatalf("rule %s: no rate_limits", strings.Join(path, "/"))
				}
				for _, rl := range d.RateLimits {
					if !rl.Overdraft {
						t.Errorf("rule %s: limit %q without overdraft: a report past it would be refused whole", strings.Join(path, "/"), rl.Name)
					}
				}
			}
		}
		if !found {
			t.Fatalf("no rule for %s in domain %q", strings.Join(path[:depth+1], "/"), global.GetDomain())
		}
	}
}

func sameAction(a, b *routev3.RateLimit_Action) bool { return proto.Equal(a, b) }
