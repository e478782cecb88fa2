package deploy_test

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestKubernetesNetworkPolicy checks networkpolicy.yaml against the Deployments and Services it
// guards: rls's pods are selected, gRPC and HTTP are each open to their own callers only, named
// by namespace, nothing else of the pod (the debug port above all) is open, what the Service
// exposes is allowed, and Redis takes connections from rls's pods only.
func TestKubernetesNetworkPolicy(t *testing.T) {
	objs := k8sObjects(t)
	dep := only[*appsv1.Deployment](t, objs, "rls")
	svc := only[*corev1.Service](t, objs, "rls")
	redisDep := only[*appsv1.Deployment](t, objs, "redis")
	np := only[*networkingv1.NetworkPolicy](t, objs, "rls")
	redisNP := only[*networkingv1.NetworkPolicy](t, objs, "redis")
	c := dep.Spec.Template.Spec.Containers[0]
	flags := flagValues(c.Args)

	checks := []struct {
		name  string
		check func() error
	}{
		{"rls policy selects rls's pods, for ingress", func() error {
			return selectsPods(np, dep)
		}},
		{"every rule opens named ports to named peers", func() error {
			return rulesBounded(np)
		}},
		{"gRPC only from the Envoys, HTTP only from Prometheus, nothing else", func() error {
			allowed, err := allowedPorts(np, c)
			if err != nil {
				return err
			}
			want := map[string]int32{"grpc": 8081, "http": 8080}
			if len(allowed) != len(want) {
				return fmt.Errorf("ports opened %v, want %v", allowed, want)
			}
			for name, port := range want {
				if _, ok := allowed[port]; !ok {
					return fmt.Errorf("port %s (%d) is not opened", name, port)
				}
			}
			grpc, http := allowed[8081], allowed[8080]
			if strings.Contains(grpc, "monitoring") || !strings.Contains(grpc, "envoy-gateway-system") {
				return fmt.Errorf("gRPC peers %s: want the Envoys, not Prometheus", grpc)
			}
			if !strings.Contains(http, "kubernetes.io/metadata.name=monitoring") || strings.Contains(http, "envoy") {
				return fmt.Errorf("HTTP peers %s: want Prometheus only", http)
			}
			return nil
		}},
		{"deployment ports match the policy: probes and Service reach allowed ports, debug port closed", func() error {
			allowed, err := allowedPorts(np, c)
			if err != nil {
				return err
			}
			for _, p := range c.Ports {
				if _, ok := allowed[p.ContainerPort]; !ok {
					return fmt.Errorf("container port %s (%d) is declared but the policy closes it", p.Name, p.ContainerPort)
				}
			}
			for _, sp := range svc.Spec.Ports {
				port, err := resolvePort(sp.TargetPort, c)
				if err != nil {
					return fmt.Errorf("Service port %s: %v", sp.Name, err)
				}
				if _, ok := allowed[port]; !ok {
					return fmt.Errorf("Service port %s targets %d, which the policy closes", sp.Name, port)
				}
			}
			if p := c.ReadinessProbe; p == nil || p.GRPC == nil {
				return errors.New("readiness probe is not the gRPC one this test expects")
			} else if _, ok := allowed[p.GRPC.Port]; !ok {
				return fmt.Errorf("readiness probe on %d, which the policy closes", p.GRPC.Port)
			}
			debug := "127.0.0.1:6070" // rls's default
			if v, ok := flags["debug-addr"]; ok {
				debug = v
			}
			if debug != "" {
				host, port, err := net.SplitHostPort(debug)
				if err != nil {
					return fmt.Errorf("--debug-addr %q: %v", debug, err)
				}
				if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
					return fmt.Errorf("--debug-addr %q is not loopback: it shows every rule and any key's state", debug)
				}
				n, _ := strconv.Atoi(port)
				if _, ok := allowed[int32(n)]; ok {
					return fmt.Errorf("the policy opens the debug port %d", n)
				}
			}
			return nil
		}},
		{"Redis only from rls's pods", func() error {
			if err := selectsPods(redisNP, redisDep); err != nil {
				return err
			}
			if err := rulesBounded(redisNP); err != nil {
				return err
			}
			allowed, err := allowedPorts(redisNP, redisDep.Spec.Template.Spec.Containers[0])
			if err != nil {
				return err
			}
			if len(allowed) != 1 || allowed[6379] == "" {
				return fmt.Errorf("Redis ports opened %v, want 6379 only", allowed)
			}
			for _, r := range redisNP.Spec.Ingress {
				for _, peer := range r.From {
					if peer.NamespaceSelector != nil || peer.IPBlock != nil || peer.PodSelector == nil ||
						!matches(peer.PodSelector, dep.Spec.Template.Labels) || matches(peer.PodSelector, redisDep.Spec.Template.Labels) {
						return fmt.Errorf("Redis peer %s: want rls's pods of this namespace only", peerString(peer))
					}
				}
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

// selectsPods checks that np applies to dep's pods, for ingress.
func selectsPods(np *networkingv1.NetworkPolicy, dep *appsv1.Deployment) error {
	if np.Namespace != dep.Namespace {
		return fmt.Errorf("policy in %q, pods in %q", np.Namespace, dep.Namespace)
	}
	if len(np.Spec.PodSelector.MatchLabels) == 0 || !matches(&np.Spec.PodSelector, dep.Spec.Template.Labels) {
		return fmt.Errorf("podSelector %v does not select %s's pods %v", np.Spec.PodSelector.MatchLabels, dep.Name, dep.Spec.Template.Labels)
	}
	if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
		return fmt.Errorf("policyTypes %v: want Ingress", np.Spec.PolicyTypes)
	}
	return nil
}

// rulesBounded checks that no rule of np opens every port or admits every peer: a rule without
// ports opens all of them, one without from admits anyone, and an empty namespaceSelector is
// every namespace.
func rulesBounded(np *networkingv1.NetworkPolicy) error {
	if len(np.Spec.Ingress) == 0 {
		return errors.New("no ingress rule: the pods would take no connection at all")
	}
	for i, r := range np.Spec.Ingress {
		if len(r.Ports) == 0 {
			return fmt.Errorf("ingress rule %d has no ports: it opens every port", i+1)
		}
		if len(r.From) == 0 {
			return fmt.Errorf("ingress rule %d has no from: it admits anyone", i+1)
		}
		for _, p := range r.From {
			switch {
			case p.IPBlock != nil:
				if p.IPBlock.CIDR == "0.0.0.0/0" || p.IPBlock.CIDR == "::/0" {
					return fmt.Errorf("ingress rule %d admits every address", i+1)
				}
			case p.NamespaceSelector != nil && len(p.NamespaceSelector.MatchLabels) == 0 && len(p.NamespaceSelector.MatchExpressions) == 0:
				return fmt.Errorf("ingress rule %d: an empty namespaceSelector admits every namespace", i+1)
			case p.NamespaceSelector == nil && p.PodSelector != nil && len(p.PodSelector.MatchLabels) == 0 && len(p.PodSelector.MatchExpressions) == 0:
				return fmt.Errorf("ingress rule %d: an empty podSelector admits every pod of the namespace", i+1)
			}
		}
	}
	return nil
}

// allowedPorts maps each port np opens (names resolved against c's ports) to its peers.
func allowedPorts(np *networkingv1.NetworkPolicy, c corev1.Container) (map[int32]string, error) {
	allowed := map[int32]string{}
	for i, r := range np.Spec.Ingress {
		var peers []string
		for _, p := range r.From {
			peers = append(peers, peerString(p))
		}
		for _, p := range r.Ports {
			if p.Port == nil {
				return nil, fmt.Errorf("ingress rule %d: a port entry without a port opens every port", i+1)
			}
			if p.EndPort != nil {
				return nil, fmt.Errorf("ingress rule %d: a port range", i+1)
			}
			if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
				return nil, fmt.Errorf("ingress rule %d: protocol %s, rls speaks TCP only", i+1, *p.Protocol)
			}
			port, err := resolvePort(*p.Port, c)
			if err != nil {
				return nil, fmt.Errorf("ingress rule %d: %v", i+1, err)
			}
			if _, twice := allowed[port]; twice {
				return nil, fmt.Errorf("port %d opened by two rules", port)
			}
			allowed[port] = strings.Join(peers, "; ")
		}
	}
	return allowed, nil
}

// resolvePort is the container port that p names (by name or number) on c.
func resolvePort(p intstr.IntOrString, c corev1.Container) (int32, error) {
	for _, cp := range c.Ports {
		if p.Type == intstr.String && cp.Name == p.StrVal || p.Type == intstr.Int && cp.ContainerPort == p.IntVal {
			return cp.ContainerPort, nil
		}
	}
	return 0, fmt.Errorf("port %s is not a port of container %s", p.String(), c.Name)
}

func matches(sel *metav1.LabelSelector, labels map[string]string) bool {
	if sel == nil || len(sel.MatchExpressions) > 0 {
		return false
	}
	for k, v := range sel.MatchLabels {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func peerString(p networkingv1.NetworkPolicyPeer) string {
	var parts []string
	sel := func(what string, s *metav1.LabelSelector) {
		if s == nil {
			return
		}
		var kv []string
		for k, v := range s.MatchLabels {
			kv = append(kv, k+"="+v)
		}
		slices.Sort(kv)
		parts = append(parts, what+"{"+strings.Join(kv, ",")+"}")
	}
	sel("namespace", p.NamespaceSelector)
	sel("pod", p.PodSelector)
	if p.IPBlock != nil {
		parts = append(parts, "ip{"+p.IPBlock.CIDR+"}")
	}
	return strings.Join(parts, " ")
}
