package httplimit_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/client/httplimit"
	"github.com/rls-project/rls/internal/rlstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const rules = `
domain: web
descriptors:
  - key: remote_address
    rate_limit: {name: per_ip, unit: hour, requests_per_unit: 1}
  - key: api_key
    rate_limit: {name: per_key, unit: hour, requests_per_unit: 2}
    descriptors:
      - key: route
        value: "POST /upload"
        rate_limit: {name: uploads, unit: hour, requests_per_unit: 1}
  - key: route
    value: "GET /search"
    rate_limit: {name: search, unit: minute, requests_per_unit: 60, burst: 1}
  - key: user
    rate_limit: {name: per_user, unit: hour, requests_per_unit: 1}
`

func newClient(t *testing.T, addr string, policy client.FailurePolicy) *client.Client {
	t.Helper()
	c, err := client.New(addr, client.Options{Domain: "web", OnFailure: policy, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })

// describe writes the limiting descriptor and its limit's name as the denial body.
func describe(w http.ResponseWriter, r *http.Request, d client.Decision) {
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusTooManyRequests)
	fmt.Fprintf(w, "%s %s", d.Descriptor, d.Limit.Name)
}

type result struct {
	code int
	body string
	h    http.Header
}

func do(t *testing.T, method, url string, header map[string]string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, string(b), resp.Header}
}

func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
		http.DefaultClient.CloseIdleConnections()
	})
	return srv.URL
}

// TestStatusAndHeaders: 2 per hour per API key, one request every 30 minutes. Two are admitted
// with the headers, the third denied 429 with Retry-After 1800; a request without a key yields
// no descriptor and passes untouched.
func TestStatusAndHeaders(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	c := newClient(t, p.GRPCAddr, client.FailError)
	type step struct {
		key    string // X-API-Key; "" sends none
		code   int
		header map[string]string // "" value: the header must be absent
	}
	cases := []struct {
		name  string
		style client.HeaderStyle
		steps []step
	}{
		{"draft", client.HeadersDraft, []step{
			{"d1", 200, map[string]string{"RateLimit-Policy": `"per_key";q=2;w=3600`, "RateLimit": `"per_key";r=1;t=1800`, "Retry-After": ""}},
			{"d1", 200, map[string]string{"RateLimit": `"per_key";r=0;t=3600`}},
			{"d1", 429, map[string]string{"RateLimit": `"per_key";r=0;t=1800`, "Retry-After": "1800", "X-RateLimit-Limit": ""}},
			{"", 200, map[string]string{"RateLimit": "", "RateLimit-Policy": "", "Retry-After": ""}},
		}},
		{"legacy", client.HeadersLegacy, []step{
			{"l1", 200, map[string]string{"X-RateLimit-Limit": `2, 2;w=3600;name="per_key"`, "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "1800", "RateLimit": ""}},
			{"l1", 200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "3600"}},
			{"l1", 429, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1800", "Retry-After": "1800"}},
		}},
		{"none", client.HeadersNone, []step{
			{"n1", 200, map[string]string{"RateLimit": "", "X-RateLimit-Limit": ""}},
			{"n1", 200, nil},
			{"n1", 429, map[string]string{"Retry-After": "1800", "RateLimit": ""}},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lim := httplimit.New(c, httplimit.Options{Headers: tc.style})
			url := serve(t, lim.Handler(ok, httplimit.By(httplimit.Header("X-API-Key", "api_key"))))
			for i, s := range tc.steps {
				hdr := map[string]string{}
				if s.key != "" {
					hdr["X-API-Key"] = s.key
				}
				r := do(t, "GET", url, hdr)
				if r.code != s.code {
					t.Errorf("step %d: status %d, want %d (%s)", i, r.code, s.code, r.body)
				}
				for k, want := range s.header {
					if got := r.h.Get(k); got != want {
						t.Errorf("step %d: %s: %q, want %q", i, k, got, want)
					}
				}
			}
		})
	}
}

// TestPerRoute: each route has its own descriptors; the composite key api_key+route limits
// uploads apart from the key's overall limit, and the denial names the limiting descriptor.
func TestPerRoute(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	lim := httplimit.New(newClient(t, p.GRPCAddr, client.FailError), httplimit.Options{Deny: describe})
	mux := http.NewServeMux()
	mux.Handle("GET /search", lim.Handler(ok, httplimit.By(httplimit.Route())))
	mux.Handle("POST /upload", lim.Handler(ok,
		httplimit.By(httplimit.Header("X-API-Key", "api_key"), httplimit.Route())))
	mux.Handle("GET /free", ok)
	url := serve(t, mux)
	steps := []struct {
		method, path, key string
		code              int
		body, retryAfter  string
	}{
		{"GET", "/search", "", 200, "ok", ""},
		{"GET", "/search", "", 429, "route=GET /search search", "1"},
		{"POST", "/upload", "k", 200, "ok", ""},
		{"POST", "/upload", "k", 429, "api_key=k,route=POST /upload uploads", "3600"},
		{"POST", "/upload", "other", 200, "ok", ""},
		{"GET", "/free", "", 200, "ok", ""},
		{"GET", "/free", "", 200, "ok", ""},
	}
	for i, s := range steps {
		r := do(t, s.method, url+s.path, map[string]string{"X-API-Key": s.key})
		if r.code != s.code || r.body != s.body || r.h.Get("Retry-After") != s.retryAfter {
			t.Errorf("step %d %s %s: %d %q Retry-After %q, want %d %q %q", i, s.method, s.path,
				r.code, r.body, r.h.Get("Retry-After"), s.code, s.body, s.retryAfter)
		}
	}
}

// TestTrustedProxies: rls allows one request per client IP per hour. Behind a trusted proxy
// each X-Forwarded-For client has its own limit; from an untrusted peer X-Forwarded-For is
// ignored, so spoofing new addresses does not get past the limit.
func TestTrustedProxies(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	c := newClient(t, p.GRPCAddr, client.FailError)
	trustLoopback, err := httplimit.TrustProxies("127.0.0.1", "10.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	trustOthers, err := httplimit.TrustProxies("10.0.0.0/8", "::1")
	if err != nil {
		t.Fatal(err)
	}
	lim := httplimit.New(c, httplimit.Options{Deny: describe})
	trusted := serve(t, lim.Handler(ok, httplimit.By(httplimit.ClientIP(trustLoopback))))
	untrusted := serve(t, lim.Handler(ok, httplimit.By(httplimit.ClientIP(trustOthers))))
	steps := []struct {
		name, url, xff string
		code           int
		body           string
	}{
		{"trusted: first client", trusted, "203.0.113.1", 200, "ok"},
		{"trusted: another client", trusted, "203.0.113.2", 200, "ok"},
		{"trusted: first client again", trusted, "203.0.113.1", 429, "remote_address=203.0.113.1 per_ip"},
		{"trusted: past trusted hops", trusted, "198.51.100.9, 10.1.2.3", 200, "ok"},
		{"trusted: same client via another hop", trusted, "198.51.100.9, 10.9.9.9", 429, "remote_address=198.51.100.9 per_ip"},
		{"untrusted: spoofed", untrusted, "192.0.2.1", 200, "ok"},
		{"untrusted: spoofed again", untrusted, "192.0.2.2", 429, "remote_address=127.0.0.1 per_ip"},
		{"untrusted: no header", untrusted, "", 429, "remote_address=127.0.0.1 per_ip"},
	}
	for _, s := range steps {
		hdr := map[string]string{}
		if s.xff != "" {
			hdr["X-Forwarded-For"] = s.xff
		}
		r := do(t, "GET", s.url, hdr)
		if r.code != s.code || r.body != s.body {
			t.Errorf("%s: %d %q, want %d %q", s.name, r.code, r.body, s.code, s.body)
		}
	}
}

type userKey struct{}

// TestContextValue limits by the user an authentication middleware put in the context.
func TestContextValue(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	lim := httplimit.New(newClient(t, p.GRPCAddr, client.FailError), httplimit.Options{Deny: describe})
	limited := lim.Handler(ok, httplimit.By(httplimit.ContextValue(userKey{}, "user")))
	auth := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.Header.Get("X-User"); u != "" {
			r = r.WithContext(context.WithValue(r.Context(), userKey{}, u))
		}
		limited.ServeHTTP(w, r)
	})
	url := serve(t, auth)
	for i, s := range []struct {
		user string
		code int
		body string
	}{
		{"alice", 200, "ok"}, {"alice", 429, "user=alice per_user"}, {"bob", 200, "ok"}, {"", 200, "ok"}, {"", 200, "ok"},
	} {
		r := do(t, "GET", url, map[string]string{"X-User": s.user})
		if r.code != s.code || r.body != s.body {
			t.Errorf("step %d (%q): %d %q, want %d %q", i, s.user, r.code, r.body, s.code, s.body)
		}
	}
}

// TestFailurePolicies: with rls gone, each policy answers: allow passes, deny answers 429 with
// Retry-After 1, error answers 503.
func TestFailurePolicies(t *testing.T) {
	p := rlstest.Start(t, rlstest.Options{Rules: rules})
	addr := p.GRPCAddr
	p.Stop(t)
	for _, tc := range []struct {
		policy     client.FailurePolicy
		code       int
		retryAfter string
	}{
		{client.FailAllow, 200, ""},
		{client.FailDeny, 429, "1"},
		{client.FailError, 503, ""},
	} {
		lim := httplimit.New(newClient(t, addr, tc.policy), httplimit.Options{})
		url := serve(t, lim.Handler(ok, httplimit.By(httplimit.Header("X-API-Key", "api_key"))))
		r := do(t, "GET", url, map[string]string{"X-API-Key": "k"})
		if r.code != tc.code || r.h.Get("Retry-After") != tc.retryAfter || r.h.Get("RateLimit") != "" {
			t.Errorf("%v: %d Retry-After %q RateLimit %q, want %d %q", tc.policy, r.code,
				r.h.Get("Retry-After"), r.h.Get("RateLimit"), tc.code, tc.retryAfter)
		}
	}
}

// TestSharedRedis: two services, each with its own middleware and client, each asking its own
// rls replica, and both replicas sharing Redis: together they admit the key's limit once.
func TestSharedRedis(t *testing.T) {
	prefix := fmt.Sprintf("httplimit-%d:", time.Now().UnixNano())
	args := []string{"--backend", "redis", "--redis-url", rlstest.RedisURL(t), "--redis-key-prefix", prefix}
	var urls []string
	for range 2 {
		p := rlstest.Start(t, rlstest.Options{Rules: rules, Args: args})
		lim := httplimit.New(newClient(t, p.GRPCAddr, client.FailError), httplimit.Options{})
		urls = append(urls, serve(t, lim.Handler(ok, httplimit.By(httplimit.Header("X-API-Key", "api_key")))))
	}
	var codes []string
	for i := range 6 {
		r := do(t, "GET", urls[i%2], map[string]string{"X-API-Key": "shared"})
		codes = append(codes, fmt.Sprint(r.code))
	}
	// 2 per hour, shared: the first two requests, one on each replica, and none after.
	if got, want := strings.Join(codes, " "), "200 200 429 429 429 429"; got != want {
		t.Errorf("statuses %s, want %s", got, want)
	}
}
