package integration

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/lua/v3" // envoy-tokens.yaml's Lua filter
	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/rls-project/rls/internal/envoytest"
	"github.com/rls-project/rls/internal/redistest"
)

// Usage-based limits through the real binary: reports charged after the fact (overdraft),
// checks (hits 0), and the /v1/keys endpoints with rls inspect and rls reset.

// usageRules: a limit of 1000 tokens a minute scaled to 1000 a second, so that the 4.8 minutes of
// debt after 800 + 5000 tokens are 4.8 seconds; the same without overdraft; and 1000 a day,
// whose 86.4 s per token makes the total charged readable exactly from the time to reset.
const usageRules = `
domain: ai
descriptors:
  - key: api_key
    descriptors:
      - key: model
        rate_limit: {unit: second, requests_per_unit: 1000, overdraft: true}
  - key: plain_key
    descriptors:
      - key: model
        rate_limit: {unit: second, requests_per_unit: 1000}
  - key: daily_key
    rate_limit: {unit: day, requests_per_unit: 1000, overdraft: true}
`

// clockSlack covers the clocks rls (or Redis) and the test read being distinct and read at
// different granularities: a bound on a wait derived from the test's clock is off by at most it.
const clockSlack = 5 * time.Millisecond

// usageBackends are the backends each usage test runs against: memory, and Redis single node
// and Cluster (each with its own key prefix).
func usageBackends(t *testing.T) []struct {
	name string
	args func(t *testing.T) []string
} {
	redis := func(env string) func(t *testing.T) []string {
		return func(t *testing.T) []string {
			return []string{"--backend", "redis", "--redis-url", redistest.URL(t, env),
				"--redis-key-prefix", fmt.Sprintf("usage-%d:", time.Now().UnixNano()), "--redis-timeout", "5s"}
		}
	}
	return []struct {
		name string
		args func(t *testing.T) []string
	}{
		{"memory", func(*testing.T) []string { return []string{"--backend", "memory"} }},
		{"redis", redis(redistest.SingleEnv)},
		{"cluster", redis(redistest.ClusterEnv)},
	}
}

// tokensDesc is [(key, k1), (model, model)] with a per-descriptor hits_addend (0: a check).
func tokensDesc(key, model string, hits uint64) *ratelimitv3.RateLimitDescriptor {
	desc := d(key, "k1", "model", model)
	desc.HitsAddend = wrapperspb.UInt64(hits)
	return desc
}

func askUsage(t *testing.T, c rlsv3.RateLimitServiceClient, descs ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: descs})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// keyState is one limit of GET /v1/keys.
type keyState struct {
	Remaining   int64   `json:"remaining"`
	ResetAfter  float64 `json:"reset_after_seconds"`
	InDebt      bool    `json:"in_debt"`
	Debt        int64   `json:"debt"`
	RepaidAfter float64 `json:"repaid_after_seconds"`
}

// keysCall calls /v1/keys for one descriptor; token "" sends none.
func keysCall(t *testing.T, p *rlsProc, method, descriptor, token string) (int, []keyState) {
	t.Helper()
	u := "http://" + p.HTTPAddr + "/v1/keys?" + url.Values{"domain": {"ai"}, "descriptor": {descriptor}}.Encode()
	req, err := http.NewRequestWithContext(ctxT(t), method, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var res struct {
		Descriptors []struct {
			Limits []keyState `json:"limits"`
		} `json:"descriptors"`
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil || len(res.Descriptors) != 1 {
		t.Fatalf("%s /v1/keys: %v %+v", method, err, res)
	}
	return resp.StatusCode, res.Descriptors[0].Limits
}

func inspectOne(t *testing.T, p *rlsProc, descriptor string) keyState {
	t.Helper()
	code, ls := keysCall(t, p, http.MethodGet, descriptor, "")
	if code != http.StatusOK || len(ls) != 1 {
		t.Fatalf("inspect %s: %d %+v", descriptor, code, ls)
	}
	return ls[0]
}

// TestUsageSequence is a response-token sequence through the binary on every backend: 800 then
// 5000 tokens reported on a 1000-a-second key (1000 a minute, scaled down) put it 4800 tokens in
// debt; checks are denied for 4.8 seconds, with limit_remaining 0 and duration_until_reset the
// time until repaid, and admitted after; another key is untouched; without overdraft the same
// sequence keeps the old behaviour (the 5000 denied and not charged, the check admitted).
func TestUsageSequence(t *testing.T) {
	rules := writeRules(t, map[string]string{"ai.yaml": usageRules})
	for _, be := range usageBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			p := startRLS(t, nil, append([]string{"--config", rules}, be.args(t)...)...)
			c := p.client(t)
			if r := askUsage(t, c, tokensDesc("api_key", "m", 0)); codes_(r) != "OK OK" || r.Statuses[0].LimitRemaining != 1000 {
				t.Fatalf("first check: %v", r)
			}
			// The 800 are charged after reported; the debt is repaid 4.8 s after that instant.
			reported := time.Now()
			if r := askUsage(t, c, tokensDesc("api_key", "m", 800)); codes_(r) != "OK OK" {
				t.Fatalf("report 800: %v", r)
			}
			if r := askUsage(t, c, tokensDesc("api_key", "m", 5000)); codes_(r) != "OVER_LIMIT OVER_LIMIT" {
				t.Fatalf("report 5000: %v, want OVER_LIMIT (and charged)", r)
			}
			r := askUsage(t, c, tokensDesc("api_key", "m", 0))
			since := time.Since(reported)
			wait := r.Statuses[0].GetDurationUntilReset().AsDuration()
			// (800 + 5000 - 1000) / 1000 per second = 4.8 s, less the time since the 800 were
			// charged, which is at most since.
			if lo := 4800*time.Millisecond - since - clockSlack; codes_(r) != "OVER_LIMIT OVER_LIMIT" || r.Statuses[0].LimitRemaining != 0 || wait < lo || wait > 4800*time.Millisecond {
				t.Fatalf("check in debt %v after the reports: %s remaining %d until %v, want OVER_LIMIT, 0, within [%v, 4.8s]", since, codes_(r), r.Statuses[0].LimitRemaining, wait, lo)
			}
			st := inspectOne(t, p, "api_key=k1,model=m")
			since = time.Since(reported)
			if lo := 4800 - (since + clockSlack).Milliseconds(); !st.InDebt || st.Remaining != 0 || st.Debt < lo || st.Debt > 4800 || st.RepaidAfter > 4.8 {
				t.Fatalf("inspect in debt %v after the reports: %+v, want a debt within [%d, 4800]", since, st, lo)
			}
			// A request with hits while in debt is denied too (and, as a report would be, charged).
			if r := askUsage(t, c, d("api_key", "k1", "model", "m")); codes_(r) != "OVER_LIMIT OVER_LIMIT" {
				t.Fatalf("request with request-level hits 0 (means 1) in debt: %v", r)
			}
			// Another key, and the same key under another model, are untouched.
			if r := askUsage(t, c, tokensDesc("api_key", "other", 0)); codes_(r) != "OK OK" || r.Statuses[0].LimitRemaining != 1000 {
				t.Fatalf("another key: %v", r)
			}
			time.Sleep(wait + 5*time.Millisecond)
			if r := askUsage(t, c, tokensDesc("api_key", "m", 0)); codes_(r) != "OK OK" {
				t.Fatalf("check once repaid: %v", r)
			}

			// Without overdraft: today's behaviour.
			askUsage(t, c, tokensDesc("plain_key", "m", 800))
			if r := askUsage(t, c, tokensDesc("plain_key", "m", 5000)); codes_(r) != "OVER_LIMIT OVER_LIMIT" {
				t.Fatalf("plain report 5000: %v", r)
			}
			if r := askUsage(t, c, tokensDesc("plain_key", "m", 0)); codes_(r) != "OK OK" || r.Statuses[0].LimitRemaining < 200 {
				t.Fatalf("plain check: %v, want admitted with the 5000 not charged", r)
			}
		})
	}
}

// TestUsageReplicasShareReports: three replicas on one Redis (single node and Cluster) take
// concurrent reports, and checks, for one key: the total charged, read back through
// /v1/keys, equals the sum of the reports exactly. At 1000 a day one token is 86.4 s of
// debt, so the time to reset gives the total to the token.
func TestUsageReplicasShareReports(t *testing.T) {
	rules := writeRules(t, map[string]string{"ai.yaml": usageRules})
	for _, be := range usageBackends(t)[1:] {
		t.Run(be.name, func(t *testing.T) {
			args := append([]string{"--config", rules}, be.args(t)...)
			var procs []*rlsProc
			for range 3 {
				procs = append(procs, startRLS(t, nil, args...))
			}
			user := fmt.Sprintf("u-%d", time.Now().UnixNano())
			var sum atomic.Int64
			var wg sync.WaitGroup
			for g := range 9 {
				c := procs[g%3].client(t)
				rng := rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano())))
				wg.Go(func() {
					for range 20 {
						hits := uint64(rng.IntN(3000)) // 0: a check, which charges nothing
						desc := d("daily_key", user)
						desc.HitsAddend = wrapperspb.UInt64(hits)
						if _, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: "ai", Descriptors: oneDesc(desc)}); err != nil {
							t.Errorf("report: %v", err)
							return
						}
						sum.Add(int64(hits))
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			st := inspectOne(t, procs[1], "daily_key="+user)
			perToken := 86.4
			charged := int64(math.Ceil(st.ResetAfter / perToken))
			if charged != sum.Load() || !st.InDebt || st.Debt != sum.Load()-1000 {
				t.Fatalf("reports summing to %d: reset after %.6fs is %d tokens charged, debt %d (%+v)", sum.Load(), st.ResetAfter, charged, st.Debt, st)
			}
		})
	}
}

// TestUsageKeysEndpoints: /v1/keys and rls inspect / rls reset on every backend. Reading charges
// nothing; resetting is off (404) without --admin-token-file and refused (403) with a missing
// or wrong token, changing nothing; with the token the key gets its budget back, another key
// keeps its state, and the log names who reset what, never the token.
func TestUsageKeysEndpoints(t *testing.T) {
	rules := writeRules(t, map[string]string{"ai.yaml": usageRules})
	const token = "0123456789abcdef-admin"
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, be := range usageBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--config", rules}, be.args(t)...)
			p := startRLS(t, nil, append(args, "--admin-token-file", tokenFile)...)
			noToken := startRLS(t, nil, args...)
			user, other := fmt.Sprintf("r-%d", time.Now().UnixNano()), fmt.Sprintf("o-%d", time.Now().UnixNano())
			c := p.client(t)
			askUsage(t, c, withHits(d("daily_key", user), 1500))
			askUsage(t, c, withHits(d("daily_key", other), 10))
			before := inspectOne(t, p, "daily_key="+user)
			if !before.InDebt || before.Debt != 500 || before.Remaining != 0 {
				t.Fatalf("inspect: %+v, want 500 in debt", before)
			}
			same := func(step string) {
				t.Helper()
				st := inspectOne(t, p, "daily_key="+user)
				if st.Debt != before.Debt || !st.InDebt || math.Abs(st.ResetAfter-before.ResetAfter) > 60 {
					t.Fatalf("%s: the key changed: %+v, was %+v", step, st, before)
				}
			}
			same("inspecting twice")
			for _, tc := range []struct {
				name   string
				p      *rlsProc
				method string
				token  string
				want   int
			}{
				{"no token file", noToken, http.MethodPost, token, http.StatusNotFound},
				{"no token file, DELETE", noToken, http.MethodDelete, "", http.StatusNotFound},
				{"no token", p, http.MethodPost, "", http.StatusForbidden},
				{"wrong token", p, http.MethodDelete, token + "x", http.StatusForbidden},
			} {
				if code, _ := keysCall(t, tc.p, tc.method, "daily_key="+user, tc.token); code != tc.want {
					t.Fatalf("%s: %d, want %d", tc.name, code, tc.want)
				}
				same(tc.name)
			}

			// rls inspect and rls reset, as an operator runs them.
			out, err := exec.Command(rlsBinary(t), "inspect", "--http-url", p.HTTPAddr, "--domain", "ai", "daily_key="+user).CombinedOutput()
			if err != nil || !strings.Contains(string(out), `"in_debt": true`) || !strings.Contains(string(out), `"debt": 500`) {
				t.Fatalf("rls inspect: %v\n%s", err, out)
			}
			wrongFile := filepath.Join(t.TempDir(), "wrong")
			if err := os.WriteFile(wrongFile, []byte("not-the-token-at-all"), 0o600); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command(rlsBinary(t), "reset", "--http-url", p.HTTPAddr, "--domain", "ai", "--admin-token-file", wrongFile, "daily_key="+user).CombinedOutput(); err == nil || !strings.Contains(string(out), "403") {
				t.Fatalf("rls reset with a wrong token: %v\n%s", err, out)
			}
			same("rls reset with a wrong token")
			out, err = exec.Command(rlsBinary(t), "reset", "--http-url", p.HTTPAddr, "--domain", "ai", "--admin-token-file", tokenFile, "daily_key="+user).CombinedOutput()
			if err != nil || !strings.Contains(string(out), `"reset": 1`) {
				t.Fatalf("rls reset: %v\n%s", err, out)
			}
			if st := inspectOne(t, p, "daily_key="+user); st.InDebt || st.Remaining != 1000 || st.ResetAfter != 0 {
				t.Fatalf("after reset: %+v, want a full budget", st)
			}
			if r := askUsage(t, c, withHits(d("daily_key", user), 0)); codes_(r) != "OK OK" {
				t.Fatalf("check after reset: %v", r)
			}
			if st := inspectOne(t, p, "daily_key="+other); st.Remaining != 990 {
				t.Fatalf("another key after reset: %+v, want untouched", st)
			}
			logs := p.Output()
			if !strings.Contains(logs, "keys reset") || !strings.Contains(logs, "remote=127.0.0.1") || !strings.Contains(logs, "daily_key="+user) || strings.Contains(logs, token) {
				t.Fatalf("log of the reset:\n%s", logs)
			}
		})
	}
}

func withHits(desc *ratelimitv3.RateLimitDescriptor, hits uint64) *ratelimitv3.RateLimitDescriptor {
	desc.HitsAddend = wrapperspb.UInt64(hits)
	return desc
}

// TestEnvoyTokenDescriptors plays Envoy running deploy/envoy/envoy-tokens.yaml against the real
// rls loaded with deploy/envoy/rules-tokens: it derives from the route's two rate limits the
// descriptors Envoy sends at request time (the check, hits_addend 0) and when the stream is done
// (the report, hits_addend from the dynamic metadata the Lua filter sets), and checks what
// docs/usage-limits.md promises: after 800 + 5000 tokens on the 1000-a-minute key, the next request is
// answered 429 with Retry-After 4.8 minutes (the debt), while another key is untouched.
func TestEnvoyTokenDescriptors(t *testing.T) {
	bs := envoytest.Load(t, envoyFile("envoy-tokens.yaml"))
	var hcm *hcmv3.HttpConnectionManager
	var global *httprlv3.RateLimit
	for _, l := range bs.GetStaticResources().GetListeners() {
		for _, f := range l.GetFilterChains()[0].GetFilters() {
			if h := envoytest.Unpack[*hcmv3.HttpConnectionManager](t, f.GetTypedConfig()); h != nil {
				hcm = h
			}
		}
	}
	for _, f := range hcm.GetHttpFilters() {
		if g := envoytest.Unpack[*httprlv3.RateLimit](t, f.GetTypedConfig()); g != nil {
			global = g
		}
	}
	route := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()[0]
	per := envoytest.Unpack[*httprlv3.RateLimitPerRoute](t, route.GetTypedPerFilterConfig()["envoy.filters.http.ratelimit"])
	domain := per.GetDomain()
	if domain == "" {
		domain = global.GetDomain()
	}
	metaFormat := regexp.MustCompile(`^%DYNAMIC_METADATA\(([^:)]+):([^:)]+)\)%$`)

	// derive is Envoy's descriptor derivation for one phase: the rate limits of the phase
	// (apply_on_stream_done or not), each a descriptor when every action produces an entry,
	// with its hits_addend (a number, or a format of dynamic metadata; a format that does not
	// resolve to a whole number in [0, 1e9] drops the descriptor).
	derive := func(req httpRequest, streamDone bool, meta map[string]map[string]any) []*ratelimitv3.RateLimitDescriptor {
		var out []*ratelimitv3.RateLimitDescriptor
	limits:
		for _, rl := range per.GetRateLimits() {
			if rl.GetApplyOnStreamDone() != streamDone {
				continue
			}
			desc := &ratelimitv3.RateLimitDescriptor{}
			for _, a := range rl.GetActions() {
				rh := a.GetRequestHeaders()
				if rh == nil {
					t.Fatalf("action %v is not modelled", a)
				}
				v, ok := req.header(strings.ToLower(rh.GetHeaderName()), req.path)
				if !ok {
					if rh.GetSkipIfAbsent() {
						continue
					}
					continue limits
				}
				desc.Entries = append(desc.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: rh.GetDescriptorKey(), Value: v})
			}
			switch h := rl.GetHitsAddend(); {
			case h == nil:
			case h.GetNumber() != nil:
				desc.HitsAddend = wrapperspb.UInt64(h.GetNumber().GetValue())
			default:
				m := metaFormat.FindStringSubmatch(h.GetFormat())
				if m == nil {
					t.Fatalf("hits_addend format %q is not modelled", h.GetFormat())
				}
				v, ok := meta[m[1]][m[2]]
				f, isNum := v.(float64)
				if !ok || !isNum || f < 0 || f > 1e9 || f != math.Trunc(f) {
					continue limits
				}
				desc.HitsAddend = wrapperspb.UInt64(uint64(f))
			}
			out = append(out, desc)
		}
		return out
	}

	p := startRLS(t, nil, "--config", envoyFile("rules-tokens"))
	c := p.client(t)
	send := func(descs []*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		if len(descs) == 0 {
			t.Fatal("no descriptor")
		}
		resp, err := c.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	req := httpRequest{method: "POST", path: "/v1/chat/completions", client: "192.0.2.1"}.with("x-api-key", "k1").with("x-ai-model", "gpt")
	usage := func(n float64) map[string]map[string]any {
		return map[string]map[string]any{"rls.usage": {"total_tokens": n}}
	}

	if descs := derive(httpRequest{method: "POST", path: "/v1/chat/completions"}.with("x-ai-model", "gpt"), false, nil); len(descs) != 0 {
		t.Fatalf("no API key: %v, want no descriptor", descs)
	}
	if descs := derive(req, true, nil); len(descs) != 0 {
		t.Fatalf("stream done without usage metadata: %v, want nothing sent", descs)
	}
	check := derive(req, false, nil)
	if len(check) != 1 || check[0].GetHitsAddend() == nil || check[0].GetHitsAddend().GetValue() != 0 {
		t.Fatalf("request-time descriptors %v, want one check with hits_addend 0", check)
	}
	for range 2 { // checks charge nothing
		if r := send(check); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1000 {
			t.Fatalf("check: %v", r)
		}
	}
	// 1000 a minute: a token comes back every 60 ms after the 800 are charged, after reported.
	const perToken = 60 * time.Millisecond
	reported := time.Now()
	if r := send(derive(req, true, usage(800))); r.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("report 800: %v", r)
	}
	r := send(check)
	since := time.Since(reported)
	if hi := 200 + uint32((since+clockSlack)/perToken); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining < 200 || r.Statuses[0].LimitRemaining > hi {
		t.Fatalf("check %v after 800: %v, want OK with 200 to %d remaining", since, r, hi)
	}
	// Envoy ignores the answer to a stream-done call; rls charges it.
	send(derive(req, true, usage(5000)))
	r = send(check)
	since = time.Since(reported)
	// Envoy answers 429 for OVER_LIMIT, with Retry-After from duration_until_reset in seconds:
	// 4.8 minutes from the 800's charge, less the time since, which is at most since.
	retry := r.Statuses[0].GetDurationUntilReset().AsDuration()
	if lo := 288*time.Second - since - clockSlack; r.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT || r.Statuses[0].LimitRemaining != 0 || retry < lo || retry > 288*time.Second {
		t.Fatalf("check in debt %v after the report of 800: %v, want OVER_LIMIT, remaining 0 and a wait within [%v, 288s] (4.8 minutes)", since, r, lo)
	}
	other := derive(httpRequest{method: "POST", path: "/v1/chat/completions"}.with("x-api-key", "k2").with("x-ai-model", "gpt"), false, nil)
	if r := send(other); r.GetOverallCode() != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1000 {
		t.Fatalf("another key: %v", r)
	}
}
