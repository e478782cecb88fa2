package deploy_test

import (
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The parts of Envoy Gateway's EnvoyGateway configuration (gateway.envoyproxy.io/v1alpha1,
// api/v1alpha1/envoygateway_types.go) that the example sets, with their field names and, where
// Envoy Gateway uses them, k8s.io/api's types. Decoding is strict: a misspelt or misplaced field
// fails the test, as Envoy Gateway would reject it.
type envoyGateway struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Gateway    struct {
		ControllerName string `json:"controllerName"`
	} `json:"gateway"`
	Logging struct {
		Level map[string]string `json:"level"`
	} `json:"logging"`
	Provider struct {
		Type       string `json:"type"`
		Kubernetes struct {
			RateLimitDeployment struct {
				Container kubernetesContainerSpec `json:"container"`
			} `json:"rateLimitDeployment"`
		} `json:"kubernetes"`
	} `json:"provider"`
	RateLimit struct {
		Backend struct {
			Type  string `json:"type"`
			Redis struct {
				URL string `json:"url"`
			} `json:"redis"`
		} `json:"backend"`
	} `json:"rateLimit"`
}

// kubernetesContainerSpec is Envoy Gateway's KubernetesContainerSpec.
type kubernetesContainerSpec struct {
	Env             []corev1.EnvVar              `json:"env,omitempty"`
	Resources       *corev1.ResourceRequirements `json:"resources,omitempty"`
	SecurityContext *corev1.SecurityContext      `json:"securityContext,omitempty"`
	Image           *string                      `json:"image,omitempty"`
	VolumeMounts    []corev1.VolumeMount         `json:"volumeMounts,omitempty"`
}

// TestEnvoyGatewayExample: the Envoy Gateway example is a valid envoy-gateway-config ConfigMap
// whose EnvoyGateway configuration changes the rate-limit deployment's image, pinned, and nothing
// else of it: the environment Envoy Gateway gives is the one rls reads (see the integration
// test TestEnvoyGatewayEnvironment).
func TestEnvoyGatewayExample(t *testing.T) {
	data, err := os.ReadFile("envoy-gateway/envoy-gateway-config.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cm corev1.ConfigMap
	if err := yaml.UnmarshalStrict(data, &cm); err != nil {
		t.Fatalf("ConfigMap: %v", err)
	}
	if cm.Kind != "ConfigMap" || cm.Name != "envoy-gateway-config" || cm.Namespace != "envoy-gateway-system" {
		t.Fatalf("%s %s/%s: want ConfigMap envoy-gateway-system/envoy-gateway-config, the one Envoy Gateway reads", cm.Kind, cm.Namespace, cm.Name)
	}
	var eg envoyGateway
	if err := yaml.UnmarshalStrict([]byte(cm.Data["envoy-gateway.yaml"]), &eg); err != nil {
		t.Fatalf("envoy-gateway.yaml: %v", err)
	}
	if eg.APIVersion != "gateway.envoyproxy.io/v1alpha1" || eg.Kind != "EnvoyGateway" || eg.Provider.Type != "Kubernetes" {
		t.Errorf("%s %s provider %s", eg.APIVersion, eg.Kind, eg.Provider.Type)
	}
	c := eg.Provider.Kubernetes.RateLimitDeployment.Container
	if c.Image == nil || !strings.HasPrefix(*c.Image, "ghcr.io/rls-project/rls:") {
		t.Fatalf("rateLimitDeployment image %v: want rls's", c.Image)
	}
	if err := pinned(*c.Image); err != nil {
		t.Error(err)
	}
	if c.Env != nil || c.Resources != nil || c.SecurityContext != nil || c.VolumeMounts != nil {
		t.Errorf("the container changes more than the image: %+v", c)
	}
	if eg.RateLimit.Backend.Type != "Redis" || eg.RateLimit.Backend.Redis.URL == "" {
		t.Errorf("rateLimit.backend %+v: global rate limiting needs Redis", eg.RateLimit.Backend)
	}
}
