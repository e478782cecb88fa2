// Package deploy_test checks that the deployment files under deploy/ (and the Dockerfile) are
// ones Envoy, Kubernetes, Compose and Docker accept, and that they agree with each other.
package deploy_test

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	ratelimitconfv3 "github.com/envoyproxy/go-control-plane/envoy/config/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	localrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/local_ratelimit/v3"
	netrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	yamlv3 "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/rls-project/rls/api"
)

// rlsHealthService is the gRPC health service name Envoy and Kubernetes probe.
var rlsHealthService = rlsv3.RateLimitService_ServiceDesc.ServiceName

// The kinds of YAML file under deploy/. Every file must be one of them, so a new file cannot
// escape checking.
const (
	kindEnvoy   = "envoy bootstrap"
	kindRules   = "rls rules"
	kindK8s     = "kubernetes manifests"
	kindCompose = "compose file"
)

// yamlFiles classifies every *.yaml and *.yml under deploy/ (the current directory).
func yamlFiles(t *testing.T) map[string][]string {
	t.Helper()
	byKind := map[string][]string{}
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(p); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		var top map[string]any
		if err := yaml.Unmarshal(data, &top); err != nil && !strings.HasPrefix(p, "kubernetes/") {
			return fmt.Errorf("%s: %v", p, err)
		}
		switch {
		case strings.HasPrefix(p, filepath.Join("envoy", "rules")+string(filepath.Separator)):
			byKind[kindRules] = append(byKind[kindRules], p)
		case top["static_resources"] != nil:
			byKind[kindEnvoy] = append(byKind[kindEnvoy], p)
		case strings.HasPrefix(p, "kubernetes"+string(filepath.Separator)):
			byKind[kindK8s] = append(byKind[kindK8s], p)
		case p == "compose.yaml":
			byKind[kindCompose] = append(byKind[kindCompose], p)
		default:
			return fmt.Errorf("%s: not an Envoy bootstrap, rule file, Kubernetes manifest or compose file; teach deploy_test.go to check it", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return byKind
}

func TestEveryYAMLFileIsChecked(t *testing.T) {
	got := yamlFiles(t)
	want := map[string][]string{
		kindEnvoy:   {"envoy/envoy-tls.yaml", "envoy/envoy.yaml"},
		kindRules:   {"envoy/rules/edge.yaml", "envoy/rules/edge_tcp.yaml"},
		kindCompose: {"compose.yaml"},
	}
	for kind, files := range want {
		if !slices.Equal(got[kind], files) {
			t.Errorf("%s: got %q, want %q", kind, got[kind], files)
		}
	}
	if len(got[kindK8s]) < 6 {
		t.Errorf("%s: got %q, want the namespace, deployment, service, configmap, PDB, HPA and Redis", kindK8s, got[kindK8s])
	}
}

// parseBootstrap decodes an Envoy bootstrap as Envoy would: unknown fields are errors, every
// "@type" must resolve, and every message, including those packed in Any, must pass its
// validation rules. It returns how many Any values it checked.
func parseBootstrap(data []byte) (*bootstrapv3.Bootstrap, int, error) {
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, 0, err
	}
	bs := &bootstrapv3.Bootstrap{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(js, bs); err != nil {
		return nil, 0, err
	}
	var errs []error
	if err := bs.ValidateAll(); err != nil {
		errs = append(errs, err)
	}
	w := &anyWalker{}
	w.message(bs.ProtoReflect(), "bootstrap")
	return bs, w.anys, errors.Join(append(errs, w.errs...)...)
}

// anyWalker visits every message reachable from a root. The generated ValidateAll methods stop
// at google.protobuf.Any, which is where every typed_config lives, so the walker unpacks each
// Any, validates its content and carries on inside it.
type anyWalker struct {
	anys int
	errs []error
}

func (w *anyWalker) message(m protoreflect.Message, at string) {
	if m.Descriptor().FullName() == "google.protobuf.Any" {
		w.anys++
		a := m.Interface().(*anypb.Any)
		inner, err := a.UnmarshalNew()
		if err != nil {
			w.errs = append(w.errs, fmt.Errorf("%s: %s: %w", at, a.GetTypeUrl(), err))
			return
		}
		v, ok := inner.(interface{ ValidateAll() error })
		if !ok {
			w.errs = append(w.errs, fmt.Errorf("%s: %s has no validation rules to check", at, a.GetTypeUrl()))
			return
		}
		if err := v.ValidateAll(); err != nil {
			w.errs = append(w.errs, fmt.Errorf("%s: %s: %w", at, a.GetTypeUrl(), err))
		}
		m = inner.ProtoReflect()
		at += "(" + string(m.Descriptor().FullName()) + ")"
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		at := at + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() == nil {
				return true
			}
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				w.message(mv.Message(), fmt.Sprintf("%s[%q]", at, k.String()))
				return true
			})
		case fd.Message() == nil:
		case fd.IsList():
			for i := range v.List().Len() {
				w.message(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", at, i))
			}
		default:
			w.message(v.Message(), at)
		}
		return true
	})
}

func TestEnvoyBootstrapsParseAndValidate(t *testing.T) {
	for _, file := range yamlFiles(t)[kindEnvoy] {
		t.Run(file, func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			bs, anys, err := parseBootstrap(data)
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
			_, _, err := parseBootstrap(broken)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

func loadBootstrap(t *testing.T, file string) *bootstrapv3.Bootstrap {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bs, _, err := parseBootstrap(data)
	if err != nil {
		t.Fatal(err)
	}
	return bs
}

// unpack returns a's content as a T, or nil when a holds another type.
func unpack[T proto.Message](t *testing.T, a *anypb.Any) T {
	t.Helper()
	var zero T
	m, err := a.UnmarshalNew()
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := m.(T); ok {
		return v
	}
	return zero
}

// edge is what the two-tier checks need out of envoy.yaml.
type edge struct {
	bs       *bootstrapv3.Bootstrap
	hcm      *hcmv3.HttpConnectionManager
	filters  []string // HTTP filter names, in order
	local    *localrlv3.LocalRateLimit
	global   *httprlv3.RateLimit
	tcp      *netrlv3.RateLimit
	clusters map[string]*clusterv3.Cluster
}

func loadEdge(t *testing.T, file string) *edge {
	t.Helper()
	e := &edge{bs: loadBootstrap(t, file), clusters: map[string]*clusterv3.Cluster{}}
	for _, c := range e.bs.GetStaticResources().GetClusters() {
		e.clusters[c.GetName()] = c
	}
	for _, l := range e.bs.GetStaticResources().GetListeners() {
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if h := unpack[*hcmv3.HttpConnectionManager](t, f.GetTypedConfig()); h != nil {
					e.hcm = h
				}
				if r := unpack[*netrlv3.RateLimit](t, f.GetTypedConfig()); r != nil {
					e.tcp = r
				}
			}
		}
	}
	if e.hcm == nil || e.tcp == nil {
		t.Fatalf("%s: want an HTTP connection manager and a network ratelimit filter", file)
	}
	for _, f := range e.hcm.GetHttpFilters() {
		e.filters = append(e.filters, f.GetName())
		if l := unpack[*localrlv3.LocalRateLimit](t, f.GetTypedConfig()); l != nil {
			e.local = l
		}
		if g := unpack[*httprlv3.RateLimit](t, f.GetTypedConfig()); g != nil {
			e.global = g
		}
	}
	if e.local == nil || e.global == nil {
		t.Fatalf("%s: want local_ratelimit and ratelimit HTTP filters", file)
	}
	return e
}

// ruleFiles decodes deploy/envoy/rules with the rule file schema, strictly.
func ruleFiles(t *testing.T) map[string]api.RuleFile {
	t.Helper()
	out := map[string]api.RuleFile{}
	for _, file := range yamlFiles(t)[kindRules] {
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
		e := loadEdge(t, file)
		checks := []struct {
			name  string
			check func() error
		}{
			{"local tier, then global tier, then router", func() error {
				want := []string{"envoy.filters.http.local_ratelimit", "envoy.filters.http.ratelimit", "envoy.filters.http.router"}
				if !slices.Equal(e.filters, want) {
					return fmt.Errorf("HTTP filters %q, want %q", e.filters, want)
				}
				return nil
			}},
			{"local tier enabled and enforced for every request", func() error {
				if !hundredPercent(e.local.GetFilterEnabled()) || !hundredPercent(e.local.GetFilterEnforced()) {
					return fmt.Errorf("filter_enabled %v, filter_enforced %v; both default to 0%%", e.local.GetFilterEnabled(), e.local.GetFilterEnforced())
				}
				return nil
			}},
			{"global tier fails open with headers and Retry-After", func() error {
				g := e.global
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
				if e.local.GetEnableXRatelimitHeaders() != 0 {
					return fmt.Errorf("local tier sends %v", e.local.GetEnableXRatelimitHeaders())
				}
				return nil
			}},
			{"domains have rule files", func() error {
				for _, d := range []string{e.global.GetDomain(), e.tcp.GetDomain()} {
					if _, ok := rules[d]; !ok {
						return fmt.Errorf("domain %q has no file in envoy/rules", d)
					}
				}
				return nil
			}},
			{"rate limit services are HTTP/2 gRPC clusters with keepalive, health check and room", func() error {
				for _, svc := range []*ratelimitconfv3.RateLimitServiceConfig{e.global.GetRateLimitService(), e.tcp.GetRateLimitService()} {
					if err := checkRLSCluster(t, e, svc); err != nil {
						return err
					}
				}
				return nil
			}},
			{"local per-key bucket never tighter than a plan", func() error {
				return checkLocalAbovePlans(t, e.local, rules[e.global.GetDomain()])
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

func checkRLSCluster(t *testing.T, e *edge, svc *ratelimitconfv3.RateLimitServiceConfig) error {
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		return errors.New("transport_api_version is not V3")
	}
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	c, ok := e.clusters[name]
	if !ok {
		return fmt.Errorf("rate limit service cluster %q does not exist", name)
	}
	opts, ok := c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
	if !ok {
		return fmt.Errorf("cluster %q: no HttpProtocolOptions, so Envoy speaks HTTP/1.1 to a gRPC server", name)
	}
	h2 := unpack[*upstreamhttpv3.HttpProtocolOptions](t, opts).GetExplicitHttpConfig().GetHttp2ProtocolOptions()
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
	if burst := e.local.GetTokenBucket().GetMaxTokens(); maxRequests < burst {
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
	plain := loadBootstrap(t, "envoy/envoy.yaml")
	withTLS := loadBootstrap(t, "envoy/envoy-tls.yaml")
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
	ctx := unpack[*tlsv3.UpstreamTlsContext](t, rls.GetTransportSocket().GetTypedConfig())
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

// pinned reports why an image reference is not pinned to a version, or nil.
func pinned(ref string) error {
	if strings.Contains(ref, "@sha256:") {
		return nil
	}
	name := ref[strings.LastIndex(ref, "/")+1:]
	_, tag, ok := strings.Cut(name, ":")
	switch {
	case !ok:
		return fmt.Errorf("image %q has no tag", ref)
	case tag == "latest" || !regexp.MustCompile(`\d+\.\d+`).MatchString(tag):
		return fmt.Errorf("image %q: tag %q is not a version", ref, tag)
	}
	return nil
}

// k8sObjects decodes every document of every manifest strictly into its k8s.io/api type.
func k8sObjects(t *testing.T) []metav1.Object {
	t.Helper()
	newObject := map[string]func() metav1.Object{
		"v1/Namespace":                           func() metav1.Object { return &corev1.Namespace{} },
		"v1/ConfigMap":                           func() metav1.Object { return &corev1.ConfigMap{} },
		"v1/Service":                             func() metav1.Object { return &corev1.Service{} },
		"apps/v1/Deployment":                     func() metav1.Object { return &appsv1.Deployment{} },
		"policy/v1/PodDisruptionBudget":          func() metav1.Object { return &policyv1.PodDisruptionBudget{} },
		"autoscaling/v2/HorizontalPodAutoscaler": func() metav1.Object { return &autoscalingv2.HorizontalPodAutoscaler{} },
	}
	var objs []metav1.Object
	for _, file := range yamlFiles(t)[kindK8s] {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(data), -1) {
			if strings.TrimSpace(regexp.MustCompile(`(?m)^#.*$`).ReplaceAllString(doc, "")) == "" {
				continue
			}
			var tm struct {
				APIVersion string `json:"apiVersion"`
				Kind       string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
				t.Fatalf("%s document %d: %v", file, i+1, err)
			}
			mk, ok := newObject[tm.APIVersion+"/"+tm.Kind]
			if !ok {
				t.Fatalf("%s document %d: %s %s is not a kind this test decodes", file, i+1, tm.APIVersion, tm.Kind)
			}
			obj := mk()
			if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
				t.Fatalf("%s document %d (%s): %v", file, i+1, tm.Kind, err)
			}
			objs = append(objs, obj)
		}
	}
	return objs
}

func only[T metav1.Object](t *testing.T, objs []metav1.Object, name string) T {
	t.Helper()
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok && o.GetName() == name {
			found = append(found, v)
		}
	}
	if len(found) != 1 {
		var zero T
		t.Fatalf("want one %T named %q, found %d", zero, name, len(found))
	}
	return found[0]
}

// flagValues maps each --name=value (or --name value) of args to its value.
func flagValues(args []string) map[string]string {
	out := map[string]string{}
	for i := 0; i < len(args); i++ {
		name, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			continue
		}
		if n, v, ok := strings.Cut(name, "="); ok {
			out[n] = v
		} else if i+1 < len(args) {
			out[name] = args[i+1]
			i++
		}
	}
	return out
}

func TestKubernetesManifests(t *testing.T) {
	objs := k8sObjects(t)
	dep := only[*appsv1.Deployment](t, objs, "rls")
	svc := only[*corev1.Service](t, objs, "rls")
	pdb := only[*policyv1.PodDisruptionBudget](t, objs, "rls")
	hpa := only[*autoscalingv2.HorizontalPodAutoscaler](t, objs, "rls")
	cm := only[*corev1.ConfigMap](t, objs, "rls-rules")
	redisSvc := only[*corev1.Service](t, objs, "redis")
	envoyKeepalive := loadEdge(t, "envoy/envoy.yaml").clusters["rls"].GetTypedExtensionProtocolOptions()
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("rls pod has %d containers", len(pod.Containers))
	}
	c := pod.Containers[0]
	flags := flagValues(c.Args)
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	podLabels := dep.Spec.Template.Labels

	checks := []struct {
		name  string
		check func() error
	}{
		{"every namespaced object is in one namespace", func() error {
			for _, o := range objs {
				if _, isNS := o.(*corev1.Namespace); !isNS && o.GetNamespace() != "ratelimit" {
					return fmt.Errorf("%T %q is in namespace %q", o, o.GetName(), o.GetNamespace())
				}
			}
			return nil
		}},
		{"images pinned", func() error {
			for _, o := range objs {
				if d, ok := o.(*appsv1.Deployment); ok {
					for _, c := range d.Spec.Template.Spec.Containers {
						if err := pinned(c.Image); err != nil {
							return err
						}
					}
				}
			}
			return nil
		}},
		{"deployment selector matches its pods, replicas left to the autoscaler", func() error {
			for k, v := range dep.Spec.Selector.MatchLabels {
				if podLabels[k] != v {
					return fmt.Errorf("selector %s=%s does not match pod labels %v", k, v, podLabels)
				}
			}
			if dep.Spec.Replicas != nil {
				return errors.New("replicas is set; every apply would undo the autoscaler")
			}
			return nil
		}},
		{"gRPC readiness and liveness probes on the RLS health service", func() error {
			for name, p := range map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
				if p == nil || p.GRPC == nil {
					return fmt.Errorf("%s probe is not a gRPC probe", name)
				}
				if p.GRPC.Port != ports["grpc"] || p.GRPC.Service == nil || *p.GRPC.Service != rlsHealthService {
					return fmt.Errorf("%s probe checks port %d service %v, want %d %s", name, p.GRPC.Port, p.GRPC.Service, ports["grpc"], rlsHealthService)
				}
			}
			if ports["grpc"] != 8081 {
				return fmt.Errorf("grpc port %d, rls listens on 8081 by default", ports["grpc"])
			}
			return nil
		}},
		{"rules ConfigMap mounted as a directory at --config", func() error {
			var vol string
			for _, v := range pod.Volumes {
				if v.ConfigMap != nil && v.ConfigMap.Name == cm.Name {
					vol = v.Name
				}
			}
			for _, m := range c.VolumeMounts {
				if m.Name != vol {
					continue
				}
				if m.SubPath != "" || m.SubPathExpr != "" {
					return errors.New("subPath mounts never receive ConfigMap updates")
				}
				if flags["config"] != m.MountPath {
					return fmt.Errorf("--config %q, rules mounted at %q", flags["config"], m.MountPath)
				}
				return nil
			}
			return fmt.Errorf("ConfigMap %q is not mounted", cm.Name)
		}},
		{"ConfigMap holds exactly the rule files", func() error {
			files := yamlFiles(t)[kindRules]
			if len(cm.Data) != len(files) {
				return fmt.Errorf("ConfigMap has %d files, envoy/rules has %d", len(cm.Data), len(files))
			}
			for _, f := range files {
				want, err := os.ReadFile(f)
				if err != nil {
					return err
				}
				if cm.Data[filepath.Base(f)] != string(want) {
					return fmt.Errorf("ConfigMap's %s differs from %s; regenerate it (see rules-configmap.yaml)", filepath.Base(f), f)
				}
			}
			return nil
		}},
		{"Redis backend points at the Redis Service", func() error {
			want := fmt.Sprintf("redis://%s:%d", redisSvc.Name, redisSvc.Spec.Ports[0].Port)
			if flags["backend"] != "redis" || flags["redis-url"] != want {
				return fmt.Errorf("--backend %q --redis-url %q, want redis %s", flags["backend"], flags["redis-url"], want)
			}
			return nil
		}},
		{"keepalive policy accepts Envoy's pings", func() error {
			minTime, err := time.ParseDuration(flags["grpc-keepalive-min-time"])
			if err != nil {
				return fmt.Errorf("--grpc-keepalive-min-time: %v", err)
			}
			h2 := unpack[*upstreamhttpv3.HttpProtocolOptions](t, envoyKeepalive["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]).GetExplicitHttpConfig().GetHttp2ProtocolOptions()
			if interval := h2.GetConnectionKeepalive().GetInterval().AsDuration(); minTime > interval {
				return fmt.Errorf("rls accepts pings every %v at most, Envoy pings every %v", minTime, interval)
			}
			return nil
		}},
		{"resources and a non-root, read-only container", func() error {
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				return fmt.Errorf("resources %v: want CPU and memory requests and a memory limit", c.Resources)
			}
			psc, sc := pod.SecurityContext, c.SecurityContext
			if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
				sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				return errors.New("want runAsNonRoot, readOnlyRootFilesystem and no privilege escalation")
			}
			return nil
		}},
		{"Service selects the pods and reaches their named ports", func() error {
			for k, v := range svc.Spec.Selector {
				if podLabels[k] != v {
					return fmt.Errorf("selector %s=%s does not match pod labels %v", k, v, podLabels)
				}
			}
			if svc.Spec.ClusterIP != corev1.ClusterIPNone {
				return errors.New("not headless: Envoy would see one address and pin its connections to one pod")
			}
			for _, p := range svc.Spec.Ports {
				if p.TargetPort.StrVal == "" || ports[p.TargetPort.StrVal] != p.Port {
					return fmt.Errorf("Service port %q targets %q, which is not a container port of the same number", p.Name, p.TargetPort.String())
				}
			}
			return nil
		}},
		{"PodDisruptionBudget covers the pods and leaves one serving", func() error {
			for k, v := range pdb.Spec.Selector.MatchLabels {
				if podLabels[k] != v {
					return fmt.Errorf("selector %s=%s does not match pod labels %v", k, v, podLabels)
				}
			}
			if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() < 1 || hpa.Spec.MinReplicas == nil ||
				int32(pdb.Spec.MaxUnavailable.IntValue()) >= *hpa.Spec.MinReplicas {
				return fmt.Errorf("maxUnavailable %v with minReplicas %v", pdb.Spec.MaxUnavailable, hpa.Spec.MinReplicas)
			}
			return nil
		}},
		{"HorizontalPodAutoscaler scales this Deployment on CPU", func() error {
			ref := hpa.Spec.ScaleTargetRef
			if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != dep.Name {
				return fmt.Errorf("scales %s %s %s", ref.APIVersion, ref.Kind, ref.Name)
			}
			if len(hpa.Spec.Metrics) == 0 || hpa.Spec.Metrics[0].Resource == nil || hpa.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU {
				return errors.New("want a CPU utilisation metric")
			}
			return nil
		}},
	}
	for _, ck := range checks {
		t.Run(ck.name, func(t *testing.T) {
			if err := ck.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestKubernetesDecodeIsStrict shows that the decoding above can fail.
func TestKubernetesDecodeIsStrict(t *testing.T) {
	tests := []struct {
		name string
		obj  any
		doc  string
	}{
		{"misspelled field", &corev1.Service{}, "apiVersion: v1\nkind: Service\nmetadata: {name: x}\nspec: {selectr: {a: b}}\n"},
		{"wrong type", &appsv1.Deployment{}, "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec: {replicas: three}\n"},
		{"duplicate field", &corev1.ConfigMap{}, "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata: {a: b}\ndata: {c: d}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := yaml.UnmarshalStrict([]byte(tt.doc), tt.obj); err == nil {
				t.Error("accepted")
			}
		})
	}
}

// composeFile is the part of the Compose schema compose.yaml uses. Decoding with known fields
// only catches a misspelled key, which Compose itself would reject.
type composeFile struct {
	Name     string                    `yaml:"name"`
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command   []string `yaml:"command"`
	Volumes   []string `yaml:"volumes"`
	Ports     []string `yaml:"ports"`
	DependsOn map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test     []string `yaml:"test"`
		Interval string   `yaml:"interval"`
		Timeout  string   `yaml:"timeout"`
		Retries  int      `yaml:"retries"`
	} `yaml:"healthcheck"`
}

func TestCompose(t *testing.T) {
	data, err := os.ReadFile("compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cf composeFile
	if err := dec.Decode(&cf); err != nil {
		t.Fatal(err)
	}
	e := loadEdge(t, "envoy/envoy.yaml")
	mounts := func(s composeService) map[string]string { // container path → host path
		out := map[string]string{}
		for _, v := range s.Volumes {
			parts := strings.Split(v, ":")
			out[parts[1]] = parts[0]
		}
		return out
	}
	checks := []struct {
		name  string
		check func() error
	}{
		{"services", func() error {
			var names []string
			for n := range cf.Services {
				names = append(names, n)
			}
			slices.Sort(names)
			if want := []string{"echo", "envoy", "redis", "rls"}; !slices.Equal(names, want) {
				return fmt.Errorf("services %q, want %q", names, want)
			}
			return nil
		}},
		{"images pinned, rls built from the Dockerfile", func() error {
			for n, s := range cf.Services {
				switch {
				case s.Build != nil:
					if _, err := os.Stat(filepath.Join(s.Build.Context, s.Build.Dockerfile)); err != nil {
						return fmt.Errorf("%s: %v", n, err)
					}
				case s.Image == "":
					return fmt.Errorf("%s: neither image nor build", n)
				default:
					if err := pinned(s.Image); err != nil {
						return fmt.Errorf("%s: %v", n, err)
					}
				}
			}
			if cf.Services["rls"].Build == nil {
				return errors.New("rls is not built from this repository")
			}
			return nil
		}},
		{"mounted files exist", func() error {
			for n, s := range cf.Services {
				for _, host := range mounts(s) {
					if _, err := os.Stat(host); err != nil {
						return fmt.Errorf("%s: %v", n, err)
					}
				}
			}
			return nil
		}},
		{"dependencies exist and wait for health only where there is a check", func() error {
			for n, s := range cf.Services {
				for dep, d := range s.DependsOn {
					target, ok := cf.Services[dep]
					if !ok {
						return fmt.Errorf("%s depends on unknown %s", n, dep)
					}
					if d.Condition == "service_healthy" && target.Healthcheck == nil {
						return fmt.Errorf("%s waits for %s to be healthy, which has no healthcheck", n, dep)
					}
				}
			}
			return nil
		}},
		{"rls serves the rules with Redis", func() error {
			rls := cf.Services["rls"]
			f := flagValues(rls.Command)
			if f["backend"] != "redis" || f["redis-url"] != "redis://redis:6379" {
				return fmt.Errorf("command %q", rls.Command)
			}
			if host := mounts(rls)[f["config"]]; host != "./envoy/rules" {
				return fmt.Errorf("--config %q is %q on the host, want ./envoy/rules", f["config"], host)
			}
			return nil
		}},
		{"Envoy runs envoy.yaml and its clusters name these services", func() error {
			envoy := cf.Services["envoy"]
			cfgPath := envoy.Command[slices.Index(envoy.Command, "-c")+1]
			if host := mounts(envoy)[cfgPath]; host != "./envoy/envoy.yaml" {
				return fmt.Errorf("envoy -c %q is %q on the host", cfgPath, host)
			}
			for name, c := range e.clusters {
				for _, ep := range c.GetLoadAssignment().GetEndpoints() {
					for _, lb := range ep.GetLbEndpoints() {
						addr := lb.GetEndpoint().GetAddress().GetSocketAddress()
						if _, ok := cf.Services[addr.GetAddress()]; !ok {
							return fmt.Errorf("cluster %s points at %q, not a service here", name, addr.GetAddress())
						}
					}
				}
			}
			if port := e.clusters["rls"].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetSocketAddress().GetPortValue(); port != 8081 {
				return fmt.Errorf("rls cluster port %d, rls's default --grpc-addr is :8081", port)
			}
			return nil
		}},
	}
	for _, ck := range checks {
		t.Run(ck.name, func(t *testing.T) {
			if err := ck.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// instruction is one Dockerfile instruction with continuation lines joined.
type instruction struct {
	cmd  string // upper case
	args string
	line int
}

func dockerfile(t *testing.T) []instruction {
	t.Helper()
	f, err := os.Open("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []instruction
	var cur strings.Builder
	start := 0
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "#") || (line == "" && cur.Len() == 0) {
			continue
		}
		if cur.Len() == 0 {
			start = n
		}
		if more, ok := strings.CutSuffix(line, `\`); ok {
			cur.WriteString(more + " ")
			continue
		}
		cur.WriteString(line)
		cmd, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(cmd), strings.TrimSpace(args), start})
		cur.Reset()
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// stage is one FROM and what follows it.
type stage struct {
	image, name string
	body        []instruction
}

func stages(t *testing.T) []stage {
	t.Helper()
	var out []stage
	for _, in := range dockerfile(t) {
		if in.cmd == "FROM" {
			var words []string
			for _, w := range strings.Fields(in.args) {
				if !strings.HasPrefix(w, "--") {
					words = append(words, w)
				}
			}
			s := stage{image: words[0]}
			if len(words) == 3 && strings.EqualFold(words[1], "AS") {
				s.name = words[2]
			}
			out = append(out, s)
			continue
		}
		if len(out) == 0 {
			t.Fatalf("Dockerfile:%d: %s before FROM", in.line, in.cmd)
		}
		out[len(out)-1].body = append(out[len(out)-1].body, in)
	}
	return out
}

// shellWords splits a shell command line, honouring quotes. It handles what a Dockerfile RUN
// line for go build needs, not all of sh.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0 && r == quote:
			quote = 0
		case quote != 0:
			cur.WriteRune(r)
		case r == '"' || r == '\'':
			quote, in = r, true
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}

// goBuild is the Dockerfile's go build command: the environment it sets and go's arguments.
type goBuild struct {
	stage *stage
	env   []string
	args  []string // after "go"
}

func dockerGoBuild(t *testing.T, ss []stage) goBuild {
	t.Helper()
	var found []goBuild
	for i := range ss {
		for _, in := range ss[i].body {
			if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
				continue
			}
			b := goBuild{stage: &ss[i]}
			words := shellWords(in.args)
			for len(words) > 0 && strings.HasPrefix(words[0], "--mount=") {
				words = words[1:]
			}
			for len(words) > 0 && regexp.MustCompile(`^[A-Z_][A-Z0-9_]*=`).MatchString(words[0]) {
				b.env = append(b.env, words[0])
				words = words[1:]
			}
			if len(words) < 2 || words[0] != "go" || words[1] != "build" {
				t.Fatalf("Dockerfile:%d: want a RUN of [VAR=value ...] go build ..., got %q", in.line, in.args)
			}
			b.args = words[1:]
			found = append(found, b)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one RUN with go build, found %d", len(found))
	}
	return found[0]
}

func TestDockerfile(t *testing.T) {
	ss := stages(t)
	if len(ss) < 2 {
		t.Fatalf("%d stages: want a build stage and a small final stage", len(ss))
	}
	final := ss[len(ss)-1]
	b := dockerGoBuild(t, ss)
	names := map[string]bool{}
	checks := []struct {
		name  string
		check func() error
	}{
		{"base images pinned", func() error {
			for _, s := range ss {
				if s.image != "scratch" && !names[s.image] {
					if err := pinned(s.image); err != nil {
						return err
					}
				}
				names[s.name] = true
			}
			return nil
		}},
		{"final image is small", func() error {
			if final.image != "scratch" && !strings.Contains(final.image, "distroless/static") {
				return fmt.Errorf("final stage from %q: want scratch or distroless static", final.image)
			}
			return nil
		}},
		{"runs as a non-root user", func() error {
			var user string
			for _, in := range final.body {
				if in.cmd == "USER" {
					user = in.args
				}
			}
			uid, _, _ := strings.Cut(user, ":")
			if n, err := strconv.Atoi(uid); user == "" || uid == "root" || (err == nil && n == 0) {
				return fmt.Errorf("final stage USER %q", user)
			}
			return nil
		}},
		{"builds ./cmd/rls statically", func() error {
			if !slices.Contains(b.env, "CGO_ENABLED=0") {
				return fmt.Errorf("go build environment %q lacks CGO_ENABLED=0", b.env)
			}
			if b.args[len(b.args)-1] != "./cmd/rls" {
				return fmt.Errorf("go %q does not build ./cmd/rls", b.args)
			}
			return nil
		}},
		{"final image runs the binary the build stage made", func() error {
			out := b.args[slices.Index(b.args, "-o")+1]
			var copied, entry bool
			for _, in := range final.body {
				copied = copied || (in.cmd == "COPY" && strings.Contains(in.args, "--from="+b.stage.name+" "+out+" "))
				entry = entry || (in.cmd == "ENTRYPOINT" && strings.Contains(in.args, `"/`+path.Base(out)+`"`))
			}
			if !copied || !entry {
				return fmt.Errorf("final stage does not copy %s from %s and run it", out, b.stage.name)
			}
			return nil
		}},
	}
	for _, ck := range checks {
		t.Run(ck.name, func(t *testing.T) {
			if err := ck.check(); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestDockerfileBuildIsStatic runs the Dockerfile's go build command here, for this machine's
// platform, and checks that the binary needs no dynamic loader: a dynamic one would not start
// in an image without libc.
func TestDockerfileBuildIsStatic(t *testing.T) {
	b := dockerGoBuild(t, stages(t))
	declared := map[string]bool{}
	for _, in := range b.stage.body {
		if in.cmd == "ARG" {
			for _, a := range strings.Fields(in.args) {
				name, _, _ := strings.Cut(a, "=")
				declared[name] = true
			}
		}
	}
	platform := map[string]string{"TARGETOS": runtime.GOOS, "TARGETARCH": runtime.GOARCH}
	expand := func(s string) string {
		return os.Expand(s, func(v string) string {
			if !declared[v] {
				t.Fatalf("Dockerfile uses $%s without an ARG in the build stage; it would be empty", v)
			}
			val, ok := platform[v]
			if !ok {
				t.Fatalf("Dockerfile uses $%s, which this test cannot supply", v)
			}
			return val
		})
	}
	bin := filepath.Join(t.TempDir(), "rls")
	args := slices.Clone(b.args)
	for i := range args {
		args[i] = expand(args[i])
		if i > 0 && args[i-1] == "-o" {
			args[i] = bin
		}
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = os.Environ()
	for _, e := range b.env {
		cmd.Env = append(cmd.Env, expand(e))
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
			t.Errorf("binary has a %v program header: it is dynamically linked", p.Type)
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("binary needs %q", libs)
	}
}

// dockerignore reads .dockerignore's patterns.
func dockerignore(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile("../.dockerignore")
	if err != nil {
		t.Fatal(err)
	}
	var pats []string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		rest, deep := strings.CutPrefix(line, "**/")
		if strings.HasPrefix(line, "!") || strings.Contains(rest, "**") || (deep && strings.Contains(rest, "/")) {
			t.Fatalf(".dockerignore: %q is a pattern this test cannot evaluate", line)
		}
		if _, err := path.Match(rest, ""); err != nil {
			t.Fatalf(".dockerignore: %q: %v", line, err)
		}
		pats = append(pats, line)
	}
	return pats
}

// ignoredBy returns the pattern that keeps rel (slash-separated, relative to the context root)
// out of the build context, or "". As in Docker, a pattern that matches a directory excludes
// everything below it.
func ignoredBy(pats []string, rel string) string {
	segs := strings.Split(rel, "/")
	for _, p := range pats {
		for i := 1; i <= len(segs); i++ {
			var ok bool
			if rest, deep := strings.CutPrefix(p, "**/"); deep {
				ok, _ = path.Match(rest, segs[i-1])
			} else {
				ok, _ = path.Match(p, strings.Join(segs[:i], "/"))
			}
			if ok {
				return p
			}
		}
	}
	return ""
}

// TestDockerignoreKeepsBuildInputs: a file go build ./cmd/rls reads but .dockerignore leaves out
// breaks the image build only, where no test runs.
func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	pats := dockerignore(t)
	cmd := exec.Command("go", "list", "-deps", "-json=Dir,GoFiles,CgoFiles,EmbedFiles,Module", "./cmd/rls")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	inputs := []string{"go.mod", "go.sum"}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct {
			Dir                           string
			GoFiles, CgoFiles, EmbedFiles []string
			Module                        *struct{ Main bool }
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles, p.EmbedFiles) {
			inputs = append(inputs, filepath.ToSlash(filepath.Join(rel, f)))
		}
	}
	if !slices.Contains(inputs, "cmd/rls/main.go") {
		t.Fatalf("go list found no cmd/rls/main.go among %q", inputs)
	}
	for _, f := range inputs {
		if p := ignoredBy(pats, f); p != "" {
			t.Errorf("%s is needed to build and excluded by .dockerignore's %q", f, p)
		}
	}
	// And the patterns do what they are for.
	for _, f := range []string{".git/config", "deploy/compose.yaml", "internal/service/service_test.go", "README.md"} {
		if ignoredBy(pats, f) == "" {
			t.Errorf("%s is in the build context", f)
		}
	}
}
