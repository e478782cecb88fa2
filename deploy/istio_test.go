package deploy_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	localrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/local_ratelimit/v3"
	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	yamlv3 "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
	istioapi "istio.io/api/networking/v1alpha3"
	istionetv1 "istio.io/client-go/pkg/apis/networking/v1"
	istionetv1alpha3 "istio.io/client-go/pkg/apis/networking/v1alpha3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/rls-project/rls/api"
	"github.com/rls-project/rls/internal/descriptors"
	"github.com/rls-project/rls/internal/envoytest"
)

// The Istio objects under deploy/istio: each decodes strictly into Istio's own API types, each
// EnvoyFilter patch is an Envoy config that validates as deploy/envoy's bootstraps do, and the
// two tiers they install keep the properties deploy/envoy/README.md relies on.

const (
	hcmFilter    = "envoy.filters.network.http_connection_manager"
	routerFilter = "envoy.filters.http.router"
)

// decodeIstio decodes one object of deploy/istio into its API type. Istio's types decode their
// spec leniently (their UnmarshalJSON allows unknown fields), so the spec is decoded a second
// time with the same unmarshaler made strict, and both decodings must agree: a misspelt or
// misplaced field fails, as the API server's schema would refuse it.
func decodeIstio(data []byte) (metav1.Object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return nil, err
	}
	var (
		obj          metav1.Object
		spec, strict proto.Message
	)
	// Istio's unmarshaler for the kind, with unknown fields refused.
	unmarshal := *istioapi.EnvoyFilterUnmarshaler
	switch tm.APIVersion + "/" + tm.Kind {
	case "networking.istio.io/v1alpha3/EnvoyFilter":
		ef := &istionetv1alpha3.EnvoyFilter{}
		obj, spec, strict = ef, &ef.Spec, &istioapi.EnvoyFilter{}
	case "networking.istio.io/v1/DestinationRule":
		dr := &istionetv1.DestinationRule{}
		obj, spec, strict = dr, &dr.Spec, &istioapi.DestinationRule{}
		unmarshal = *istioapi.DestinationRuleUnmarshaler
	case "v1/Service":
		svc := &corev1.Service{}
		return svc, yaml.UnmarshalStrict(data, svc)
	default:
		return nil, fmt.Errorf("%s %s is not a kind this test decodes", tm.APIVersion, tm.Kind)
	}
	if err := yaml.UnmarshalStrict(data, obj); err != nil {
		return nil, err
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, err
	}
	var top struct {
		Spec json.RawMessage `json:"spec"`
	}
	if err := json.Unmarshal(js, &top); err != nil {
		return nil, err
	}
	unmarshal.AllowUnknownFields = false
	if err := unmarshal.Unmarshal(bytes.NewReader(top.Spec), protoadapt.MessageV1Of(strict)); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	if !proto.Equal(spec, strict) {
		return nil, errors.New("spec: Istio's own decoding differs from the strict one")
	}
	if err := validateCRD(tm.APIVersion+"/"+tm.Kind, data); err != nil {
		return nil, fmt.Errorf("the CRD refuses it: %w", err)
	}
	return obj, nil
}

// meshFilter is an EnvoyFilter of deploy/istio with the HTTP filters it makes Envoy run.
type meshFilter struct {
	file    string
	obj     *istionetv1alpha3.EnvoyFilter
	filters []string // HTTP filter names, in order, once the patches are applied
	local   *localrlv3.LocalRateLimit
	global  *httprlv3.RateLimit
}

// checkEnvoyFilter decodes an EnvoyFilter and applies its patches as Istio does to an HTTP
// connection manager that has only the router, then validates the result as an Envoy bootstrap
// (envoytest.Parse, as deploy/envoy's): each patch value is decoded strictly into the Envoy type
// it patches, every typed_config must resolve, and every message must pass its rules.
func checkEnvoyFilter(file string, data []byte) (*meshFilter, error) {
	obj, err := decodeIstio(data)
	if err != nil {
		return nil, err
	}
	ef, ok := obj.(*istionetv1alpha3.EnvoyFilter)
	if !ok {
		return nil, fmt.Errorf("a %T, not an EnvoyFilter", obj)
	}
	if len(ef.Spec.GetWorkloadSelector().GetLabels()) == 0 {
		return nil, errors.New("no workloadSelector: it would patch every proxy of its namespace")
	}
	router := json.RawMessage(`{"name":"` + routerFilter + `","typed_config":{"@type":"type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}`)
	filters := []json.RawMessage{router}
	for i, cp := range ef.Spec.GetConfigPatches() {
		// The only patch the tiers need; another applyTo needs its own Envoy type here.
		m := cp.GetMatch()
		switch {
		case cp.GetApplyTo() != istioapi.EnvoyFilter_HTTP_FILTER:
			return nil, fmt.Errorf("patch %d: applyTo %v, want HTTP_FILTER", i, cp.GetApplyTo())
		case cp.GetPatch().GetOperation() != istioapi.EnvoyFilter_Patch_INSERT_BEFORE:
			return nil, fmt.Errorf("patch %d: operation %v, want INSERT_BEFORE", i, cp.GetPatch().GetOperation())
		case m.GetContext() != istioapi.EnvoyFilter_GATEWAY && m.GetContext() != istioapi.EnvoyFilter_SIDECAR_INBOUND:
			return nil, fmt.Errorf("patch %d: context %v", i, m.GetContext())
		case m.GetListener().GetFilterChain().GetFilter().GetName() != hcmFilter:
			return nil, fmt.Errorf("patch %d: does not match the HTTP connection manager", i)
		case m.GetListener().GetFilterChain().GetFilter().GetSubFilter().GetName() != routerFilter:
			return nil, fmt.Errorf("patch %d: not inserted before the router", i)
		}
		v, err := protojson.Marshal(cp.GetPatch().GetValue())
		if err != nil {
			return nil, err
		}
		filters = slices.Insert(filters, len(filters)-1, json.RawMessage(v))
	}
	bootstrap := map[string]any{"static_resources": map[string]any{"listeners": []any{map[string]any{
		"name":    "istio",
		"address": map[string]any{"socket_address": map[string]any{"address": "0.0.0.0", "port_value": 8080}},
		"filter_chains": []any{map[string]any{"filters": []any{map[string]any{
			"name": hcmFilter,
			"typed_config": map[string]any{
				"@type":        "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
				"stat_prefix":  "istio",
				"route_config": map[string]any{"name": "istio"},
				"http_filters": filters,
			},
		}}}},
	}}}}
	js, err := json.Marshal(bootstrap) // compacts the patch values too
	if err != nil {
		return nil, err
	}
	bs, anys, err := envoytest.Parse(js)
	if err != nil {
		return nil, err
	}
	if want := bytes.Count(js, []byte(`"@type":`)); anys != want {
		return nil, fmt.Errorf("validated %d typed configs, the patched listener has %d", anys, want)
	}
	mf := &meshFilter{file: file, obj: ef}
	var hcm hcmv3.HttpConnectionManager
	if err := bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		return nil, err
	}
	for _, f := range hcm.GetHttpFilters() {
		mf.filters = append(mf.filters, f.GetName())
		m, err := f.GetTypedConfig().UnmarshalNew()
		if err != nil {
			return nil, err
		}
		switch m := m.(type) {
		case *localrlv3.LocalRateLimit:
			mf.local = m
		case *httprlv3.RateLimit:
			mf.global = m
		}
	}
	return mf, nil
}

// meshObjects are deploy/istio's objects, decoded and checked.
type meshObjects struct {
	gateway, sidecar *meshFilter
	rule             *istionetv1.DestinationRule
	svc              *corev1.Service
}

func loadMeshObjects(t *testing.T) *meshObjects {
	t.Helper()
	m := &meshObjects{}
	for _, file := range yamlFiles(t)[kindIstio] {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(data, &tm); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if tm.Kind == "EnvoyFilter" {
			mf, err := checkEnvoyFilter(file, data)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			switch mf.obj.Spec.GetConfigPatches()[0].GetMatch().GetContext() {
			case istioapi.EnvoyFilter_GATEWAY:
				m.gateway = mf
			case istioapi.EnvoyFilter_SIDECAR_INBOUND:
				m.sidecar = mf
			}
			continue
		}
		obj, err := decodeIstio(data)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		switch obj := obj.(type) {
		case *istionetv1.DestinationRule:
			m.rule = obj
		case *corev1.Service:
			m.svc = obj
		}
	}
	if m.gateway == nil || m.sidecar == nil || m.rule == nil || m.svc == nil {
		t.Fatal("want an EnvoyFilter for the gateway and one for sidecars, a DestinationRule and a Service")
	}
	return m
}

func TestIstioObjectsDecodeAndValidate(t *testing.T) {
	m := loadMeshObjects(t)
	for _, mf := range []*meshFilter{m.gateway, m.sidecar} {
		if len(mf.obj.Spec.GetConfigPatches()) != 2 {
			t.Errorf("%s: %d patches, want the two tiers", mf.file, len(mf.obj.Spec.GetConfigPatches()))
		}
	}
}

// TestIstioCheckRejects shows that the checks above can fail: each broken copy of the gateway's
// EnvoyFilter must be rejected, for the reason given.
func TestIstioCheckRejects(t *testing.T) {
	const file = "istio/gateway-envoyfilter.yaml"
	orig, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := checkEnvoyFilter(file, orig); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, old, new, want string
	}{
		{"misspelt metadata", "  namespace: istio-system", "  namespce: istio-system", "unknown field"},
		{"misspelt spec field", "workloadSelector:", "workloadSelectr:", "unknown field"},
		{"misplaced spec field", "    match:\n      context: GATEWAY", "    match:\n      contxt: GATEWAY", "unknown field"},
		{"unknown operation", "operation: INSERT_BEFORE", "operation: INSERT_BEFOR", "INSERT_BEFOR"},
		{"no workload selector", "  workloadSelector:\n    labels:\n      istio: ingressgateway\n", "", "workloadSelector"},
		{"a CEL rule of the CRD", "  workloadSelector:\n", "  targetRefs:\n  - kind: Gateway\n    group: gateway.networking.k8s.io\n    name: edge\n  workloadSelector:\n", "only one of targetRefs or workloadSelector"},
		{"a label too long for the CRD's schema", "      istio: ingressgateway\n", "      istio: " + strings.Repeat("g", 64) + "\n", "spec.workloadSelector.labels"},
		{"inserted after the router", "operation: INSERT_BEFORE", "operation: INSERT_AFTER", "INSERT_AFTER"},
		{"misspelt Envoy field", "failure_mode_deny: false", "failure_mode_denied: false", "unknown field"},
		{"unregistered typed_config", "ratelimit.v3.RateLimit\n", "ratelimit.v3.RateLimt\n", "RateLimt"},
		{"empty domain inside a typed_config", "domain: edge\n", "domain: \"\"\n", "Domain"},
		{"zero token bucket fill interval", "fill_interval: 0.2s", "fill_interval: 0s", "FillInterval"},
		{"empty cluster name", "cluster_name: outbound|8081||rls-mesh.ratelimit.svc.cluster.local", "cluster_name: \"\"", "ClusterName"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Contains(orig, []byte(tt.old)) {
				t.Fatalf("%s no longer contains %q", file, tt.old)
			}
			broken := bytes.Replace(orig, []byte(tt.old), []byte(tt.new), 1)
			_, err := checkEnvoyFilter(file, broken)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not mention %q", err, tt.want)
			}
		})
	}
}

// sampleDescriptors is one request descriptor for each of rls's rate_limits, with a sample value
// where the request supplies one.
func sampleDescriptors(t *testing.T, rls []*routev3.RateLimit) [][]descriptors.Entry {
	t.Helper()
	var out [][]descriptors.Entry
	for _, rl := range rls {
		var entries []descriptors.Entry
		for _, a := range rl.GetActions() {
			var e descriptors.Entry
			switch a := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_RemoteAddress_:
				e = descriptors.Entry{Key: "remote_address", Value: "192.0.2.1"}
			case *routev3.RateLimit_Action_RequestHeaders_:
				e = descriptors.Entry{Key: a.RequestHeaders.GetDescriptorKey(), Value: "k1"}
			case *routev3.RateLimit_Action_GenericKey_:
				e = descriptors.Entry{Key: cmpOr(a.GenericKey.GetDescriptorKey(), "generic_key"), Value: a.GenericKey.GetDescriptorValue()}
			case *routev3.RateLimit_Action_HeaderValueMatch_:
				e = descriptors.Entry{Key: cmpOr(a.HeaderValueMatch.GetDescriptorKey(), "header_match"), Value: a.HeaderValueMatch.GetDescriptorValue()}
			default:
				t.Fatalf("action %T: teach sampleDescriptors its entry", a)
			}
			entries = append(entries, e)
		}
		out = append(out, entries)
	}
	return out
}

func cmpOr(s, or string) string {
	if s == "" {
		return or
	}
	return s
}

// apiKeyRules are the limits of every api_key node of a rule file: what one API key may do.
func apiKeyRules(ds []api.Descriptor) []*api.RateLimit {
	var out []*api.RateLimit
	for _, d := range ds {
		if d.Key == "api_key" && d.RateLimit != nil {
			out = append(out, d.RateLimit)
		}
		out = append(out, apiKeyRules(d.Descriptors)...)
	}
	return out
}

// TestIstioTwoTiers checks, in the gateway's and the sidecars' filters, the properties
// deploy/envoy/README.md relies on, and that they reach rls through service.yaml's Service
// and destinationrule.yaml's settings.
func TestIstioTwoTiers(t *testing.T) {
	m := loadMeshObjects(t)
	host := m.svc.Name + "." + m.svc.Namespace + ".svc.cluster.local"
	var grpcPort int32
	for _, p := range m.svc.Spec.Ports {
		if p.Name == "grpc" {
			grpcPort = p.Port
		}
	}
	rulesOf := map[string]string{"edge": "envoy/rules", "mesh": "istio/rules"}
	filesOf := map[string]map[string]api.RuleFile{"edge": ruleFiles(t), "mesh": ruleFilesOf(t, kindMesh)}
	for _, mf := range []*meshFilter{m.gateway, m.sidecar} {
		local, global := mf.local, mf.global
		checks := []struct {
			name  string
			check func() error
		}{
			{"local tier, then global tier, then router", func() error {
				want := []string{"envoy.filters.http.local_ratelimit", "envoy.filters.http.ratelimit", routerFilter}
				if !slices.Equal(mf.filters, want) {
					return fmt.Errorf("HTTP filters %q, want %q", mf.filters, want)
				}
				return nil
			}},
			{"local tier enabled and enforced for every request", func() error {
				if !hundredPercent(local.GetFilterEnabled()) || !hundredPercent(local.GetFilterEnforced()) {
					return fmt.Errorf("filter_enabled %v, filter_enforced %v; both default to 0%%", local.GetFilterEnabled(), local.GetFilterEnforced())
				}
				return nil
			}},
			{"global tier fails open with headers and Retry-After", func() error {
				if global.GetFailureModeDeny() || global.GetFailureModeDenyPercent() != nil {
					return errors.New("fails closed")
				}
				if global.GetEnableXRatelimitHeaders() != httprlv3.RateLimit_DRAFT_VERSION_03 || !global.GetEnableRetryAfterHeader() {
					return fmt.Errorf("headers %v, retry-after %v", global.GetEnableXRatelimitHeaders(), global.GetEnableRetryAfterHeader())
				}
				if d := global.GetTimeout().AsDuration(); global.GetTimeout() == nil || d <= 0 || d > 100*time.Millisecond {
					return fmt.Errorf("timeout %v: want a bound of at most 100ms", d)
				}
				return nil
			}},
			{"only the global tier sends X-RateLimit headers", func() error {
				if local.GetEnableXRatelimitHeaders() != 0 {
					return fmt.Errorf("local tier sends %v", local.GetEnableXRatelimitHeaders())
				}
				return nil
			}},
			{"rls is Istio's cluster for the Service, configured by the DestinationRule", func() error {
				svc := global.GetRateLimitService()
				g := svc.GetGrpcService().GetEnvoyGrpc()
				if want := fmt.Sprintf("outbound|%d||%s", grpcPort, host); g.GetClusterName() != want {
					return fmt.Errorf("cluster %q, want Istio's name for service.yaml's grpc port, %q", g.GetClusterName(), want)
				}
				if g.GetAuthority() != host {
					return fmt.Errorf("authority %q, want %q", g.GetAuthority(), host)
				}
				if svc.GetTransportApiVersion().String() != "V3" {
					return errors.New("transport_api_version is not V3")
				}
				if m.rule.Spec.GetHost() != host {
					return fmt.Errorf("the DestinationRule is for %q, not %q", m.rule.Spec.GetHost(), host)
				}
				// At most max_tokens requests pass the local default bucket at once, each one RPC.
				maxRequests := m.rule.Spec.GetTrafficPolicy().GetConnectionPool().GetHttp().GetHttp2MaxRequests()
				if burst := local.GetTokenBucket().GetMaxTokens(); uint32(maxRequests) < burst {
					return fmt.Errorf("http2MaxRequests %d is below the %d requests the local tier admits at once", maxRequests, burst)
				}
				return nil
			}},
			{"every descriptor sent has a limit", func() error {
				dir, ok := rulesOf[global.GetDomain()]
				if !ok {
					return fmt.Errorf("domain %q has no rule file here", global.GetDomain())
				}
				rs, err := descriptors.Load(dir)
				if err != nil {
					return err
				}
				for _, d := range sampleDescriptors(t, global.GetRateLimits()) {
					if r := rs.Match(global.GetDomain(), d); r == nil || len(r.Limits) == 0 {
						return fmt.Errorf("descriptor %v matches no limit in %s", d, dir)
					}
				}
				return nil
			}},
			{"local per-key bucket never tighter than a key's limit", func() error {
				var perKey *typev3.TokenBucket
				for _, d := range local.GetDescriptors() {
					if len(d.GetEntries()) == 1 && d.GetEntries()[0].GetKey() == "api_key" && d.GetEntries()[0].GetValue() == "" {
						perKey = d.GetTokenBucket()
					}
				}
				if perKey == nil {
					return errors.New("no per-API-key local bucket (entries: [{key: api_key}])")
				}
				rules := apiKeyRules(filesOf[global.GetDomain()][global.GetDomain()].Descriptors)
				if len(rules) == 0 {
					return errors.New("no api_key rules to compare with")
				}
				for _, rl := range rules {
					rate, burst := perSecond(t, rl)
					if got := bucketRate(perKey); got < rate {
						return fmt.Errorf("rule %s: %.2f/s, local per-key bucket refills %.2f/s", rl.Name, rate, got)
					}
					if got := perKey.GetMaxTokens(); got < burst {
						return fmt.Errorf("rule %s: burst %d, local per-key bucket holds %d", rl.Name, burst, got)
					}
				}
				return nil
			}},
		}
		for _, c := range checks {
			t.Run(mf.file+"/"+c.name, func(t *testing.T) {
				if err := c.check(); err != nil {
					t.Error(err)
				}
			})
		}
	}
}

// TestIstioGatewayMatchesEnvoyBootstrap keeps the gateway's tiers copies of
// deploy/envoy/envoy.yaml's: the same local buckets, the same global filter but for where rls
// is, and its route's descriptors in the filter.
func TestIstioGatewayMatchesEnvoyBootstrap(t *testing.T) {
	m := loadMeshObjects(t)
	e := envoytest.LoadEdge(t, "envoy/envoy.yaml")
	if !proto.Equal(m.gateway.local, e.Local) {
		t.Error("the gateway's local_ratelimit differs from envoy.yaml's")
	}
	var routeLimits []*routev3.RateLimit
	for _, vh := range e.HCM.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			routeLimits = append(routeLimits, r.GetRoute().GetRateLimits()...)
		}
	}
	got := m.gateway.global.GetRateLimits()
	if !slices.EqualFunc(got, routeLimits, func(a, b *routev3.RateLimit) bool { return proto.Equal(a, b) }) {
		t.Errorf("the gateway sends %d descriptors, not those of envoy.yaml's route (%d)", len(got), len(routeLimits))
	}
	gw := proto.Clone(m.gateway.global).(*httprlv3.RateLimit)
	edge := proto.Clone(e.Global).(*httprlv3.RateLimit)
	gw.RateLimits, gw.RateLimitService, edge.RateLimitService = nil, nil, nil
	if !proto.Equal(gw, edge) {
		t.Errorf("the gateway's ratelimit filter differs from envoy.yaml's in more than its descriptors and service:\n%v\n%v", gw, edge)
	}
}

// TestIstioService: the Service the filters name selects rls's pods, on the port rls serves
// gRPC on, in a way Istio can route the filter's calls through.
func TestIstioService(t *testing.T) {
	m := loadMeshObjects(t)
	objs := k8sObjects(t)
	dep := only[*appsv1.Deployment](t, objs, "rls")
	plain := only[*corev1.Service](t, objs, "rls")
	svc := m.svc
	if svc.Namespace != dep.Namespace {
		t.Errorf("Service in %q, rls in %q", svc.Namespace, dep.Namespace)
	}
	if svc.Name == plain.Name {
		t.Errorf("Service %q would replace deploy/kubernetes's headless one", svc.Name)
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone || svc.Spec.Type != corev1.ServiceTypeClusterIP {
		t.Error("headless or not a ClusterIP Service: Istio would make an ORIGINAL_DST cluster, which the filter's calls cannot use")
	}
	labels := dep.Spec.Template.Labels
	for k, v := range svc.Spec.Selector {
		if labels[k] != v {
			t.Errorf("selector %s=%s does not select rls's pods (%v)", k, v, labels)
		}
	}
	containerPorts := map[string]int32{}
	for _, p := range dep.Spec.Template.Spec.Containers[0].Ports {
		containerPorts[p.Name] = p.ContainerPort
	}
	if len(svc.Spec.Ports) != 1 {
		t.Fatalf("%d ports, want grpc only", len(svc.Spec.Ports))
	}
	p := svc.Spec.Ports[0]
	var appProtocol string
	if p.AppProtocol != nil {
		appProtocol = *p.AppProtocol
	}
	if p.Name != "grpc" || appProtocol != "grpc" {
		t.Errorf("port %q, appProtocol %q: want grpc, so that Istio calls it over HTTP/2", p.Name, appProtocol)
	}
	if containerPorts[p.TargetPort.String()] != 8081 {
		t.Errorf("targetPort %q is not rls's gRPC port", p.TargetPort.String())
	}
	dr := &m.rule.Spec
	if !slices.Contains(dr.GetExportTo(), "*") {
		t.Error("the DestinationRule is not exported to every namespace")
	}
	if ka := dr.GetTrafficPolicy().GetConnectionPool().GetTcp().GetTcpKeepalive(); ka.GetTime() == nil || ka.GetInterval() == nil {
		t.Error("no TCP keepalive: a connection to a vanished node lingers for the kernel's hours")
	}
}

// TestMeshRules loads the sidecar example's rules as rls does.
func TestMeshRules(t *testing.T) {
	rs, err := descriptors.Load("istio/rules")
	if err != nil {
		t.Fatal(err)
	}
	if !rs.HasDomain("mesh") {
		t.Error(`no domain "mesh"`)
	}
}

// TestIstioDocShowsMeshRules: docs/istio.md shows rules/mesh.yaml with a second service added;
// its first part must stay the file's rules.
func TestIstioDocShowsMeshRules(t *testing.T) {
	doc, err := os.ReadFile("../docs/istio.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```yaml\n(domain: mesh\n.*?)```").FindAllSubmatch(doc, -1)
	if len(blocks) != 1 {
		t.Fatalf("docs/istio.md shows %d rule files of domain mesh, want 1", len(blocks))
	}
	dec := yamlv3.NewDecoder(bytes.NewReader(blocks[0][1]))
	dec.KnownFields(true)
	var shown api.RuleFile
	if err := dec.Decode(&shown); err != nil {
		t.Fatal(err)
	}
	file := ruleFilesOf(t, kindMesh)["mesh"]
	if len(shown.Descriptors) <= len(file.Descriptors) || !reflect.DeepEqual(shown.Descriptors[:len(file.Descriptors)], file.Descriptors) {
		t.Error("docs/istio.md's rules of domain mesh do not begin with rules/mesh.yaml's")
	}
}

// istioSchema validates an object as the API server would with Istio's CustomResourceDefinition
// for its kind, as istio.io/api ships it: the OpenAPI schema, then the CEL rules.
type istioSchema struct {
	validator  validation.SchemaValidator
	structural *structuralschema.Structural
	cel        *cel.Validator
}

// istioCRDs are the schemas of the served versions of Istio's CRDs, by apiVersion/kind.
var istioCRDs = sync.OnceValues(func() (map[string]*apiextensions.JSONSchemaProps, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "istio.io/api").Output()
	if err != nil {
		return nil, fmt.Errorf("go list istio.io/api: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "kubernetes", "customresourcedefinitions.gen.yaml"))
	if err != nil {
		return nil, err
	}
	schemas := map[string]*apiextensions.JSONSchemaProps{}
	for _, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(string(data), -1) {
		var crd apiextensionsv1.CustomResourceDefinition
		if err := yaml.Unmarshal([]byte(doc), &crd); err != nil {
			return nil, err
		}
		for _, v := range crd.Spec.Versions {
			if !v.Served || v.Schema == nil {
				continue
			}
			var in apiextensions.CustomResourceValidation
			if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(v.Schema, &in, nil); err != nil {
				return nil, err
			}
			schemas[crd.Spec.Group+"/"+v.Name+"/"+crd.Spec.Names.Kind] = in.OpenAPIV3Schema
		}
	}
	return schemas, nil
})

// istioSchemas holds the validators built so far: building one compiles its CEL rules.
var istioSchemas struct {
	sync.Mutex
	m map[string]*istioSchema
}

func istioSchemaOf(apiVersionKind string) (*istioSchema, error) {
	istioSchemas.Lock()
	defer istioSchemas.Unlock()
	if s, ok := istioSchemas.m[apiVersionKind]; ok {
		return s, nil
	}
	crds, err := istioCRDs()
	if err != nil {
		return nil, err
	}
	props, ok := crds[apiVersionKind]
	if !ok {
		return nil, fmt.Errorf("istio.io/api has no CRD serving %s", apiVersionKind)
	}
	validator, _, err := validation.NewSchemaValidator(props)
	if err != nil {
		return nil, err
	}
	structural, err := structuralschema.NewStructural(props)
	if err != nil {
		return nil, err
	}
	s := &istioSchema{validator, structural, cel.NewValidator(structural, true, celconfig.PerCallLimit)}
	if istioSchemas.m == nil {
		istioSchemas.m = map[string]*istioSchema{}
	}
	istioSchemas.m[apiVersionKind] = s
	return s, nil
}

// validateCRD checks an Istio object against its CRD's schema and CEL rules.
func validateCRD(apiVersionKind string, data []byte) error {
	s, err := istioSchemaOf(apiVersionKind)
	if err != nil {
		return err
	}
	js, err := yaml.YAMLToJSON(data)
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := utiljson.Unmarshal(js, &obj); err != nil {
		return err
	}
	errs := validation.ValidateCustomResource(nil, obj, s.validator)
	celErrs, _ := s.cel.Validate(context.Background(), nil, s.structural, obj, nil, celconfig.RuntimeCELCostBudget)
	return append(errs, celErrs...).ToAggregate()
}
