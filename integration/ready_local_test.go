package integration

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/redistest"
)

// TestReadyWhileALocalRuleAnswers: with Redis gone and the default failure mode error, a rule
// with failure_mode local still decides, so rls stays ready (degraded) and in its Service:
// taken out, it would leave Envoy no rls at all, and the local rule would never run. Once a
// reload leaves no rule that answers without Redis, rls is not ready.
func TestReadyWhileALocalRuleAnswers(t *testing.T) {
	r := redistest.Start(t)
	const withLocal = `
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: cart
    failure_mode: local
    rate_limit: {unit: hour, requests_per_unit: 2}
`
	rules := writeRules(t, map[string]string{"shop.yaml": withLocal})
	p := startRLS(t, nil, "--config", rules, "--backend", "redis", "--redis-url", r.URL(), "--redis-timeout", "200ms",
		"--redis-local-cache-size", "0")
	c := p.client(t)
	ctx := ctxT(t)
	readyz := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + p.HTTPAddr + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	ask := func(key, value string) (rlsv3.RateLimitResponse_Code, error) {
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: oneDesc(d(key, value))})
		return resp.GetOverallCode(), err
	}
	await := func(what string, cond func(code int, body string) bool) {
		t.Helper()
		for deadline := time.Now().Add(15 * time.Second); ; {
			code, body := readyz()
			if cond(code, body) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 15s: /readyz %d %q\n%s", what, code, body, p.Output())
			}
			_, _ = ask("user", "u") // the backend learns Redis's state from calls too
			time.Sleep(20 * time.Millisecond)
		}
	}
	if code, body := readyz(); code != http.StatusOK || body != "ready\n" {
		t.Fatalf("Redis answering: /readyz %d %q, want 200 ready", code, body)
	}

	r.Kill()
	await("Redis gone, a local rule in force: /readyz 200, degraded", func(code int, body string) bool {
		return code == http.StatusOK && strings.Contains(body, "degraded: backend unavailable")
	})
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got, err := ask("cart", "c1"); err != nil || got != want {
			t.Errorf("cart call %d with Redis gone: %v %v, want %v (failure_mode local: 2 an hour in this process)", i, got, err, want)
		}
	}
	if _, err := ask("user", "u1"); status.Code(err) != codes.Unavailable {
		t.Errorf("user call with Redis gone: %v, want UNAVAILABLE (the default failure mode, error)", err)
	}

	// A reload that leaves every rule on the default failure mode, error.
	withoutLocal := strings.Replace(withLocal, "    failure_mode: local\n", "", 1)
	if err := os.WriteFile(filepath.Join(rules, "shop.yaml"), []byte(withoutLocal), 0o644); err != nil {
		t.Fatal(err)
	}
	p.Signal(t, syscall.SIGHUP)
	await("no rule answers without Redis: /readyz 503", func(code int, body string) bool {
		return code == http.StatusServiceUnavailable && strings.Contains(body, "every failure mode is error")
	})
}
