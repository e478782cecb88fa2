package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitconfv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	localrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	yamlv3 "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/proto"

	"github.com/rls-project/rls/api"
	"github.com/rls-project/rls/internal/envoytest"
)

// The Envoy bootstraps: each parses and validates as Envoy would, and the two-tier set-up
// (local buckets in Envoy, global limits in rls) keeps the properties deploy/envoy/README.md
// relies on.

func TestEnvoyBootstrapsParseAndValidate(t *testing.T) {
	for _, file := range yamlFiles(t)[kindEnvoy] {
		t.Run(file, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			bs, anys, err := envoytest.Parse(data)
			if err != nil {
				t.Fatal(err)
			}
			// Every "@type" in the file is an Any the walk must have unpacked and validated.
			if want := bytes.Count(data, []byte(`"@type":`)); anys != want {
				t.Errorf("validated %d typed configs, the file has %d", anys, want)
			}
			if len(bs.GetStaticResources().GetListeners()) == 0 || len(bs.GetStaticResources().GetClusters()) == 0 {
				t.Error("no listeners or no clusters")
			}
		})
	}
}

// TestBootstrapCheckRejects shows that the check above can fail: each broken copy of
// envoy.yaml must be rejected, for the reason given.
func TestBootstrapCheckRejects(t *testing.T) {
	orig, err := os.ReadFile("envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"misspelled field", "failure_mode_deny: false", "failure_mode_denied: false", "unknown field"},
		{"unregistered typed_config", "router.v3.Router", "router.v3.Routr", "router.v3.Routr"},
		{"empty domain inside a typed_config", "domain: edge\n", "domain: \"\"\n", "Domain"},
		{"empty stat_prefix inside a typed_config", "stat_prefix: local_rate_limit", "stat_prefix: \"\"", "StatPrefix"},
		{"bad request_type inside a typed_config", "request_type: both", "request_type: sometimes", "RequestType"},
		{"zero token bucket fill interval", "fill_interval: 0.05s", "fill_interval: 0s", "FillInterval"},
		{"empty cluster name at the top level", "- name: echo\n", "- name: \"\"\n", "Name"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Contains(orig, []byte(tt.old)) {
				t.Fatalf("envoy.yaml no longer contains %q", tt.old)
			}
			broken := bytes.Replace(orig, []byte(tt.old), []byte(tt.new), 1)
			_, _, err := envoytest.Parse(broken)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

// ruleFiles decodes deploy/envoy/rules with the rule file schema, strictly.
func ruleFiles(t *testing.T) map[string]api.RuleFile { return ruleFilesOf(t, kindRules) }

// ruleFilesOf decodes the rule files of one kind, strictly.
func ruleFilesOf(t *testing.T, kind string) map[string]api.RuleFile {
	t.Helper()
	out := map[string]api.RuleFile{}
	for _, file := range yamlFiles(t)[kind] {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		dec := yamlv3.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		var rf api.RuleFile
		if err := dec.Decode(&rf); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out[rf.Domain] = rf
	}
	return out
}

var unitSeconds = map[string]float64{"second": 1, "minute": 60, "hour": 3600, "day": 86400}

// perSecond is a rule's sustained rate and its burst.
func perSecond(t *testing.T, rl *api.RateLimit) (rate float64, burst uint32) {
	t.Helper()
	secs, ok := unitSeconds[strings.ToLower(rl.Unit)]
	if !ok {
		t.Fatalf("unit %q", rl.Unit)
	}
	if rl.UnitMultiplier != nil {
		secs *= float64(*rl.UnitMultiplier)
	}
	burst = rl.RequestsPerUnit
	if rl.Burst != nil {
		burst = *rl.Burst
	}
	return float64(rl.RequestsPerUnit) / secs, burst
}

func bucketRate(tb *typev3.TokenBucket) float64 {
	n := float64(1)
	if tb.GetTokensPerFill() != nil {
		n = float64(tb.GetTokensPerFill().GetValue())
	}
	return n / tb.GetFillInterval().AsDuration().Seconds()
}

func hundredPercent(p *corev3.RuntimeFractionalPercent) bool {
	d := p.GetDefaultValue()
	return d.GetDenominator() == typev3.FractionalPercent_HUNDRED && d.GetNumerator() == 100
}

// TestTwoTierInvariants checks the properties deploy/envoy/README.md relies on, in both
// bootstraps.
func TestTwoTierInvariants(t *testing.T) {
	rules := ruleFiles(t)
	for _, file := range yamlFiles(t)[kindEnvoy] {
		if filepath.Base(file) == tokensBootstrap || filepath.Base(file) == "envoy-inflight.yaml" {
			continue // not an edge proxy: TestTokenBootstrap and TestInflightBootstrap check them
		}
		e := envoytest.LoadEdge(t, file)
		checks := []struct {
			name  string
			check func() error
		}{
			{"local tier, then global tier, then router", func() error {
				want := []string{"envoy.filters.http.local_ratelimit", "envoy.filters.http.ratelimit", "envoy.filters.http.router"}
				if !slices.Equal(e.Filters, want) {
					return fmt.Errorf("HTTP filters %q, want %q", e.Filters, want)
				}
				return nil
			}},
			{"local tier enabled and enforced for every request", func() error {
				if !hundredPercent(e.Local.GetFilterEnabled()) || !hundredPercent(e.Local.GetFilterEnforced()) {
					return fmt.Errorf("filter_enabled %v, filter_enforced %v; both default to 0%%", e.Local.GetFilterEnabled(), e.Local.GetFilterEnforced())
				}
				return nil
			}},
			{"global tier fails open with headers and Retry-After", func() error {
				g := e.Global
				if g.GetFailureModeDeny() || g.GetFailureModeDenyPercent() != nil {
					return errors.New("fails closed")
				}
				if g.GetEnableXRatelimitHeaders() != httprlv3.RateLimit_DRAFT_VERSION_03 || !g.GetEnableRetryAfterHeader() {
					return fmt.Errorf("headers %v, retry-after %v", g.GetEnableXRatelimitHeaders(), g.GetEnableRetryAfterHeader())
				}
				if g.GetTimeout() == nil || g.GetTimeout().AsDuration() <= 0 || g.GetTimeout().AsDuration() > 100*time.Millisecond {
					return fmt.Errorf("timeout %v: want a bound of at most 100ms", g.GetTimeout().AsDuration())
				}
				return nil
			}},
			{"only the global tier sends X-RateLimit headers", func() error {
				// Both filters append: two sets of headers would reach every client.
				if e.Local.GetEnableXRatelimitHeaders() != 0 {
					return fmt.Errorf("local tier sends %v", e.Local.GetEnableXRatelimitHeaders())
				}
				return nil
			}},
			{"domains have rule files", func() error {
				for _, d := range []string{e.Global.GetDomain(), e.TCP.GetDomain()} {
					if _, ok := rules[d]; !ok {
						return fmt.Errorf("domain %q has no file in envoy/rules", d)
					}
				}
				return nil
			}},
			{"rate limit services are HTTP/2 gRPC clusters with keepalive, health check and room", func() error {
				for _, svc := range []*ratelimitconfv3.RateLimitServiceConfig{e.Global.GetRateLimitService(), e.TCP.GetRateLimitService()} {
					if err := checkRLSCluster(t, e, svc); err != nil {
						return err
					}
				}
				return nil
			}},
			{"local per-key bucket never tighter than a plan", func() error {
				return checkLocalAbovePlans(t, e.Local, rules[e.Global.GetDomain()])
			}},
		}
		for _, c := range checks {
			t.Run(file+"/"+c.name, func(t *testing.T) {
				if err := c.check(); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

func checkRLSCluster(t *testing.T, e *envoytest.Edge, svc *ratelimitconfv3.RateLimitServiceConfig) error {
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		return errors.New("transport_api_version is not V3")
	}
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	c, ok := e.Clusters[name]
	if !ok {
		return fmt.Errorf("rate limit service cluster %q does not exist", name)
	}
	opts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		return fmt.Errorf("cluster %q: no HttpProtocolOptions, so Envoy speaks HTTP/1.1 to a gRPC server", name)
	}
	h2 := envoytest.Unpack[*upstreamhttpv3.HttpProtocolOptions](t, opts).GetExplicitHttpConfig().GetHttp2ProtocolOptions()
	if h2 == nil {
		return fmt.Errorf("cluster %q: not explicitly HTTP/2", name)
	}
	if ka := h2.GetConnectionKeepalive(); ka.GetInterval() == nil || ka.GetTimeout() == nil {
		return fmt.Errorf("cluster %q: no connection keepalive", name)
	}
	var healthChecked bool
	for _, hc := range c.GetHealthChecks() {
		healthChecked = healthChecked || hc.GetGrpcHealthCheck().GetServiceName() == rlsHealthService
	}
	if !healthChecked {
		return fmt.Errorf("cluster %q: no gRPC health check of %s", name, rlsHealthService)
	}
	// At most max_tokens requests pass the local default bucket at once, each one RPC.
	var maxRequests uint32
	for _, th := range c.GetCircuitBreakers().GetThresholds() {
		if th.GetPriority() == corev3.RoutingPriority_DEFAULT {
			maxRequests = th.GetMaxRequests().GetValue()
		}
	}
	if burst := e.Local.GetTokenBucket().GetMaxTokens(); maxRequests < burst {
		return fmt.Errorf("cluster %q: circuit breaker max_requests %d is below the %d requests the local tier admits at once", name, maxRequests, burst)
	}
	return nil
}

// checkLocalAbovePlans: one client's connection stays on one proxy, so the proxy's per-key
// bucket must admit at least what the most generous plan does, or the local tier would deny
// requests that rls admits.
func checkLocalAbovePlans(t *testing.T, local *localrlv3.LocalRateLimit, rules api.RuleFile) error {
	var perKey *typev3.TokenBucket
	for _, d := range local.GetDescriptors() {
		if len(d.GetEntries()) == 1 && d.GetEntries()[0].GetKey() == "api_key" && d.GetEntries()[0].GetValue() == "" {
			perKey = d.GetTokenBucket()
		}
	}
	if perKey == nil {
		return errors.New("no per-API-key local bucket (entries: [{key: api_key}])")
	}
	plans := 0
	for _, top := range rules.Descriptors {
		if top.Key != "plan" {
			continue
		}
		for _, child := range top.Descriptors {
			if child.Key != "api_key" || child.RateLimit == nil {
				continue
			}
			plans++
			rate, burst := perSecond(t, child.RateLimit)
			if got := bucketRate(perKey); got < rate {
				return fmt.Errorf("plan %s: %.2f/s, local per-key bucket refills %.2f/s", top.Value, rate, got)
			}
			if got := perKey.GetMaxTokens(); got < burst {
				return fmt.Errorf("plan %s: burst %d, local per-key bucket holds %d", top.Value, burst, got)
			}
		}
	}
	if plans != 3 {
		return fmt.Errorf("found %d plans in the rules, want free, premium and enterprise", plans)
	}
	return nil
}

// TestTLSBootstrapDiffersOnlyInTransport keeps envoy-tls.yaml a copy of envoy.yaml plus mutual
// TLS to rls, with what a gRPC server over TLS requires of Envoy.
func TestTLSBootstrapDiffersOnlyInTransport(t *testing.T) {
	plain := envoytest.Load(t, "envoy/envoy.yaml")
	withTLS := envoytest.Load(t, "envoy/envoy-tls.yaml")
	var rls *clusterv3.Cluster
	for _, c := range withTLS.GetStaticResources().GetClusters() {
		if c.GetName() == "rls" {
			rls = c
		} else if c.GetTransportSocket() != nil {
			t.Errorf("cluster %q has a transport socket too", c.GetName())
		}
	}
	if rls == nil {
		t.Fatal("no rls cluster")
	}
	ctx := envoytest.Unpack[*tlsv3.UpstreamTlsContext](t, rls.GetTransportSocket().GetTypedConfig())
	if ctx == nil {
		t.Fatal("rls cluster: transport socket is not an UpstreamTlsContext")
	}
	common := ctx.GetCommonTlsContext()
	checks := []struct {
		name string
		ok   bool
	}{
		{"alpn_protocols is [h2], which gRPC servers require", slices.Equal(common.GetAlpnProtocols(), []string{"h2"})},
		{"sni is set", ctx.GetSni() != ""},
		{"a client certificate is presented", len(common.GetTlsCertificates()) == 1},
		{"the server is verified against a CA", common.GetValidationContext().GetTrustedCa() != nil},
		{"the server's name is checked", len(common.GetValidationContext().GetMatchTypedSubjectAltNames()) > 0},
	}
	for _, c := range checks {
		if !c.ok {
			t.Errorf("rls cluster: want %s", c.name)
		}
	}
	rls.TransportSocket = nil
	if !proto.Equal(plain, withTLS) {
		t.Error("envoy-tls.yaml differs from envoy.yaml in more than the rls cluster's transport_socket")
	}
}
