package deploy_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/rls-project/rls/internal/descriptors"
)

// chartDir is the Helm chart, relative to deploy/.
const chartDir = "helm/rls"

// kubeVersion is the Kubernetes version the chart is linted and rendered for: the oldest its
// Chart.yaml accepts is older, but the helm library's default (1.20) is below it.
const kubeVersion = "v1.31.0"

// monitoringAPI is the Prometheus Operator's API, which a cluster serves once its CRDs are in.
const monitoringAPI = "monitoring.coreos.com/v1"

// helmExample is how each example values file is rendered: into which namespace, and on a
// cluster that serves which APIs beyond Kubernetes' own. Every file of examples/ must be here
// (TestHelmExamplesListed), so a new example cannot escape the checks.
var helmExamples = map[string]struct {
	namespace string
	apis      []string
}{
	"default":            {namespace: "ratelimit"},
	"redis-external":     {namespace: "ratelimit"},
	"redis-bundled":      {namespace: "ratelimit"},
	"tls-mtls":           {namespace: "ratelimit"},
	"existing-configmap": {namespace: "ratelimit"},
	"monitoring":         {namespace: "ratelimit", apis: []string{monitoringAPI}},
	"envoy-gateway":      {namespace: "envoy-gateway-system"},
	"ai-gateway":         {namespace: "envoy-gateway-system"},
}

var loadedChart struct {
	once sync.Once
	c    *chart.Chart
	err  error
}

func helmChart(t *testing.T) *chart.Chart {
	t.Helper()
	loadedChart.once.Do(func() { loadedChart.c, loadedChart.err = loader.Load(chartDir) })
	if loadedChart.err != nil {
		t.Fatalf("loading %s: %v", chartDir, loadedChart.err)
	}
	return loadedChart.c
}

// exampleValues reads examples/NAME.yaml.
func exampleValues(t *testing.T, name string) map[string]any {
	t.Helper()
	vals, err := chartutil.ReadValuesFile(filepath.Join(chartDir, "examples", name+".yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return vals.AsMap()
}

// render is helm template: the chart with vals over its values.yaml, as release "rls" in
// namespace ns of a cluster serving Kubernetes' APIs and apis. Templates are rendered strictly:
// a reference to a value values.yaml does not define fails.
func render(t *testing.T, vals map[string]any, ns string, apis ...string) (map[string]string, error) {
	t.Helper()
	c := helmChart(t)
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = *kv
	caps.APIVersions = append(slices.Clone(caps.APIVersions), apis...)
	top, err := chartutil.ToRenderValues(c, vals, chartutil.ReleaseOptions{Name: "rls", Namespace: ns, Revision: 1, IsInstall: true}, caps)
	if err != nil {
		return nil, err
	}
	return engine.Engine{Strict: true}.Render(c, top)
}

// helmObjects decodes every document rendered into its k8s.io/api (or monitoring.coreos.com)
// type, strictly, as k8sObjects does for the plain manifests.
func helmObjects(t *testing.T, out map[string]string) []metav1.Object {
	t.Helper()
	names := make([]string, 0, len(out))
	for name := range out {
		names = append(names, name)
	}
	sort.Strings(names)
	var objs []metav1.Object
	for _, file := range names {
		if strings.HasSuffix(file, "NOTES.txt") {
			continue
		}
		objs = append(objs, decodeObjects(t, file, out[file])...)
	}
	return objs
}

// renderExample renders examples/NAME.yaml as helmExamples says and decodes it.
func renderExample(t *testing.T, name string) []metav1.Object {
	t.Helper()
	ex, ok := helmExamples[name]
	if !ok {
		t.Fatalf("example %q is not in helmExamples", name)
	}
	out, err := render(t, exampleValues(t, name), ex.namespace, ex.apis...)
	if err != nil {
		t.Fatalf("rendering examples/%s.yaml: %v", name, err)
	}
	return helmObjects(t, out)
}

func all[T metav1.Object](objs []metav1.Object) []T {
	var found []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			found = append(found, v)
		}
	}
	return found
}

// one is the single object of type T; the test fails when there are none or several.
func one[T metav1.Object](t *testing.T, objs []metav1.Object) T {
	t.Helper()
	found := all[T](objs)
	if len(found) != 1 {
		var zero T
		t.Fatalf("want one %T, rendered %d", zero, len(found))
	}
	return found[0]
}

func TestHelmExamplesListed(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartDir, "examples", "*"))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range files {
		name, ok := strings.CutSuffix(filepath.Base(f), ".yaml")
		if !ok {
			t.Errorf("%s: examples are *.yaml values files", f)
			continue
		}
		got = append(got, name)
		if _, ok := helmExamples[name]; !ok {
			t.Errorf("examples/%s.yaml is not in helmExamples: say which namespace and APIs to render it with", name)
		}
	}
	for name := range helmExamples {
		if !slices.Contains(got, name) {
			t.Errorf("helmExamples names %q, which examples/ does not have", name)
		}
	}
	if !slices.Contains(yamlFiles(t)[kindHelm], filepath.Join(chartDir, "values.yaml")) {
		t.Errorf("deploy_test.go's yamlFiles does not count %s as the chart's", chartDir)
	}
}

// TestHelmValuesDocumented: every value the schema names is in the chart's README, as its
// full path or, in a row that names its parent, as .name; and the schema and values.yaml name
// the same values.
func TestHelmValuesDocumented(t *testing.T) {
	var schema map[string]any
	if err := json.Unmarshal(readFile(t, filepath.Join(chartDir, "values.schema.json")), &schema); err != nil {
		t.Fatal(err)
	}
	readme := string(readFile(t, filepath.Join(chartDir, "README.md")))
	defaults := helmChart(t).Values
	var walk func(node map[string]any, vals map[string]any, path []string)
	walk = func(node map[string]any, vals map[string]any, path []string) {
		props, _ := node["properties"].(map[string]any)
		for _, name := range slices.Sorted(maps.Keys(props)) {
			full := strings.Join(append(slices.Clone(path), name), ".")
			v, inValues := vals[name]
			if !inValues && full != "global" {
				t.Errorf("the schema names %s, which values.yaml does not set", full)
			}
			child, _ := props[name].(map[string]any)
			if _, nested := child["properties"]; nested {
				sub, _ := v.(map[string]any)
				walk(child, sub, append(slices.Clone(path), name))
				continue
			}
			if full != "global" && !strings.Contains(readme, "`"+full+"`") && !strings.Contains(readme, "`"+full+",") && !strings.Contains(readme, "."+name+"`") {
				t.Errorf("README.md does not document %s", full)
			}
		}
		for name := range vals {
			if _, ok := props[name]; !ok && props != nil {
				t.Errorf("values.yaml sets %s, which the schema does not name", strings.Join(append(slices.Clone(path), name), "."))
			}
		}
	}
	walk(schema, defaults, nil)
}

// TestHelmLint is helm lint of every example, as given and with the monitoring kinds forced
// (lint's cluster serves no monitoring.coreos.com API): no warning, no error.
func TestHelmLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for name, ex := range helmExamples {
		for _, force := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/force=%v", name, force), func(t *testing.T) {
				vals := exampleValues(t, name)
				if force {
					vals = chartutil.CoalesceTables(map[string]any{"monitoring": map[string]any{"force": true}}, vals)
				}
				l := lint.AllWithKubeVersion(chartDir, vals, ex.namespace, kv)
				for _, m := range l.Messages {
					if m.Severity >= support.WarningSev {
						t.Errorf("%s", m)
					}
				}
			})
		}
	}
}

// podOf returns the Deployment's only container and a map of its container ports by name.
func podOf(t *testing.T, dep *appsv1.Deployment) (corev1.PodSpec, corev1.Container, map[string]int32) {
	t.Helper()
	pod := dep.Spec.Template.Spec
	if len(pod.Containers) != 1 {
		t.Fatalf("Deployment %s has %d containers, want rls alone", dep.Name, len(pod.Containers))
	}
	c := pod.Containers[0]
	ports := map[string]int32{}
	for _, p := range c.Ports {
		ports[p.Name] = p.ContainerPort
	}
	return pod, c, ports
}

func selects(sel map[string]string, labels map[string]string) error {
	if len(sel) == 0 {
		return fmt.Errorf("empty selector")
	}
	for k, v := range sel {
		if labels[k] != v {
			return fmt.Errorf("selector %s=%s does not match labels %v", k, v, labels)
		}
	}
	return nil
}

// rlsDeployment is the rendered rls Deployment (the bundled Redis has one too).
func rlsDeployment(t *testing.T, objs []metav1.Object) *appsv1.Deployment {
	t.Helper()
	var found []*appsv1.Deployment
	for _, d := range all[*appsv1.Deployment](objs) {
		if d.Spec.Selector.MatchLabels["app.kubernetes.io/name"] == "rls" {
			found = append(found, d)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one rls Deployment, rendered %d", len(found))
	}
	return found[0]
}

// rlsService is the Service that selects the rls pods.
func rlsService(t *testing.T, objs []metav1.Object, dep *appsv1.Deployment) *corev1.Service {
	t.Helper()
	var found []*corev1.Service
	for _, s := range all[*corev1.Service](objs) {
		if selects(s.Spec.Selector, dep.Spec.Template.Labels) == nil {
			found = append(found, s)
		}
	}
	if len(found) != 1 {
		t.Fatalf("want one Service selecting the rls pods, rendered %d", len(found))
	}
	return found[0]
}

// TestHelmExamples renders every example and checks what holds whatever the values: the
// objects decode strictly, pods are selected and reached on named ports, probes and resources,
// volumes and what they name, and the PDB, HPA, NetworkPolicy and monitoring objects agree with
// the Deployment and the Service.
func TestHelmExamples(t *testing.T) {
	for name, ex := range helmExamples {
		t.Run(name, func(t *testing.T) {
			objs := renderExample(t, name)
			dep := rlsDeployment(t, objs)
			svc := rlsService(t, objs, dep)
			pod, c, ports := podOf(t, dep)
			podLabels := dep.Spec.Template.Labels
			configMaps := map[string]*corev1.ConfigMap{}
			for _, cm := range all[*corev1.ConfigMap](objs) {
				configMaps[cm.Name] = cm
			}
			vals := exampleValues(t, name)
			checks := []struct {
				name  string
				check func() error
			}{
				{"every object in the release's namespace", func() error {
					for _, o := range objs {
						if o.GetNamespace() != ex.namespace {
							return fmt.Errorf("%T %q is in namespace %q", o, o.GetName(), o.GetNamespace())
						}
					}
					return nil
				}},
				{"images pinned", func() error {
					for _, d := range all[*appsv1.Deployment](objs) {
						for _, c := range d.Spec.Template.Spec.Containers {
							if err := pinned(c.Image); err != nil {
								return err
							}
						}
					}
					return nil
				}},
				{"Deployment selects its pods; replicas left to the autoscaler when there is one", func() error {
					if err := selects(dep.Spec.Selector.MatchLabels, podLabels); err != nil {
						return err
					}
					hpas := all[*autoscalingv2.HorizontalPodAutoscaler](objs)
					if len(hpas) > 0 && dep.Spec.Replicas != nil {
						return fmt.Errorf("replicas is set beside an autoscaler: every upgrade would undo it")
					}
					if len(hpas) == 0 && dep.Spec.Replicas == nil {
						return fmt.Errorf("neither replicas nor an autoscaler")
					}
					return nil
				}},
				{"rls's ports and HTTP probes", func() error {
					if ports["grpc"] != 8081 || ports["http"] != 8080 {
						return fmt.Errorf("container ports %v: rls serves gRPC on 8081 and HTTP on 8080", ports)
					}
					want := map[string]struct {
						p    *corev1.Probe
						path string
					}{"startup": {c.StartupProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}, "liveness": {c.LivenessProbe, "/healthz"}}
					for kind, w := range want {
						if w.p == nil || w.p.HTTPGet == nil {
							return fmt.Errorf("%s probe: want an HTTP probe", kind)
						}
						if w.p.HTTPGet.Path != w.path || ports[w.p.HTTPGet.Port.StrVal] != 8080 {
							return fmt.Errorf("%s probe GET %s on port %s, want %s on http (8080)", kind, w.p.HTTPGet.Path, w.p.HTTPGet.Port.String(), w.path)
						}
					}
					return nil
				}},
				{"resources, no CPU limit, a non-root read-only container", func() error {
					r := c.Resources
					if r.Requests.Cpu().IsZero() || r.Requests.Memory().IsZero() || r.Limits.Memory().IsZero() {
						return fmt.Errorf("resources %v: want CPU and memory requests and a memory limit", r)
					}
					if !r.Limits.Cpu().IsZero() {
						return fmt.Errorf("CPU limit %v: throttling turns into timeouts at Envoy", r.Limits.Cpu())
					}
					if r.Requests.Memory().Cmp(*r.Limits.Memory()) > 0 {
						return fmt.Errorf("memory request %v above the limit %v", r.Requests.Memory(), r.Limits.Memory())
					}
					psc, sc := pod.SecurityContext, c.SecurityContext
					if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
						sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
						return fmt.Errorf("want runAsNonRoot, readOnlyRootFilesystem and no privilege escalation")
					}
					if pod.AutomountServiceAccountToken == nil || *pod.AutomountServiceAccountToken {
						return fmt.Errorf("rls needs no Kubernetes API token")
					}
					return nil
				}},
				{"GOMEMLIMIT follows the memory limit", func() error {
					for _, e := range c.Env {
						if e.Name == "GOMEMLIMIT" && e.ValueFrom != nil && e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory" {
							return nil
						}
					}
					return fmt.Errorf("no GOMEMLIMIT from limits.memory")
				}},
				{"every mount has its volume; ConfigMaps named exist or are the user's", func() error {
					vols := map[string]corev1.Volume{}
					for _, v := range pod.Volumes {
						vols[v.Name] = v
					}
					for _, m := range c.VolumeMounts {
						v, ok := vols[m.Name]
						if !ok {
							return fmt.Errorf("mount %s has no volume", m.Name)
						}
						if m.SubPath != "" || !m.ReadOnly {
							return fmt.Errorf("mount %s: want a read-only directory mount (a subPath mount never sees updates)", m.Name)
						}
						if v.ConfigMap != nil {
							if _, ok := configMaps[v.ConfigMap.Name]; !ok && v.ConfigMap.Name != valueAt(vals, "rules", "existingConfigMap") {
								return fmt.Errorf("volume %s names ConfigMap %q, which is neither rendered nor rules.existingConfigMap", v.Name, v.ConfigMap.Name)
							}
						}
					}
					if len(vols) != len(c.VolumeMounts) {
						return fmt.Errorf("%d volumes, %d mounts", len(vols), len(c.VolumeMounts))
					}
					return nil
				}},
				{"Service selects the pods and reaches their named ports", func() error {
					if svc.Spec.ClusterIP != corev1.ClusterIPNone {
						return fmt.Errorf("not headless: Envoy would see one address and pin its connections to one pod")
					}
					names := map[string]bool{}
					for _, p := range svc.Spec.Ports {
						names[p.Name] = true
						if p.TargetPort.StrVal == "" || ports[p.TargetPort.StrVal] != p.Port {
							return fmt.Errorf("Service port %q (%d) targets %q, which is not a container port of the same number", p.Name, p.Port, p.TargetPort.String())
						}
					}
					if !names["grpc"] || !names["http"] {
						return fmt.Errorf("Service ports %v: want grpc and http", names)
					}
					return nil
				}},
				{"PodDisruptionBudget covers the pods and leaves one serving", func() error {
					pdb := one[*policyv1.PodDisruptionBudget](t, objs)
					if err := selects(pdb.Spec.Selector.MatchLabels, podLabels); err != nil {
						return err
					}
					if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() < 1 {
						return fmt.Errorf("maxUnavailable %v: a drain could never evict", pdb.Spec.MaxUnavailable)
					}
					for _, hpa := range all[*autoscalingv2.HorizontalPodAutoscaler](objs) {
						if hpa.Spec.MinReplicas == nil || int32(pdb.Spec.MaxUnavailable.IntValue()) >= *hpa.Spec.MinReplicas {
							return fmt.Errorf("maxUnavailable %v with minReplicas %v", pdb.Spec.MaxUnavailable, hpa.Spec.MinReplicas)
						}
					}
					return nil
				}},
				{"HorizontalPodAutoscaler scales this Deployment on CPU", func() error {
					for _, hpa := range all[*autoscalingv2.HorizontalPodAutoscaler](objs) {
						ref := hpa.Spec.ScaleTargetRef
						if ref.APIVersion != "apps/v1" || ref.Kind != "Deployment" || ref.Name != dep.Name {
							return fmt.Errorf("scales %s %s %s", ref.APIVersion, ref.Kind, ref.Name)
						}
						if len(hpa.Spec.Metrics) == 0 || hpa.Spec.Metrics[0].Resource == nil || hpa.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU {
							return fmt.Errorf("want a CPU utilisation metric")
						}
					}
					return nil
				}},
				{"NetworkPolicies select their pods and open named ports only", func() error {
					for _, np := range all[*networkingv1.NetworkPolicy](objs) {
						target := dep
						if strings.HasSuffix(np.Name, "-redis") {
							target = only[*appsv1.Deployment](t, objs, np.Name)
						}
						if err := selectsPods(np, target); err != nil {
							return err
						}
						if err := rulesBounded(np); err != nil {
							return err
						}
						if _, err := allowedPorts(np, target.Spec.Template.Spec.Containers[0]); err != nil {
							return err
						}
					}
					return nil
				}},
				{"rule ConfigMap loads with rls's rule loader", func() error {
					for _, cm := range configMaps {
						if cm.Labels["grafana_dashboard"] != "" {
							continue
						}
						files := map[string][]byte{}
						for k, v := range cm.Data {
							files[k] = []byte(v)
						}
						if _, err := descriptors.Parse(files); err != nil {
							return fmt.Errorf("ConfigMap %s: %v", cm.Name, err)
						}
					}
					return nil
				}},
				{"monitoring objects agree with the Service and the chart's files", func() error {
					return checkMonitoring(t, objs, svc)
				}},
			}
			for _, ck := range checks {
				t.Run(ck.name, func(t *testing.T) {
					if err := ck.check(); err != nil {
						t.Error(err)
					}
				})
			}
		})
	}
}

// valueAt is the string at path in vals, or "".
func valueAt(vals map[string]any, path ...string) string {
	var cur any = vals
	for _, p := range path {
		m, ok := cur.(map[string]any)
		if !ok {
			return ""
		}
		cur = m[p]
	}
	s, _ := cur.(string)
	return s
}

// checkMonitoring: the ServiceMonitor scrapes a port of the Service that selects rls, the
// PrometheusRule holds files/rls-alerts.yaml's groups as they are, and the dashboard ConfigMap
// holds files/rls-dashboard.json as it is, labelled for Grafana's sidecar. It holds for any
// content of those two files.
func checkMonitoring(t *testing.T, objs []metav1.Object, svc *corev1.Service) error {
	for _, sm := range all[*monitoringv1.ServiceMonitor](objs) {
		if err := selects(sm.Spec.Selector.MatchLabels, svc.Labels); err != nil {
			return fmt.Errorf("ServiceMonitor: %v", err)
		}
		// The Prometheus Operator names the job after the Service unless jobLabel names a label
		// of the Service to take it from; the alerts select job="rls".
		if job := svc.Labels[sm.Spec.JobLabel]; sm.Spec.JobLabel == "" || job != "rls" {
			return fmt.Errorf("ServiceMonitor jobLabel %q gives job %q (the Service's name, %q, if empty), want rls: the alerts select job=\"rls\"", sm.Spec.JobLabel, job, svc.Name)
		}
		if len(sm.Spec.Endpoints) == 0 {
			return fmt.Errorf("ServiceMonitor has no endpoints")
		}
		for _, ep := range sm.Spec.Endpoints {
			if !slices.ContainsFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == ep.Port }) || ep.Path != "/metrics" {
				return fmt.Errorf("ServiceMonitor scrapes port %q path %q; the Service has %v", ep.Port, ep.Path, svc.Spec.Ports)
			}
		}
	}
	for _, pr := range all[*monitoringv1.PrometheusRule](objs) {
		data, err := os.ReadFile(filepath.Join(chartDir, "files", "rls-alerts.yaml"))
		if err != nil {
			return err
		}
		var want struct {
			Groups []monitoringv1.RuleGroup `json:"groups"`
		}
		if err := yaml.UnmarshalStrict(data, &want); err != nil {
			return fmt.Errorf("files/rls-alerts.yaml: %v", err)
		}
		if len(want.Groups) == 0 {
			return fmt.Errorf("files/rls-alerts.yaml has no groups")
		}
		if a, b := jsonOf(t, want.Groups), jsonOf(t, pr.Spec.Groups); a != b {
			return fmt.Errorf("PrometheusRule groups differ from files/rls-alerts.yaml:\n%s\n%s", b, a)
		}
	}
	for _, cm := range all[*corev1.ConfigMap](objs) {
		if cm.Labels["grafana_dashboard"] == "" {
			continue
		}
		if cm.Labels["grafana_dashboard"] != "1" {
			return fmt.Errorf("dashboard ConfigMap label grafana_dashboard=%q, Grafana's sidecar looks for 1", cm.Labels["grafana_dashboard"])
		}
		data, err := os.ReadFile(filepath.Join(chartDir, "files", "rls-dashboard.json"))
		if err != nil {
			return err
		}
		var dash map[string]any
		if err := json.Unmarshal([]byte(cm.Data["rls.json"]), &dash); err != nil {
			return fmt.Errorf("dashboard ConfigMap rls.json: %v", err)
		}
		if strings.TrimSpace(cm.Data["rls.json"]) != strings.TrimSpace(string(data)) {
			return fmt.Errorf("dashboard ConfigMap rls.json differs from files/rls-dashboard.json")
		}
	}
	return nil
}

func jsonOf(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestHelmRuleChangeKeepsPods: changing the inline rules changes the ConfigMap, which rls
// reloads, and not the pod template: a rollout would restart every pod, and with the memory
// backend forget every counter.
func TestHelmRuleChangeKeepsPods(t *testing.T) {
	podOfRules := func(rules string) (string, string) {
		vals := map[string]any{"rules": map[string]any{"files": map[string]any{"a.yaml": rules}}}
		out, err := render(t, vals, "ratelimit")
		if err != nil {
			t.Fatal(err)
		}
		objs := helmObjects(t, out)
		return jsonOf(t, rlsDeployment(t, objs).Spec.Template), jsonOf(t, one[*corev1.ConfigMap](t, objs).Data)
	}
	pod1, cm1 := podOfRules("domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]\n")
	pod2, cm2 := podOfRules("domain: a\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 2}}]\n")
	if cm1 == cm2 {
		t.Fatal("the rules ConfigMap did not change with the rules")
	}
	if pod1 != pod2 {
		t.Errorf("the pod template changes with the rules:\n%s\n%s", pod1, pod2)
	}
}

// TestHelmFilesMatchSources keeps the chart's copies of the alert rules and the dashboard equal
// to deploy/prometheus's and deploy/grafana's, which the promtool and Prometheus tests check:
// Helm reads no file outside the chart's directory, so the chart holds copies.
func TestHelmFilesMatchSources(t *testing.T) {
	for copy, source := range map[string]string{
		"helm/rls/files/rls-alerts.yaml":    "prometheus/rls-alerts.yaml",
		"helm/rls/files/rls-dashboard.json": "grafana/rls-dashboard.json",
	} {
		a, err := os.ReadFile(copy)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(source)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(a, b) {
			t.Errorf("deploy/%s differs from deploy/%s: cp deploy/%[2]s deploy/%[1]s", copy, source)
		}
	}
}
