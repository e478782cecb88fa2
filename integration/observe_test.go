package integration

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

const observeRules = `
domain: obs
descriptors:
  - key: api_key
    rate_limit: {unit: hour, requests_per_unit: 5, name: per_key}
  - key: path
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 10}
`

// metricValues scrapes /metrics and returns each sample line's value by its name and labels.
func metricValues(t *testing.T, addr string) map[string]string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	vals := map[string]string{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		vals[line[:i]] = line[i+1:]
	}
	return vals
}

func TestMetricsCountExactly(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"obs.yaml": observeRules}), "--near-limit-ratio", "0.8")
	c := p.client(t)
	ctx := ctxT(t)
	send := func(ds ...*ratelimitv3.RateLimitDescriptor) {
		t.Helper()
		if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "obs", Descriptors: ds}); err != nil {
			t.Fatal(err)
		}
	}
	// per_key (5/hour): 3 ok, 2 near_limit (4 and 5 of 5 used ≥ 80%), 2 over_limit.
	for range 7 {
		send(d("api_key", "k1"))
	}
	// shadow (1/hour): 1 near_limit (it uses the whole burst), then 2 shadow_mode.
	for range 3 {
		send(d("path", "/x"))
	}
	// detailed_metric: the value appears in the label.
	send(d("user", "alice"), d("api_key", "k2"))
	// A request with 3 hits on a fresh key.
	if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "obs", HitsAddend: 3, Descriptors: []*ratelimitv3.RateLimitDescriptor{d("api_key", "k3")}}); err != nil {
		t.Fatal(err)
	}

	want := map[string]string{
		`rls_decisions_total{domain="obs",outcome="ok",rule="per_key"}`:         "5", // k1 ×3, k2, k3
		`rls_decisions_total{domain="obs",outcome="near_limit",rule="per_key"}`: "2",
		`rls_decisions_total{domain="obs",outcome="over_limit",rule="per_key"}`: "2",
		`rls_hits_total{domain="obs",rule="per_key"}`:                           "11", // 7 + 1 + 3
		`rls_decisions_total{domain="obs",outcome="near_limit",rule="path"}`:    "1",
		`rls_decisions_total{domain="obs",outcome="shadow_mode",rule="path"}`:   "2",
		`rls_decisions_total{domain="obs",outcome="ok",rule="user=alice"}`:      "1",
		`rls_config_loads_total{result="success"}`:                              "1",
		`rls_config_loads_total{result="failure"}`:                              "0",
		`rls_config_generation`:                      "1",
		`rls_backend_request_duration_seconds_count`: "12",
		`rls_memory_evictions_total`:                 "0",
		`grpc_server_handled_total{grpc_code="OK",grpc_method="ShouldRateLimit",grpc_service="envoy.service.ratelimit.v3.RateLimitService",grpc_type="unary"}`: "12",
	}
	got := metricValues(t, p.HTTPAddr)
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// The memory backend holds the keys still using their hour: k1, k2, k3, /x and alice at least.
	if n, err := strconv.Atoi(got["rls_memory_keys"]); err != nil || n < 5 {
		t.Errorf("rls_memory_keys = %q, want at least 5", got["rls_memory_keys"])
	}
	if n, err := strconv.Atoi(got["rls_memory_bytes"]); err != nil || n <= 0 {
		t.Errorf("rls_memory_bytes = %q, want above 0", got["rls_memory_bytes"])
	}
	for k := range got {
		if strings.Contains(k, "k1") || strings.Contains(k, "/x") {
			t.Errorf("a descriptor value leaked into a label of a rule without detailed_metric: %s", k)
		}
	}
}

// TestDebugEndpoints: the rules in force and any key's state are shown on the debug listener
// only (loopback by default), never on the HTTP listener; pprof only with --debug.
func TestDebugEndpoints(t *testing.T) {
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"obs.yaml": observeRules}))
	c := p.client(t)
	ctx := ctxT(t)
	for range 2 {
		if _, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "obs", Descriptors: []*ratelimitv3.RateLimitDescriptor{d("api_key", "e1")}}); err != nil {
			t.Fatal(err)
		}
	}
	const explainBody = `{"domain":"obs","descriptors":[{"entries":[{"key":"api_key","value":"e1"}]},{"entries":[{"key":"nope","value":"x"}]}]}`
	explain := func() map[string]any {
		t.Helper()
		resp, err := http.Post("http://"+p.DebugAddr+"/debug/explain", "application/json", strings.NewReader(explainBody))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("explain: %d %s", resp.StatusCode, body)
		}
		var out map[string]any
		if err := json.Unmarshal(body, &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for round := range 3 { // explaining never consumes
		out := explain()
		ds := out["descriptors"].([]any)
		first := ds[0].(map[string]any)
		rule := first["rule"].(map[string]any)
		lim := first["limits"].([]any)[0].(map[string]any)
		if rule["path"] != "api_key" || !strings.HasSuffix(rule["source"].(string), "obs.yaml:4") || lim["remaining"] != float64(3) || lim["name"] != "per_key" || lim["backend_key"] == "" {
			t.Fatalf("round %d: first descriptor %v", round, first)
		}
		if second := ds[1].(map[string]any); second["rule"] != nil || second["reason"] != `no rule matches entry 0 (key "nope") at the top level` {
			t.Fatalf("round %d: second descriptor %v", round, second)
		}
	}
	resp, err := http.Get("http://" + p.DebugAddr + "/debug/rules")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), `"generation": 1`) || !strings.Contains(string(body), `"path": "api_key"`) || !strings.Contains(string(body), "obs.yaml") {
		t.Fatalf("/debug/rules: %s", body)
	}

	// Nothing under /debug/ on the HTTP listener, with or without --debug.
	q := startRLS(t, nil, "--debug")
	for _, proc := range []*rlsProc{p, q} {
		for _, req := range []struct{ method, path, body string }{
			{"GET", "/debug/rules", ""},
			{"POST", "/debug/explain", explainBody},
			{"GET", "/debug/pprof/", ""},
		} {
			if code := httpStatus(t, req.method, "http://"+proc.HTTPAddr+req.path, req.body); code != http.StatusNotFound {
				t.Errorf("%s %s on the HTTP listener: %d, want 404", req.method, req.path, code)
			}
		}
	}
	// pprof only with --debug, on the debug listener.
	if code := httpStatus(t, "GET", "http://"+p.DebugAddr+"/debug/pprof/", ""); code != http.StatusNotFound {
		t.Errorf("pprof without --debug: %d, want 404", code)
	}
	if code := httpStatus(t, "GET", "http://"+q.DebugAddr+"/debug/pprof/", ""); code != http.StatusOK {
		t.Errorf("pprof with --debug: %d, want 200", code)
	}
	// The debug listener is on loopback unless told otherwise.
	if out, code := runBinary(t, "-h"); code != 0 || !strings.Contains(out, `--debug-addr (RLS_DEBUG_ADDR)`) || !strings.Contains(out, `(default "127.0.0.1:6070")`) {
		t.Errorf("rls -h: exit %d, want 0 and --debug-addr defaulting to 127.0.0.1:6070:\n%s", code, out)
	}
}

// httpStatus sends one request and returns its status code.
func httpStatus(t *testing.T, method, url, body string) int {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}
