package client_test

import (
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/internal/rlstest"
)

// headerRules limit per key (3 an hour, one every 1,200 s), per plan (3 a day, unnamed, one every
// 28,800 s) and globally (1,000 per 30 days, a name to escape, one every 2,592 s).
const headerRules = `
domain: test
descriptors:
  - {key: api_key, rate_limit: {name: per_key, unit: hour, requests_per_unit: 3}}
  - {key: plan, rate_limit: {unit: day, requests_per_unit: 3}}
  - {key: generic_key, value: global, rate_limit: {name: 'gl"obal', unit: day, unit_multiplier: 30, requests_per_unit: 1000}}
`

// TestHeaderStylesMatchServer holds rls's headers (--response-headers) and the client's
// (Decision.Header) to the same expectations, in both styles: rls with the legacy headers named
// as Envoy names them, the client's legacy style. The third descriptor matches no rule.
func TestHeaderStylesMatchServer(t *testing.T) {
	descs := []client.Descriptor{client.Desc("api_key", "k"), client.Desc("plan", "free"),
		client.Desc("nothing", "matches"), client.GenericKey("global")}
	styles := []struct {
		name  string
		style client.HeaderStyle
		args  []string
		steps []http.Header // after the first request, then after the fourth (denied)
	}{
		{"draft", client.HeadersDraft, []string{"--response-headers", "draft"}, []http.Header{{
			"Ratelimit-Policy": {`"per_key";q=3;w=3600, "descriptor-1";q=3;w=86400, "gl\"obal";q=1000;w=2592000`},
			"Ratelimit":        {`"per_key";r=2;t=1200, "descriptor-1";r=2;t=28800, "gl\"obal";r=999;t=2592`},
		}, {
			"Ratelimit-Policy": {`"per_key";q=3;w=3600, "descriptor-1";q=3;w=86400, "gl\"obal";q=1000;w=2592000`},
			"Ratelimit":        {`"per_key";r=0;t=1200, "descriptor-1";r=0;t=28800, "gl\"obal";r=997;t=7776`},
			"Retry-After":      {"28800"},
		}}},
		{"legacy", client.HeadersLegacy, []string{"--response-headers", "legacy", "--response-header-limit", "X-RateLimit-Limit",
			"--response-header-remaining", "X-RateLimit-Remaining", "--response-header-reset", "X-RateLimit-Reset"}, []http.Header{{
			"X-Ratelimit-Limit":     {`3, 3;w=3600;name="per_key", 3;w=86400, 1000;w=2592000;name="gl\"obal"`},
			"X-Ratelimit-Remaining": {"2"},
			"X-Ratelimit-Reset":     {"1200"},
		}, {
			"X-Ratelimit-Limit":     {`3, 3;w=3600;name="per_key", 3;w=86400, 1000;w=2592000;name="gl\"obal"`},
			"X-Ratelimit-Remaining": {"0"},
			"X-Ratelimit-Reset":     {"1200"},
			"Retry-After":           {"28800"},
		}}},
	}
	for _, s := range styles {
		t.Run(s.name, func(t *testing.T) {
			p := rlstest.Start(t, rlstest.Options{Rules: headerRules, Args: s.args})
			c := newClient(t, p.GRPCAddr, client.Options{Timeout: 5 * time.Second})
			for n := 1; n <= 4; n++ {
				d, err := c.Check(ctxT(t), descs...)
				if err != nil {
					t.Fatal(err)
				}
				var want http.Header
				switch n {
				case 1:
					want = s.steps[0]
				case 4:
					want = s.steps[1]
				default:
					continue
				}
				if !reflect.DeepEqual(d.RLSHeaders, want) {
					t.Errorf("request %d: rls sent %v\nwant %v", n, d.RLSHeaders, want)
				}
				own := d
				own.RLSHeaders = nil
				if got := own.Header(s.style); !reflect.DeepEqual(got, want) {
					t.Errorf("request %d: the client wrote %v\nwant %v", n, got, want)
				}
			}
		})
	}
}
