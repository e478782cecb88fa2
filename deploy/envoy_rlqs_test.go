package deploy_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	rlqsfv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/envoytest"
	"github.com/rls-project/rls/internal/rlqs"
)

// rlqsFilter returns the bootstrap's rate_limit_quota filter and its bucket settings (the
// matchers' actions, then on_no_match's).
func rlqsFilter(t *testing.T, data []byte) (*rlqsfv3.RateLimitQuotaFilterConfig, []*rlqsfv3.RateLimitQuotaBucketSettings, []string) {
	t.Helper()
	bs, anys, err := envoytest.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if want := bytes.Count(data, []byte(`"@type":`)); anys != want {
		t.Errorf("validated %d typed configs, the file has %d", anys, want)
	}
	var cfg *rlqsfv3.RateLimitQuotaFilterConfig
	var filters []string
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				hcm := &hcmv3.HttpConnectionManager{}
				if f.GetTypedConfig().UnmarshalTo(hcm) != nil {
					continue
				}
				for _, hf := range hcm.GetHttpFilters() {
					filters = append(filters, hf.GetName())
					c := &rlqsfv3.RateLimitQuotaFilterConfig{}
					if hf.GetTypedConfig().UnmarshalTo(c) == nil {
						cfg = c
					}
				}
			}
		}
	}
	if cfg == nil {
		t.Fatal("no rate_limit_quota filter")
	}
	var settings []*rlqsfv3.RateLimitQuotaBucketSettings
	unpack := func(a *anypb.Any) {
		s := &rlqsfv3.RateLimitQuotaBucketSettings{}
		if err := a.UnmarshalTo(s); err != nil {
			t.Fatalf("bucket matcher action: %v", err)
		}
		settings = append(settings, s)
	}
	for _, m := range cfg.GetBucketMatchers().GetMatcherList().GetMatchers() {
		unpack(m.GetOnMatch().GetAction().GetTypedConfig())
	}
	if a := cfg.GetBucketMatchers().GetOnNoMatch().GetAction(); a != nil {
		unpack(a.GetTypedConfig())
	}
	return cfg, settings, filters
}

// TestRLQSBootstrap checks the properties docs/rlqs.md relies on.
func TestRLQSBootstrap(t *testing.T) {
	data, err := os.ReadFile("envoy/envoy-rlqs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, settings, filters := rlqsFilter(t, data)
	rs, err := descriptors.Load("envoy/rules/edge_quota.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(filters) != 2 || filters[0] != "envoy.filters.http.rate_limit_quota" || filters[1] != "envoy.filters.http.router" {
		t.Errorf("HTTP filters %q, want the rate_limit_quota filter, then the router", filters)
	}
	if !rs.HasDomain(cfg.GetDomain()) {
		t.Errorf("domain %q has no rules in edge_quota.yaml", cfg.GetDomain())
	}
	if cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName() != "rls" {
		t.Errorf("rlqs_server %v, want cluster rls", cfg.GetRlqsServer())
	}
	if len(settings) != 2 {
		t.Fatalf("%d bucket settings, want by API key and by client address", len(settings))
	}
	for i, s := range settings {
		// Every bucket the builders make must map to a rule: its keys with any values.
		id := map[string]string{}
		for k := range s.GetBucketIdBuilder().GetBucketIdBuilder() {
			id[k] = "x"
		}
		var entries []descriptors.Entry
		for k, v := range id {
			entries = append(entries, descriptors.Entry{Key: k, Value: v})
		}
		if rs.Match(cfg.GetDomain(), entries) == nil {
			t.Errorf("settings %d: bucket %v matches no rule", i, id)
		}
		// Reports come often enough that an assignment never expires between them.
		if ri := s.GetReportingInterval().AsDuration(); ri <= 0 || 2*ri > rlqs.DefaultTTL {
			t.Errorf("settings %d: reporting_interval %v, want at most half the assignment TTL %v", i, ri, rlqs.DefaultTTL)
		}
		// Fail-closed: no proxy admits beyond its share for longer than one TTL.
		if s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL ||
			s.GetNoAssignmentBehavior().GetFallbackRateLimit().GetStrategy() == nil {
			t.Errorf("settings %d: no_assignment_behavior %v, want DENY_ALL", i, s.GetNoAssignmentBehavior())
		}
		if s.GetExpiredAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL ||
			s.GetExpiredAssignmentBehavior().GetReuseLastAssignment() != nil {
			t.Errorf("settings %d: expired_assignment_behavior %v, want DENY_ALL", i, s.GetExpiredAssignmentBehavior())
		}
		if s.GetDenyResponseSettings().GetHttpStatus().GetCode() != typev3.StatusCode_TooManyRequests {
			t.Errorf("settings %d: deny response %v, want 429", i, s.GetDenyResponseSettings())
		}
	}
}

// TestRLQSBootstrapCheckRejects shows that the checks can fail.
func TestRLQSBootstrapCheckRejects(t *testing.T) {
	orig, err := os.ReadFile("envoy/envoy-rlqs.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ name, old, new, want string }{
		{"misspelled field", "reporting_interval: 1s", "reporting_intervals: 1s", "unknown field"},
		{"zero reporting interval", "reporting_interval: 1s", "reporting_interval: 0s", "ReportingInterval"},
		{"empty domain", "domain: edge_quota", `domain: ""`, "Domain"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if !strings.Contains(string(orig), tt.old) {
				t.Fatalf("envoy-rlqs.yaml no longer contains %q", tt.old)
			}
			_, _, err := envoytest.Parse(bytes.Replace(orig, []byte(tt.old), []byte(tt.new), 1))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}
