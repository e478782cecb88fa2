package deploy_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/rls-project/rls/internal/envoytest"
)

// objectTypes are the kinds the manifests and the chart's renders may hold, each with its Go
// type: k8s.io/api's, or the Prometheus Operator's for monitoring.coreos.com.
var objectTypes = map[string]func() metav1.Object{
	"v1/Namespace":                           func() metav1.Object { return &corev1.Namespace{} },
	"v1/ConfigMap":                           func() metav1.Object { return &corev1.ConfigMap{} },
	"v1/Secret":                              func() metav1.Object { return &corev1.Secret{} },
	"v1/Service":                             func() metav1.Object { return &corev1.Service{} },
	"apps/v1/Deployment":                     func() metav1.Object { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget":          func() metav1.Object { return &policyv1.PodDisruptionBudget{} },
	"autoscaling/v2/HorizontalPodAutoscaler": func() metav1.Object { return &autoscalingv2.HorizontalPodAutoscaler{} },
	"networking.k8s.io/v1/NetworkPolicy":     func() metav1.Object { return &networkingv1.NetworkPolicy{} },
	monitoringAPI + "/ServiceMonitor":        func() metav1.Object { return &monitoringv1.ServiceMonitor{} },
	monitoringAPI + "/PrometheusRule":        func() metav1.Object { return &monitoringv1.PrometheusRule{} },
}

// decodeObjects decodes every document of text, from file, strictly into its type of
// objectTypes: a misspelt or misplaced field fails, as the API server would refuse it.
func decodeObjects(t *testing.T, file, text string) []metav1.Object {
	t.Helper()
	var objs []metav1.Object
	for i, doc := range regexp.MustCompile(`(?m)^---[ \t]*$`).Split(text, -1) {
		if strings.TrimSpace(regexp.MustCompile(`(?m)^\s*#.*$`).ReplaceAllString(doc, "")) == "" {
			continue
		}
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("%s document %d: %v\n%s", file, i+1, err, doc)
		}
		mk, ok := objectTypes[tm.APIVersion+"/"+tm.Kind]
		if !ok {
			t.Fatalf("%s document %d: %s %s is not a kind this test decodes", file, i+1, tm.APIVersion, tm.Kind)
		}
		obj := mk()
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s document %d (%s): %v\n%s", file, i+1, tm.Kind, err, doc)
		}
		objs = append(objs, obj)
	}
	return objs
}

// k8sObjects decodes every document of every manifest strictly into its k8s.io/api type.
func k8sObjects(t *testing.T) []metav1.Object {
	t.Helper()
	var objs []metav1.Object
	for _, file := range yamlFiles(t)[kindK8s] {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeObjects(t, file, string(data))...)
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

func TestKubernetesManifests(t *testing.T) {
	objs := k8sObjects(t)
	dep := only[*appsv1.Deployment](t, objs, "rls")
	svc := only[*corev1.Service](t, objs, "rls")
	pdb := only[*policyv1.PodDisruptionBudget](t, objs, "rls")
	hpa := only[*autoscalingv2.HorizontalPodAutoscaler](t, objs, "rls")
	cm := only[*corev1.ConfigMap](t, objs, "rls-rules")
	redisSvc := only[*corev1.Service](t, objs, "redis")
	envoyKeepalive := envoytest.LoadEdge(t, "envoy/envoy.yaml").Clusters["rls"].GetTypedExtensionProtocolOptions()
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
			h2 := envoytest.Unpack[*upstreamhttpv3.HttpProtocolOptions](t, envoyKeepalive["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]).GetExplicitHttpConfig().GetHttp2ProtocolOptions()
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
