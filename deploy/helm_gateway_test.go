package deploy_test

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/rls-project/rls/internal/ratelimitenv"
)

// What Envoy Gateway gives its rate-limit Deployment (envoyproxy/gateway,
// internal/infrastructure/kubernetes/ratelimit/resource.go and its testdata
// deployments/default.yaml, at d32f282): the environment, by name, with the Redis URL coming
// from rateLimit.backend.redis (here the example's Secret), and the certgen Secret mounted at
// /certs. The xDS server is Envoy Gateway's own Service on 18001; Envoy Gateway writes it
// "envoy-gateway:18001", which resolves only inside its namespace, and the chart writes it in
// full so that it resolves from anywhere.
var envoyGatewayEnv = map[string]string{
	"RUNTIME_ROOT":                       "/data",
	"RUNTIME_SUBDIRECTORY":               "ratelimit",
	"RUNTIME_IGNOREDOTFILES":             "true",
	"RUNTIME_WATCH_ROOT":                 "false",
	"LOG_LEVEL":                          "info",
	"USE_STATSD":                         "false",
	"CONFIG_TYPE":                        "GRPC_XDS_SOTW",
	"CONFIG_GRPC_XDS_SERVER_URL":         "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001",
	"CONFIG_GRPC_XDS_NODE_ID":            "envoy-ratelimit",
	"GRPC_SERVER_USE_TLS":                "true",
	"GRPC_SERVER_TLS_CERT":               "/certs/tls.crt",
	"GRPC_SERVER_TLS_KEY":                "/certs/tls.key",
	"GRPC_SERVER_TLS_CA_CERT":            "/certs/ca.crt",
	"CONFIG_GRPC_XDS_SERVER_USE_TLS":     "true",
	"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":    "/certs/tls.crt",
	"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":     "/certs/tls.key",
	"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":  "/certs/ca.crt",
	"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
	"REDIS_SOCKET_TYPE":                  "tcp",
	"REDIS_URL":                          "secret rls-redis/url",
}

// What Envoy AI Gateway's QuotaPolicy expects of its rate-limit service (envoyproxy/ai-gateway
// at c217da8): the controller's --quotaRateLimitServiceAddr default
// "envoy-ai-gateway-ratelimit.envoy-gateway-system" on port 8081 (cmd/controller/main.go,
// internal/extensionserver/quota_ratelimit.go, a STRICT_DNS cluster over plaintext HTTP/2), and
// the controller's rate-limit xDS server: plaintext gRPC on 18002 (internal/ratelimit/runner),
// Service ai-gateway-controller in envoy-ai-gateway-system (its chart's fullnameOverride),
// RateLimitConfig for node id envoy-ai-gateway-ratelimit, domain ai-gateway-quota.
const (
	aiGatewayService   = "envoy-ai-gateway-ratelimit"
	aiGatewayNamespace = "envoy-gateway-system"
	aiGatewayPort      = 8081
	aiGatewayXDS       = "ai-gateway-controller.envoy-ai-gateway-system.svc.cluster.local:18002"
	aiGatewayNodeID    = "envoy-ai-gateway-ratelimit"
)

// envOf is the container's environment, a value from a Secret written "secret NAME/KEY".
func envOf(t *testing.T, c corev1.Container) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		if _, dup := env[e.Name]; dup {
			t.Errorf("%s is set twice", e.Name)
		}
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret " + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom.ResourceFieldRef != nil:
			env[e.Name] = "resource " + e.ValueFrom.ResourceFieldRef.Resource
		default:
			t.Errorf("%s: a source this test does not know", e.Name)
		}
	}
	return env
}

// translate is what rls makes of env with --ratelimit-env: flag -> value, and the flags whose
// value is only envoyproxy/ratelimit's default (no variable set them).
func translate(t *testing.T, env map[string]string) (flags map[string]string, defaults map[string]bool) {
	t.Helper()
	var kv []string
	for k, v := range env {
		kv = append(kv, k+"="+v)
	}
	res, err := ratelimitenv.Translate(kv)
	if err != nil {
		t.Fatalf("rls refuses the environment: %v", err)
	}
	flags, defaults = map[string]string{}, map[string]bool{}
	for _, s := range res.Settings {
		flags[s.Flag] = s.Value
		defaults[s.Flag] = strings.HasPrefix(s.From, "default of")
	}
	return flags, defaults
}

func TestHelmEnvoyGatewayMode(t *testing.T) {
	objs := renderExample(t, "envoy-gateway")
	dep := rlsDeployment(t, objs)
	pod, c, ports := podOf(t, dep)
	env := envOf(t, c)
	delete(env, "GOMEMLIMIT")

	t.Run("environment is Envoy Gateway's, variable by variable", func(t *testing.T) {
		for _, name := range slices.Sorted(maps.Keys(envoyGatewayEnv)) {
			got, ok := env[name]
			switch {
			case !ok:
				t.Errorf("%s is not set; Envoy Gateway sets %q", name, envoyGatewayEnv[name])
			case got != envoyGatewayEnv[name]:
				t.Errorf("%s=%q, Envoy Gateway sets %q", name, got, envoyGatewayEnv[name])
			}
		}
		for name := range env {
			if _, ok := envoyGatewayEnv[name]; !ok {
				t.Errorf("%s=%q is set, which Envoy Gateway does not set", name, env[name])
			}
		}
	})

	t.Run("certgen Secret at /certs", func(t *testing.T) {
		var vol string
		for _, v := range pod.Volumes {
			if v.Secret != nil && v.Secret.SecretName == "envoy-rate-limit" {
				vol = v.Name
			}
		}
		if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == vol && m.MountPath == "/certs" }) {
			t.Errorf("Secret envoy-rate-limit is not mounted at /certs: volumes %v, mounts %v", pod.Volumes, c.VolumeMounts)
		}
	})

	t.Run("rls reads it as Envoy Gateway means it", func(t *testing.T) {
		env := maps.Clone(env)
		env["REDIS_URL"] = "redis.redis-system.svc.cluster.local:6379"
		fromEnv, defaults := translate(t, env)
		args := flagValues(c.Args)
		// A flag in args wins over the environment: it may only say the same as what Envoy
		// Gateway set (envoyproxy/ratelimit's defaults, such as its 24h connection age, it may change).
		for f, v := range fromEnv {
			if a, ok := args[f]; ok && a != v && !defaults[f] {
				t.Errorf("args set --%s=%s over Envoy Gateway's environment, which says %s", f, a, v)
			}
		}
		flags := maps.Clone(fromEnv)
		maps.Copy(flags, args)
		want := map[string]string{
			"xds-server":          "envoy-gateway.envoy-gateway-system.svc.cluster.local:18001",
			"xds-node-id":         "envoy-ratelimit",
			"xds-tls":             "true",
			"xds-tls-ca":          "/certs/ca.crt",
			"xds-tls-cert":        "/certs/tls.crt",
			"xds-tls-key":         "/certs/tls.key",
			"grpc-tls-cert":       "/certs/tls.crt",
			"grpc-tls-key":        "/certs/tls.key",
			"grpc-tls-client-ca":  "/certs/ca.crt",
			"start-without-rules": "true",
			"backend":             "redis",
			"redis-url":           "redis://redis.redis-system.svc.cluster.local:6379",
		}
		for _, f := range slices.Sorted(maps.Keys(want)) {
			if flags[f] != want[f] {
				t.Errorf("--%s=%q from the environment and args, want %q (all: %v)", f, flags[f], want[f], flags)
			}
		}
	})

	t.Run("gRPC on 8081 behind the Service, TLS", func(t *testing.T) {
		svc := rlsService(t, objs, dep)
		p := servicePort(t, svc, "grpc")
		if p.Port != 8081 || ports[p.TargetPort.StrVal] != 8081 {
			t.Errorf("Service grpc port %d -> %s, want 8081 -> container 8081", p.Port, p.TargetPort.String())
		}
		if p.AppProtocol != nil && *p.AppProtocol == "kubernetes.io/h2c" {
			t.Errorf("appProtocol h2c on a TLS port")
		}
	})
}

func servicePort(t *testing.T, svc *corev1.Service, name string) corev1.ServicePort {
	t.Helper()
	for _, p := range svc.Spec.Ports {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("Service %s has no port %q", svc.Name, name)
	return corev1.ServicePort{}
}

func TestHelmAIGatewayMode(t *testing.T) {
	objs := renderExample(t, "ai-gateway")
	dep := rlsDeployment(t, objs)
	_, c, ports := podOf(t, dep)
	flags := flagValues(c.Args)

	t.Run("Service envoy-ai-gateway-ratelimit:8081 in envoy-gateway-system, plaintext HTTP/2", func(t *testing.T) {
		svc := rlsService(t, objs, dep)
		if svc.Name != aiGatewayService || svc.Namespace != aiGatewayNamespace {
			t.Errorf("Service %s/%s, the QuotaPolicy filter calls %s/%s", svc.Namespace, svc.Name, aiGatewayNamespace, aiGatewayService)
		}
		p := servicePort(t, svc, "grpc")
		if p.Port != aiGatewayPort || ports[p.TargetPort.StrVal] != 8081 {
			t.Errorf("Service grpc port %d -> %s, want %d -> rls's gRPC port", p.Port, p.TargetPort.String(), aiGatewayPort)
		}
		if p.AppProtocol == nil || *p.AppProtocol != "kubernetes.io/h2c" {
			t.Errorf("appProtocol %v: the filter's cluster speaks plaintext HTTP/2", p.AppProtocol)
		}
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			t.Errorf("not headless: the filter's STRICT_DNS cluster would see one address")
		}
	})

	t.Run("rules over xDS from the controller, as its node id", func(t *testing.T) {
		want := map[string]string{"xds-server": aiGatewayXDS, "xds-node-id": aiGatewayNodeID, "backend": "redis"}
		for _, f := range slices.Sorted(maps.Keys(want)) {
			if flags[f] != want[f] {
				t.Errorf("--%s=%q, want %q", f, flags[f], want[f])
			}
		}
		for _, f := range []string{"config", "xds-tls", "xds-tls-ca", "xds-tls-cert"} {
			if v, ok := flags[f]; ok {
				t.Errorf("--%s=%s: the controller serves plaintext xDS and the rules", f, v)
			}
		}
		if flags["overdraft"] != "true" {
			t.Errorf("no --overdraft: a token cost charged at stream done past what remains would be refused uncharged, and a budget would never run out")
		}
		if flags["start-without-rules"] != "true" {
			t.Errorf("no --start-without-rules: the controller sends nothing before the first QuotaPolicy, and rls would never be ready")
		}
		if len(all[*corev1.ConfigMap](objs)) != 0 {
			t.Errorf("a rules ConfigMap is rendered; the rules come from the controller")
		}
	})

	t.Run("no envoyproxy/ratelimit environment to override the flags", func(t *testing.T) {
		env := envOf(t, c)
		var kv []string
		for k, v := range env {
			kv = append(kv, k+"="+v)
		}
		res, err := ratelimitenv.Translate(kv)
		if err != nil || len(res.Present) != 0 {
			t.Errorf("environment %v reads as envoyproxy/ratelimit's: %v %v", env, res.Present, err)
		}
		if env["RLS_REDIS_URL"] != "secret rls-redis/url" {
			t.Errorf("RLS_REDIS_URL %q, want it from the example's Secret", env["RLS_REDIS_URL"])
		}
	})
}

// TestHelmRefusesBadValues: values that cannot work fail the render with what to change.
func TestHelmRefusesBadValues(t *testing.T) {
	tests := []struct {
		name string
		ns   string
		vals string
		want string
	}{
		{"unknown mode", "ratelimit", "mode: envoy", `at '/mode': value must be one of 'standalone', 'envoyGateway', 'aiGateway'`},
		{"unknown redis mode", "ratelimit", "redis: {mode: sentinel}", `at '/redis/mode': value must be one of 'none', 'external', 'bundled'`},
		{"misspelt value", "ratelimit", "redis: {mod: external}", `at '/redis': additional properties 'mod' not allowed`},
		{"misspelt top-level value", "ratelimit", "autoscailing: {enabled: true}", `additional properties 'autoscailing' not allowed`},
		{"a flag that is not one", "ratelimit", "extraArgs: [grpc-max-calls=1]", `at '/extraArgs/0'`},
		{"metrics on the gRPC port", "ratelimit", "service: {metricsPort: 8081}", `at '/service/metricsPort'`},
		{"external Redis without a URL", "ratelimit", "redis: {mode: external}", "set redis.external.existingSecret"},
		{"memory backend with two replicas", "ratelimit", "replicaCount: 2", "each replica would allow the whole limit"},
		{"memory backend with an autoscaler", "ratelimit", "autoscaling: {enabled: true}", "each replica would allow the whole limit"},
		{"Envoy Gateway without Redis", "envoy-gateway-system", "mode: envoyGateway", "counted in Redis"},
		{"TLS without a Secret", "ratelimit", "tls: {enabled: true}", "tls.enabled: set tls.secretName"},
		{"mTLS without TLS", "ratelimit", "tls: {clientCA: {enabled: true}}", "needs tls.enabled"},
		{"HTTP over TLS without TLS", "ratelimit", "tls: {http: true}", "tls.http (the HTTP listener over TLS) needs tls.enabled"},
		{"HTTP over TLS scraped on the HTTP port", "ratelimit", "{tls: {enabled: true, secretName: s, http: true}, monitoring: {force: true}}", "set service.metricsPort"},
		{"no rules", "ratelimit", "rules: {files: null}", "mode standalone needs rules"},
		{"a rule file rls would not load", "ratelimit", "rules: {files: {limits.json: 'domain: x'}}", `"limits.json": rls loads *.yaml and *.yml files only`},
		{"AI Gateway in another namespace", "ratelimit", "mode: aiGateway", `install into namespace "envoy-gateway-system"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			vals, err := chartutil.ReadValues([]byte(tt.vals))
			if err != nil {
				t.Fatal(err)
			}
			_, err = render(t, vals.AsMap(), tt.ns)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("render: %v\nwant an error saying %q", err, tt.want)
			}
		})
	}
}

// TestHelmMonitoringNeedsTheAPI: ServiceMonitor and PrometheusRule render only where the
// cluster serves monitoring.coreos.com/v1, or when forced.
func TestHelmMonitoringNeedsTheAPI(t *testing.T) {
	count := func(apis []string, vals map[string]any) (n int) {
		out, err := render(t, vals, "ratelimit", apis...)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range helmObjects(t, out) {
			if strings.HasPrefix(fmt.Sprintf("%T", o), "*v1.ServiceMonitor") || strings.HasPrefix(fmt.Sprintf("%T", o), "*v1.PrometheusRule") {
				n++
			}
		}
		return n
	}
	force := map[string]any{"monitoring": map[string]any{"force": true}}
	if n := count(nil, nil); n != 0 {
		t.Errorf("without the API: %d monitoring objects, want none", n)
	}
	if n := count([]string{monitoringAPI}, nil); n != 2 {
		t.Errorf("with the API: %d monitoring objects, want a ServiceMonitor and a PrometheusRule", n)
	}
	if n := count(nil, force); n != 2 {
		t.Errorf("forced: %d monitoring objects, want a ServiceMonitor and a PrometheusRule", n)
	}
}
