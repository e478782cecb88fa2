package deploy_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// recommendedPolicy is the maxmemory-policy docs/redis.md recommends and tests under a flood
// (integration/redis_memory_test.go): it never evicts rls's epoch key (no expiry), and evicts
// the keys nearest their expiry first, so a spent key stays spent.
const recommendedPolicy = "volatile-ttl"

// TestRedisMaxmemoryPolicy: every Redis that deploy/ ships (Compose, the Kubernetes manifest,
// the chart's bundled Redis) runs with a maxmemory and the recommended policy, and
// docs/redis.md recommends that policy.
func TestRedisMaxmemoryPolicy(t *testing.T) {
	policyArg := regexp.MustCompile(`"--maxmemory-policy",\s*"([^"]+)"`)
	for _, f := range []string{"compose.yaml", filepath.Join("kubernetes", "redis.yaml"), filepath.Join("helm", "rls", "templates", "redis.yaml")} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		m := policyArg.FindAllStringSubmatch(string(b), -1)
		if len(m) != 1 || !strings.Contains(string(b), `"--maxmemory"`) {
			t.Errorf("%s: %d --maxmemory-policy arguments, want one, beside a --maxmemory", f, len(m))
			continue
		}
		if m[0][1] != recommendedPolicy {
			t.Errorf("%s: --maxmemory-policy %s, want %s (docs/redis.md)", f, m[0][1], recommendedPolicy)
		}
	}
	doc, err := os.ReadFile(filepath.Join("..", "docs", "redis.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), "maxmemory-policy "+recommendedPolicy) {
		t.Errorf("docs/redis.md does not recommend maxmemory-policy %s", recommendedPolicy)
	}
}
