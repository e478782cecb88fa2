// Package deploy_test checks that the deployment files under deploy/ (and the Dockerfile) are
// ones Envoy, Kubernetes, Compose and Docker accept, and that they agree with each other.
package deploy_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"sigs.k8s.io/yaml"
)

// rlsHealthService is the gRPC health service name Envoy and Kubernetes probe.
var rlsHealthService = rlsv3.RateLimitService_ServiceDesc.ServiceName

// The kinds of YAML file under deploy/. Every file must be one of them, so a new file cannot
// escape checking.
const (
	kindEnvoy   = "envoy bootstrap"
	kindRLQS    = "envoy bootstrap with the rate_limit_quota filter"
	kindRules   = "rls rules"
	kindTokens  = "rls rules of the token-limit example"
	kindSlots   = "rls rules of the in-flight example"
	kindK8s     = "kubernetes manifests"
	kindCompose = "compose file"
	kindEG      = "envoy gateway config"
	kindAlerts  = "prometheus rule file"
	kindPromUT  = "promtool unit tests of the rule file"
	kindHelm    = "helm chart file (helm_test.go renders and checks the chart)"
	kindIstio   = "istio objects (istio_test.go)"
	kindMesh    = "rls rules of the istio sidecar example"
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
		if err := yaml.Unmarshal(data, &top); err != nil && !strings.HasPrefix(p, "kubernetes/") && !strings.HasPrefix(p, "helm/") {
			return fmt.Errorf("%s: %v", p, err)
		}
		switch {
		case strings.HasPrefix(p, filepath.Join("istio", "rules")+string(filepath.Separator)):
			byKind[kindMesh] = append(byKind[kindMesh], p)
		case strings.HasPrefix(p, "istio"+string(filepath.Separator)):
			byKind[kindIstio] = append(byKind[kindIstio], p)
		case strings.HasPrefix(p, "helm"+string(filepath.Separator)):
			byKind[kindHelm] = append(byKind[kindHelm], p)
		case strings.HasPrefix(p, filepath.Join("envoy", "rules-tokens")+string(filepath.Separator)):
			byKind[kindTokens] = append(byKind[kindTokens], p)
		case strings.HasPrefix(p, filepath.Join("envoy", "rules-inflight")+string(filepath.Separator)):
			byKind[kindSlots] = append(byKind[kindSlots], p)
		case strings.HasPrefix(p, filepath.Join("envoy", "rules")+string(filepath.Separator)):
			byKind[kindRules] = append(byKind[kindRules], p)
		case top["static_resources"] != nil && strings.Contains(string(data), "rate_limit_quota"):
			byKind[kindRLQS] = append(byKind[kindRLQS], p)
		case top["static_resources"] != nil:
			byKind[kindEnvoy] = append(byKind[kindEnvoy], p)
		case strings.HasPrefix(p, "envoy-gateway"+string(filepath.Separator)):
			byKind[kindEG] = append(byKind[kindEG], p)
		case strings.HasPrefix(p, "kubernetes"+string(filepath.Separator)):
			byKind[kindK8s] = append(byKind[kindK8s], p)
		case p == filepath.Join("prometheus", "rls-alerts.yaml"):
			byKind[kindAlerts] = append(byKind[kindAlerts], p)
		case p == filepath.Join("prometheus", "rls-alerts.test.yaml"):
			byKind[kindPromUT] = append(byKind[kindPromUT], p)
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
		kindEnvoy:   {"envoy/envoy-inflight.yaml", "envoy/envoy-tls.yaml", "envoy/envoy-tokens.yaml", "envoy/envoy.yaml"},
		kindSlots:   {"envoy/rules-inflight/llm_inflight.yaml"},
		kindRLQS:    {"envoy/envoy-rlqs.yaml"},
		kindRules:   {"envoy/rules/edge.yaml", "envoy/rules/edge_quota.yaml", "envoy/rules/edge_tcp.yaml"},
		kindTokens:  {"envoy/rules-tokens/ai_tokens.yaml"},
		kindCompose: {"compose.yaml"},
		kindEG:      {"envoy-gateway/envoy-gateway-config.yaml"},
		kindAlerts:  {"prometheus/rls-alerts.yaml"},
		kindPromUT:  {"prometheus/rls-alerts.test.yaml"},
		kindIstio:   {"istio/destinationrule.yaml", "istio/gateway-envoyfilter.yaml", "istio/service.yaml", "istio/sidecar-envoyfilter.yaml"},
		kindMesh:    {"istio/rules/mesh.yaml"},
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
