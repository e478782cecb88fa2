package deploy_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rls-project/rls/internal/rlstest"
)

// TestHelmRendersWhatRLSRuns starts the real rls binary with each example's rendered container
// (its args and environment, the rendered ConfigMaps and throwaway certificates where its
// Secrets are mounted) and checks that rls accepts them and serves: a misspelt flag, a value rls
// refuses, a path that is not mounted or an environment it cannot read makes it exit. Examples
// whose rules are files and whose backend is the memory one must also become ready. Only the
// listen addresses change (loopback ports the kernel picks), the shutdown delay (none), and
// the log format (rlstest reads the text one); Redis and xDS servers are not reachable.
func TestHelmRendersWhatRLSRuns(t *testing.T) {
	bin := rlstest.Binary(t)
	for _, name := range slices.Sorted(maps.Keys(helmExamples)) {
		t.Run(name, func(t *testing.T) {
			objs := renderExample(t, name)
			dep := rlsDeployment(t, objs)
			pod, c, _ := podOf(t, dep)
			root := t.TempDir()
			mounts := mountFiles(t, objs, pod, c, root)
			local := func(v string) string {
				for _, m := range mounts {
					if v == m || strings.HasPrefix(v, m+"/") {
						return filepath.Join(root, v)
					}
				}
				return v
			}
			var args []string
			redisTLS := false
			for _, a := range c.Args {
				if n, v, ok := strings.Cut(a, "="); ok {
					a = n + "=" + local(v)
					redisTLS = redisTLS || n == "--redis-tls-ca"
				}
				args = append(args, a)
			}
			args = append(args, "--grpc-addr=127.0.0.1:0", "--http-addr=127.0.0.1:0", "--debug-addr=",
				"--log-format=text", "--shutdown-delay=0s")
			if slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--metrics-addr=") }) {
				args = append(args, "--metrics-addr=127.0.0.1:0")
			}
			var env []string
			for _, e := range c.Env {
				v := local(e.Value)
				switch {
				case e.ValueFrom == nil:
				case e.ValueFrom.ResourceFieldRef != nil && e.ValueFrom.ResourceFieldRef.Resource == "limits.memory":
					v = strconv.FormatInt(c.Resources.Limits.Memory().Value(), 10)
				case e.ValueFrom.SecretKeyRef != nil && e.Name == "RLS_REDIS_URL":
					// A Redis nobody listens on: rls serves, answering through its failure mode.
					v = "redis://127.0.0.1:1"
					if redisTLS {
						v = "rediss://127.0.0.1:1"
					}
				case e.ValueFrom.SecretKeyRef != nil && e.Name == "REDIS_URL":
					v = "127.0.0.1:1" // Envoy Gateway's form, host:port
				default:
					t.Fatalf("%s: a source this test cannot supply", e.Name)
				}
				env = append(env, e.Name+"="+v)
			}
			p := rlstest.Launch(t, bin, env, args...)
			if !strings.Contains(strings.Join(c.Args, " "), "--xds-server") && !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "CONFIG_TYPE" }) &&
				!slices.Contains(c.Args, "--backend=redis") {
				p.WaitReady(t)
			}
		})
	}
}

// mountFiles writes, under root, what each of the container's mounts would hold: a rendered
// ConfigMap's keys (a ConfigMap the release does not make holds deploy/envoy/rules), a Secret's
// ca.crt, tls.crt and tls.key from a throwaway CA. It returns the mount paths.
func mountFiles(t *testing.T, objs []metav1.Object, pod corev1.PodSpec, c corev1.Container, root string) []string {
	t.Helper()
	configMaps := map[string]map[string]string{}
	for _, cm := range all[*corev1.ConfigMap](objs) {
		configMaps[cm.Name] = cm.Data
	}
	vols := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		vols[v.Name] = v
	}
	certs := rlstest.NewCerts(t)
	var paths []string
	for _, m := range c.VolumeMounts {
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, m.MountPath)
		files := map[string]string{}
		switch v := vols[m.Name]; {
		case v.ConfigMap != nil && configMaps[v.ConfigMap.Name] != nil:
			files = configMaps[v.ConfigMap.Name]
		case v.ConfigMap != nil:
			ruleFiles, err := filepath.Glob("envoy/rules/*.yaml")
			if err != nil || len(ruleFiles) == 0 {
				t.Fatalf("envoy/rules: %v", err)
			}
			for _, f := range ruleFiles {
				files[filepath.Base(f)] = string(readFile(t, f))
			}
		case v.Secret != nil:
			files["ca.crt"] = string(readFile(t, certs.CA))
			files["tls.crt"] = string(readFile(t, certs.ServerCert))
			files["tls.key"] = string(readFile(t, certs.ServerKey))
		default:
			t.Fatalf("mount %s: a volume this test cannot fill", m.Name)
		}
		for k, data := range files {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return paths
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestHelmBoundsTheLocalStore: every example passes --memory-max-bytes, the Redis ones too. With
// Redis, rules whose failure mode is local decide from a store in rls's memory while Redis is
// down; unbounded by the chart it would take rls's default of 256 MiB, the whole container limit.
func TestHelmBoundsTheLocalStore(t *testing.T) {
	for _, name := range slices.Sorted(maps.Keys(helmExamples)) {
		t.Run(name, func(t *testing.T) {
			_, c, _ := podOf(t, rlsDeployment(t, renderExample(t, name)))
			if !slices.ContainsFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--memory-max-bytes=") }) {
				t.Errorf("no --memory-max-bytes among %q", c.Args)
			}
		})
	}
}

// TestHelmHTTPOverTLS: with tls.http the HTTP listener takes the gRPC certificate, and the client
// CA with mTLS, and the probes ask over HTTPS (the kubelet would otherwise get a TLS alert and
// restart the pod); without it they stay HTTP. TestHelmRendersWhatRLSRuns starts rls with the
// tls-mtls example's arguments.
func TestHelmHTTPOverTLS(t *testing.T) {
	for _, http := range []bool{false, true} {
		vals := exampleValues(t, "tls-mtls")
		vals["tls"].(map[string]any)["http"] = http
		out, err := render(t, vals, helmExamples["tls-mtls"].namespace, helmExamples["tls-mtls"].apis...)
		if err != nil {
			t.Fatal(err)
		}
		_, c, _ := podOf(t, rlsDeployment(t, helmObjects(t, out)))
		want := []string{"--http-tls-cert=/etc/rls/tls/tls.crt", "--http-tls-key=/etc/rls/tls/tls.key", "--http-tls-client-ca=/etc/rls/client-ca/ca.crt"}
		scheme := corev1.URISchemeHTTPS
		if !http {
			want, scheme = nil, ""
		}
		var got []string
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--http-tls-") {
				got = append(got, a)
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("tls.http %v: args %q, want %q", http, got, want)
		}
		for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "readiness": c.ReadinessProbe, "liveness": c.LivenessProbe} {
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != scheme {
				t.Errorf("tls.http %v: %s probe %+v, want an HTTP GET with scheme %q", http, name, p, scheme)
			}
		}
	}
}
