package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	httprlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	netrlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/ratelimit/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/rls-project/rls/internal/envoytest"
)

// This file plays Envoy running deploy/envoy/envoy.yaml: it derives, from the route's
// rate_limits, the descriptors Envoy would send for sample requests, sends them to the real rls
// loaded with deploy/envoy/rules, and checks what deploy/envoy/README.md promises. Only the
// parts of Envoy's behaviour that envoy.yaml uses are modelled; anything else fails the test,
// so a change to envoy.yaml cannot silently outgrow the model.

// envoyFile is the path of a file under deploy/envoy.
func envoyFile(name string) string { return filepath.Join(repoRoot(), "deploy", "envoy", name) }

// edgeProxy is what deploy/envoy/envoy.yaml tells Envoy about rate limiting.
type edgeProxy struct {
	hcm  *hcmv3.HttpConnectionManager
	http *httprlv3.RateLimit // the global HTTP filter
	tcp  *netrlv3.RateLimit  // the network filter
}

func loadEdgeProxy(t *testing.T) *edgeProxy {
	t.Helper()
	edge := envoytest.LoadEdge(t, envoyFile("envoy.yaml"))
	e := &edgeProxy{hcm: edge.HCM, http: edge.Global, tcp: edge.TCP}
	switch {
	case len(e.http.GetRateLimits()) > 0:
		t.Fatal("envoy.yaml: the ratelimit filter's own rate_limits replace the route's; the model does not handle them")
	case e.http.GetRequestType() != "both" && e.http.GetRequestType() != "":
		t.Fatalf("envoy.yaml: request_type %q is not modelled", e.http.GetRequestType())
	case !e.hcm.GetUseRemoteAddress().GetValue() || e.hcm.GetXffNumTrustedHops() != 0 || len(e.hcm.GetOriginalIpDetectionExtensions()) > 0:
		t.Fatal("envoy.yaml: the model takes the client address to be the TCP peer (use_remote_address, no trusted hops)")
	}
	return e
}

// httpRequest is a request as it reaches Envoy's filters.
type httpRequest struct {
	method, path string
	headers      [][2]string // name (lower case), value; in order, repeats allowed
	client       string      // the TCP peer's IP address; "" for a peer without one (a Unix socket)
}

func (r httpRequest) with(name, value string) httpRequest {
	r.headers = append(slices.Clone(r.headers), [2]string{name, value})
	return r
}

// header is what Envoy's header matchers see: every value of name joined with ",", and whether
// the header is present at all. Pseudo-headers come from the request line.
func (r httpRequest) header(name, path string) (string, bool) {
	switch name {
	case ":method":
		return r.method, true
	case ":path":
		return path, true
	}
	var vals []string
	for _, h := range r.headers {
		if h[0] == name {
			vals = append(vals, h[1])
		}
	}
	return strings.Join(vals, ","), len(vals) > 0
}

// normalizePath applies the HTTP connection manager's normalize_path (RFC 3986 dot-segment
// removal) and merge_slashes to the path part of a :path.
func normalizePath(hcm *hcmv3.HttpConnectionManager, p string) string {
	p, query, hasQuery := strings.Cut(p, "?")
	if hcm.GetNormalizePath().GetValue() {
		var out []string
		segs := strings.Split(p, "/")[1:]
		for i, s := range segs {
			switch s {
			case ".":
			case "..":
				if len(out) > 0 {
					out = out[:len(out)-1]
				}
			default:
				out = append(out, s)
				continue
			}
			if i == len(segs)-1 {
				out = append(out, "") // "/a/." is "/a/"
			}
		}
		p = "/" + strings.Join(out, "/")
	}
	if hcm.GetMergeSlashes() {
		p = regexp.MustCompile(`/{2,}`).ReplaceAllString(p, "/")
	}
	if hasQuery {
		p += "?" + query
	}
	return p
}

// routeRateLimits is the first matching route's rate_limits.
func (e *edgeProxy) routeRateLimits(t *testing.T, path string) []*routev3.RateLimit {
	t.Helper()
	vhs := e.hcm.GetRouteConfig().GetVirtualHosts()
	if len(vhs) != 1 || !slices.Equal(vhs[0].GetDomains(), []string{"*"}) {
		t.Fatal("envoy.yaml: the model handles one virtual host for every domain")
	}
	if len(vhs[0].GetRateLimits()) > 0 {
		t.Fatal("envoy.yaml: virtual host rate_limits are not modelled")
	}
	p, _, _ := strings.Cut(path, "?")
	for _, r := range vhs[0].GetRoutes() {
		m := r.GetMatch()
		if len(m.GetHeaders()) > 0 || len(m.GetQueryParameters()) > 0 || m.GetCaseSensitive() != nil || m.GetRuntimeFraction() != nil {
			t.Fatalf("envoy.yaml: route match %v is not modelled", m)
		}
		var matched bool
		switch s := m.GetPathSpecifier().(type) {
		case *routev3.RouteMatch_Prefix:
			matched = strings.HasPrefix(p, s.Prefix)
		case *routev3.RouteMatch_Path:
			matched = p == s.Path
		default:
			t.Fatalf("envoy.yaml: route match %T is not modelled", s)
		}
		if !matched {
			continue
		}
		//lint:ignore SA1019 a route that still sets the deprecated include_vh_rate_limits is one the model refuses
		if r.GetRoute() == nil || len(r.GetTypedPerFilterConfig()) > 0 || r.GetRoute().GetIncludeVhRateLimits().GetValue() {
			t.Fatalf("envoy.yaml: route %q: only a plain route action is modelled", r.GetName())
		}
		return r.GetRoute().GetRateLimits()
	}
	return nil
}

// stringMatch is Envoy's StringMatcher for the kinds envoy.yaml uses.
func stringMatch(t *testing.T, m *matcherv3.StringMatcher, v string) bool {
	t.Helper()
	fold := func(s string) string {
		if m.GetIgnoreCase() {
			return strings.ToLower(s)
		}
		return s
	}
	switch p := m.GetMatchPattern().(type) {
	case *matcherv3.StringMatcher_Exact:
		return fold(v) == fold(p.Exact)
	case *matcherv3.StringMatcher_Prefix:
		return strings.HasPrefix(fold(v), fold(p.Prefix))
	case *matcherv3.StringMatcher_Suffix:
		return strings.HasSuffix(fold(v), fold(p.Suffix))
	case *matcherv3.StringMatcher_Contains:
		return strings.Contains(fold(v), fold(p.Contains))
	case *matcherv3.StringMatcher_SafeRegex:
		// RE2, matched against the whole value; ignore_case does not apply to regexes.
		return regexp.MustCompile(`^(?:` + p.SafeRegex.GetRegex() + `)$`).MatchString(v)
	}
	t.Fatalf("envoy.yaml: string matcher %v is not modelled", m)
	return false
}

// headersMatch is Envoy's HeaderUtility::matchHeaders: every matcher must match; a missing
// header matches no string matcher.
func headersMatch(t *testing.T, ms []*routev3.HeaderMatcher, req httpRequest, path string) bool {
	t.Helper()
	for _, m := range ms {
		if m.GetInvertMatch() || m.GetTreatMissingHeaderAsEmpty() || m.GetStringMatch() == nil {
			t.Fatalf("envoy.yaml: header matcher %v is not modelled (string_match only)", m)
		}
		v, ok := req.header(m.GetName(), path)
		if !ok || !stringMatch(t, m.GetStringMatch(), v) {
			return false
		}
	}
	return true
}

// descriptorsFor returns the descriptors Envoy's router builds for req from the route's
// rate_limits (source/common/router/router_ratelimit.cc): one per rate limit whose stage is the
// filter's, with an entry per action in order; an action that fails drops its whole descriptor,
// and an entry with an empty key (request_headers' skip_if_absent) is left out.
func (e *edgeProxy) descriptorsFor(t *testing.T, req httpRequest) []*ratelimitv3.RateLimitDescriptor {
	t.Helper()
	path := normalizePath(e.hcm, req.path)
	var out []*ratelimitv3.RateLimitDescriptor
	for _, rl := range e.routeRateLimits(t, path) {
		if rl.GetStage().GetValue() != e.http.GetStage() {
			continue
		}
		if rl.GetDisableKey() != "" || rl.GetLimit() != nil || rl.GetHitsAddend() != nil || rl.GetApplyOnStreamDone() {
			t.Fatalf("envoy.yaml: rate limit %v uses options the model lacks", rl)
		}
		d := &ratelimitv3.RateLimitDescriptor{}
		ok := true
		for _, a := range rl.GetActions() {
			var key, value string
			switch act := a.GetActionSpecifier().(type) {
			case *routev3.RateLimit_Action_GenericKey_:
				if strings.Contains(act.GenericKey.GetDescriptorValue(), "%") {
					t.Fatal("envoy.yaml: generic_key formatters depend on a runtime flag; not modelled")
				}
				key, value = cmpOr(act.GenericKey.GetDescriptorKey(), "generic_key"), act.GenericKey.GetDescriptorValue()
			case *routev3.RateLimit_Action_RemoteAddress_:
				ip := net.ParseIP(req.client)
				ok = ip != nil
				key, value = "remote_address", ip.String()
			case *routev3.RateLimit_Action_RequestHeaders_:
				name := strings.ToLower(act.RequestHeaders.GetHeaderName())
				for _, h := range req.headers {
					if h[0] == name {
						key, value = act.RequestHeaders.GetDescriptorKey(), h[1]
						break
					}
				}
				ok = key != "" || act.RequestHeaders.GetSkipIfAbsent()
			case *routev3.RateLimit_Action_HeaderValueMatch_:
				hv := act.HeaderValueMatch
				expect := hv.GetExpectMatch() == nil || hv.GetExpectMatch().GetValue()
				ok = headersMatch(t, hv.GetHeaders(), req, path) == expect
				key, value = cmpOr(hv.GetDescriptorKey(), "header_match"), hv.GetDescriptorValue()
			default:
				t.Fatalf("envoy.yaml: action %T is not modelled", act)
			}
			if !ok {
				break
			}
			if key != "" {
				d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: key, Value: value})
			}
		}
		if ok {
			out = append(out, d)
		}
	}
	return out
}

// tcpDescriptorsFor returns the network filter's descriptors for a connection from client:
// static entries whose values may hold the one formatter envoy.yaml uses.
func (e *edgeProxy) tcpDescriptorsFor(t *testing.T, client string) []*ratelimitv3.RateLimitDescriptor {
	t.Helper()
	var out []*ratelimitv3.RateLimitDescriptor
	for _, d := range e.tcp.GetDescriptors() {
		d = proto.Clone(d).(*ratelimitv3.RateLimitDescriptor)
		for _, en := range d.GetEntries() {
			en.Value = strings.ReplaceAll(en.Value, "%DOWNSTREAM_REMOTE_ADDRESS_WITHOUT_PORT%", client)
			if strings.Contains(en.Value, "%") {
				t.Fatalf("envoy.yaml: formatter in %q is not modelled", en.Value)
			}
		}
		out = append(out, d)
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func formatDescriptors(ds []*ratelimitv3.RateLimitDescriptor) string {
	var parts []string
	for _, d := range ds {
		var es []string
		for _, e := range d.GetEntries() {
			es = append(es, e.GetKey()+"="+e.GetValue())
		}
		parts = append(parts, "["+strings.Join(es, " ")+"]")
	}
	return strings.Join(parts, " ")
}

func TestEnvoyDescriptors(t *testing.T) {
	e := loadEdgeProxy(t)
	get := httpRequest{method: "GET", path: "/v1/items", client: "198.51.100.7"}
	login := httpRequest{method: "POST", path: "/login", client: "198.51.100.7"}
	const perIP, global = "[remote_address=198.51.100.7]", "[generic_key=global]"
	tests := []struct {
		name string
		req  httpRequest
		want string
	}{
		{"no API key: address and global only", get, perIP + " " + global},
		{"key without plan is free", get.with("x-api-key", "k1"), perIP + " [plan=free api_key=k1] " + global},
		{"premium key", get.with("x-api-key", "k1").with("x-plan", "premium"), perIP + " [plan=premium api_key=k1] " + global},
		{"enterprise key", get.with("x-plan", "enterprise").with("x-api-key", "k1"), perIP + " [plan=enterprise api_key=k1] " + global},
		{"unknown plan is free", get.with("x-api-key", "k1").with("x-plan", "gold"), perIP + " [plan=free api_key=k1] " + global},
		{"plan values are exact", get.with("x-api-key", "k1").with("x-plan", "premium-trial"), perIP + " [plan=free api_key=k1] " + global},
		{"a plan without a key sends no plan descriptor", get.with("x-plan", "enterprise"), perIP + " " + global},
		{"first of two keys", get.with("x-api-key", "k1").with("x-api-key", "k2"), perIP + " [plan=free api_key=k1] " + global},
		{"X-Forwarded-For does not move the address", get.with("x-forwarded-for", "203.0.113.9"), perIP + " " + global},
		{"IPv6 client", httpRequest{method: "GET", path: "/", client: "2001:db8:0:0::1"}, "[remote_address=2001:db8::1] " + global},
		{"peer without an IP drops address descriptors", httpRequest{method: "POST", path: "/login"}, global},
		{"login attempt", login, perIP + " [endpoint=login remote_address=198.51.100.7] " + global},
		{"login with a query", httpRequest{method: "POST", path: "/login?next=/home", client: "198.51.100.7"}, perIP + " [endpoint=login remote_address=198.51.100.7] " + global},
		{"login in upper case", httpRequest{method: "POST", path: "/LOGIN", client: "198.51.100.7"}, perIP + " [endpoint=login remote_address=198.51.100.7] " + global},
		{"login behind doubled slashes", httpRequest{method: "POST", path: "//login", client: "198.51.100.7"}, perIP + " [endpoint=login remote_address=198.51.100.7] " + global},
		{"login behind a dot segment", httpRequest{method: "POST", path: "/static/../login", client: "198.51.100.7"}, perIP + " [endpoint=login remote_address=198.51.100.7] " + global},
		{"login form is not an attempt", httpRequest{method: "GET", path: "/login", client: "198.51.100.7"}, perIP + " " + global},
		{"login with a key", login.with("x-api-key", "k1"), perIP + " [endpoint=login remote_address=198.51.100.7] [plan=free api_key=k1] " + global},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := formatDescriptors(e.descriptorsFor(t, tt.req)); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
	t.Run("TCP connection", func(t *testing.T) {
		if got, want := formatDescriptors(e.tcpDescriptorsFor(t, "198.51.100.7")), "[remote_address=198.51.100.7]"; got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	})
}

// envoyRLS sends what Envoy would send for a request to an rls process.
type envoyRLS struct {
	edge   *edgeProxy
	client rlsv3.RateLimitServiceClient
}

// ask returns rls's answer for req, or nil when Envoy would not ask (no descriptors).
func (s *envoyRLS) ask(t *testing.T, domain string, ds []*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	if len(ds) == 0 {
		return nil
	}
	resp, err := s.client.ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	if err != nil {
		t.Fatalf("ShouldRateLimit(%s %s): %v", domain, formatDescriptors(ds), err)
	}
	if len(resp.GetStatuses()) != len(ds) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.GetStatuses()), len(ds))
	}
	return resp
}

// xRateLimitHeaders computes the headers Envoy's DRAFT_VERSION_03 option adds from an answer:
// the status with a limit and the least remaining (the first on a tie) gives Remaining and
// Reset; Limit lists every limit.
func xRateLimitHeaders(resp *rlsv3.RateLimitResponse) map[string]string {
	secs := map[rlsv3.RateLimitResponse_RateLimit_Unit]int{
		rlsv3.RateLimitResponse_RateLimit_SECOND: 1, rlsv3.RateLimitResponse_RateLimit_MINUTE: 60,
		rlsv3.RateLimitResponse_RateLimit_HOUR: 3600, rlsv3.RateLimitResponse_RateLimit_DAY: 86400,
	}
	var minSt *rlsv3.RateLimitResponse_DescriptorStatus
	var policies []string
	for _, st := range resp.GetStatuses() {
		cl := st.GetCurrentLimit()
		if cl == nil {
			continue
		}
		if minSt == nil || st.GetLimitRemaining() < minSt.GetLimitRemaining() {
			minSt = st
		}
		if w, ok := secs[cl.GetUnit()]; ok {
			p := fmt.Sprintf("%d;w=%d", cl.GetRequestsPerUnit(), w)
			if cl.GetName() != "" {
				p += fmt.Sprintf(";name=%q", cl.GetName())
			}
			policies = append(policies, p)
		}
	}
	if minSt == nil {
		return nil
	}
	return map[string]string{
		"x-ratelimit-limit":     strings.Join(append([]string{fmt.Sprint(minSt.GetCurrentLimit().GetRequestsPerUnit())}, policies...), ", "),
		"x-ratelimit-remaining": fmt.Sprint(minSt.GetLimitRemaining()),
		"x-ratelimit-reset":     fmt.Sprint(int64(minSt.GetDurationUntilReset().AsDuration() / time.Second)),
	}
}

// TestEnvoyWithDeployRules checks deploy/envoy/README.md's promises against the real binary.
func TestEnvoyWithDeployRules(t *testing.T) {
	t.Parallel()
	e := loadEdgeProxy(t)
	p := startRLS(t, nil, "--config", filepath.Join(repoRoot(), "deploy", "envoy", "rules"))
	s := &envoyRLS{edge: e, client: p.client(t)}

	t.Run("headers on a free key's first request", func(t *testing.T) {
		req := httpRequest{method: "GET", path: "/v1/items", client: "192.0.2.1"}.with("x-api-key", "headers-demo")
		got := xRateLimitHeaders(s.ask(t, e.http.GetDomain(), e.descriptorsFor(t, req)))
		// The example in deploy/envoy/README.md.
		want := map[string]string{
			"x-ratelimit-limit":     `60, 2000;w=60;name="per_ip", 60;w=60;name="free", 2000;w=1;name="global"`,
			"x-ratelimit-remaining": "59",
			"x-ratelimit-reset":     "1",
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s: %q, want %q", k, got[k], v)
			}
		}
	})

	// Each case sends one client's requests back to back until the first is denied. A limit
	// admits its burst at once and then one request per period, so the count admitted is the
	// burst, plus what the period refilled while the requests were being sent.
	get := httpRequest{method: "GET", path: "/v1/items"}
	tests := []struct {
		name     string
		req      httpRequest
		tcp      bool
		burst    int
		period   time.Duration
		deniedBy string      // the limit named in the over-limit status
		after    httpRequest // still admitted after the denial: limits are per key or address
	}{
		{
			name: "free key: 60 back to back, the 61st denied", req: get.with("x-api-key", "free-1"),
			burst: 60, period: time.Second, deniedBy: "free", after: get.with("x-api-key", "free-2"),
		},
		{
			name: "premium key: the 61st admitted, 100 at once", req: get.with("x-api-key", "premium-1").with("x-plan", "premium"),
			burst: 100, period: 200 * time.Millisecond, deniedBy: "premium", after: get.with("x-api-key", "premium-2").with("x-plan", "premium"),
		},
		{
			name: "enterprise key: 200 at once", req: get.with("x-api-key", "ent-1").with("x-plan", "enterprise"),
			burst: 200, period: 60 * time.Millisecond, deniedBy: "enterprise", after: get.with("x-api-key", "free-3"),
		},
		{
			name: "login: 5 attempts from one address, the 6th denied", req: httpRequest{method: "POST", path: "/login"},
			burst: 5, period: 12 * time.Second, deniedBy: "login_per_ip", after: httpRequest{method: "GET", path: "/login"},
		},
		{
			name: "TCP: 20 connections from one address, the 21st closed", tcp: true,
			burst: 20, period: time.Second, deniedBy: "connections_per_ip",
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// A fresh address per case, so the per-address limit stays out of the way.
			client := fmt.Sprintf("203.0.113.%d", 10+i)
			domain, descriptors := e.http.GetDomain(), func(r httpRequest) []*ratelimitv3.RateLimitDescriptor {
				r.client = client
				return e.descriptorsFor(t, r)
			}
			if tt.tcp {
				domain, descriptors = e.tcp.GetDomain(), func(httpRequest) []*ratelimitv3.RateLimitDescriptor {
					return e.tcpDescriptorsFor(t, client)
				}
			}
			start := time.Now()
			var admitted int
			var denial *rlsv3.RateLimitResponse
			for range 2*tt.burst + 10 {
				resp := s.ask(t, domain, descriptors(tt.req))
				if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
					denial = resp
					break
				}
				if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("request %d: overall code %v", admitted+1, resp.GetOverallCode())
				}
				admitted++
			}
			elapsed := time.Since(start)
			if denial == nil {
				t.Fatalf("%d requests admitted, none denied", admitted)
			}
			if refilled := int(elapsed / tt.period); admitted < tt.burst || admitted > tt.burst+refilled {
				t.Errorf("admitted %d back to back in %v, want %d (plus at most %d refilled meanwhile)", admitted, elapsed, tt.burst, refilled)
			}
			for _, st := range denial.GetStatuses() {
				over := st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT
				if over != (st.GetCurrentLimit().GetName() == tt.deniedBy) {
					t.Errorf("status %v (limit %q): only %q should deny", st.GetCode(), st.GetCurrentLimit().GetName(), tt.deniedBy)
				}
				// Envoy's Retry-After is the largest duration_until_reset of the over-limit statuses.
				if over && st.GetDurationUntilReset().AsDuration() <= 0 {
					t.Errorf("over-limit status without a time to retry: %v", st)
				}
			}
			if tt.tcp {
				return
			}
			if resp := s.ask(t, domain, descriptors(tt.after)); resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
				t.Errorf("after the denial, %s %s %v was denied too", tt.after.method, tt.after.path, tt.after.headers)
			}
		})
	}
}

// TestRulesFromConfigMapVolume loads the rules laid out as the kubelet lays out a ConfigMap
// volume: files are symlinks through ..data into a timestamped directory.
func TestRulesFromConfigMapVolume(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	stamp := "..2026_01_02_03_04_05.000000001"
	if err := os.Mkdir(filepath.Join(dir, stamp), 0o755); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(repoRoot(), "deploy", "envoy", "rules")
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, en := range entries {
		data, err := os.ReadFile(filepath.Join(src, en.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, stamp, en.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(filepath.Join("..data", en.Name()), filepath.Join(dir, en.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(stamp, filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	e := loadEdgeProxy(t)
	p := startRLS(t, nil, "--config", dir)
	s := &envoyRLS{edge: e, client: p.client(t)}
	req := httpRequest{method: "GET", path: "/", client: "192.0.2.2"}.with("x-api-key", "k").with("x-plan", "premium")
	resp := s.ask(t, e.http.GetDomain(), e.descriptorsFor(t, req))
	var names []string
	for _, st := range resp.GetStatuses() {
		names = append(names, st.GetCurrentLimit().GetName())
	}
	if want := []string{"per_ip", "premium", "global"}; !slices.Equal(names, want) {
		t.Errorf("limits %q, want %q", names, want)
	}
}

// testPKI is a CA with a server certificate for rls and a client certificate for Envoy.
type testPKI struct {
	dir                   string
	caPool                *x509.CertPool
	client                tls.Certificate
	serverCert, serverKey string
	clientCert, clientKey string // client's, as files
	caFile                string
}

func newTestPKI(t *testing.T, serverName string) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), caPool: x509.NewCertPool()}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p.caPool.AddCert(ca)
	p.caFile = p.write(t, "ca.crt", "CERTIFICATE", caDER)
	issue := func(serial int64, name string, usage x509.ExtKeyUsage, dns []string) ([]byte, *ecdsa.PrivateKey) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, DNSNames: dns,
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	der, key := issue(2, serverName, x509.ExtKeyUsageServerAuth, []string{serverName})
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p.serverCert = p.write(t, "server.crt", "CERTIFICATE", der)
	p.serverKey = p.write(t, "server.key", "EC PRIVATE KEY", keyDER)
	der, key = issue(3, "envoy", x509.ExtKeyUsageClientAuth, nil)
	p.client = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	keyDER, _ = x509.MarshalECPrivateKey(key)
	p.clientCert = p.write(t, "client.crt", "CERTIFICATE", der)
	p.clientKey = p.write(t, "client.key", "EC PRIVATE KEY", keyDER)
	return p
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	f := filepath.Join(p.dir, name)
	if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestEnvoyTLSSettings connects to rls started with its TLS flags the way envoy-tls.yaml's
// UpstreamTlsContext does (SNI, ALPN, client certificate, server name checked), and shows that
// leaving out the client certificate or ALPN fails.
func TestEnvoyTLSSettings(t *testing.T) {
	t.Parallel()
	var up *tlsv3.UpstreamTlsContext
	for _, c := range envoytest.Load(t, envoyFile("envoy-tls.yaml")).GetStaticResources().GetClusters() {
		if c.GetName() != "rls" {
			continue
		}
		up = envoytest.Unpack[*tlsv3.UpstreamTlsContext](t, c.GetTransportSocket().GetTypedConfig())
	}
	if up == nil {
		t.Fatal("envoy-tls.yaml: rls cluster has no UpstreamTlsContext")
	}
	sans := up.GetCommonTlsContext().GetValidationContext().GetMatchTypedSubjectAltNames()
	if len(sans) != 1 || sans[0].GetSanType() != tlsv3.SubjectAltNameMatcher_DNS || sans[0].GetMatcher().GetExact() == "" {
		t.Fatalf("envoy-tls.yaml: want one exact DNS SAN matcher, got %v", sans)
	}
	pki := newTestPKI(t, sans[0].GetMatcher().GetExact())
	p := startRLS(t, nil, "--config", filepath.Join(repoRoot(), "deploy", "envoy", "rules"),
		"--grpc-tls-cert", pki.serverCert, "--grpc-tls-key", pki.serverKey, "--grpc-tls-client-ca", pki.caFile)
	envoyTLS := func() *tls.Config {
		return &tls.Config{
			ServerName:   up.GetSni(),
			NextProtos:   up.GetCommonTlsContext().GetAlpnProtocols(),
			RootCAs:      pki.caPool,
			Certificates: []tls.Certificate{pki.client},
			MinVersion:   tls.VersionTLS12,
			// Envoy checks the SAN matcher, not the SNI, against the certificate.
			VerifyConnection: func(cs tls.ConnectionState) error {
				return cs.PeerCertificates[0].VerifyHostname(sans[0].GetMatcher().GetExact())
			},
		}
	}

	t.Run("health check and RPC as Envoy makes them", func(t *testing.T) {
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(envoyTLS())))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		h, err := healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
		if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("health: %v %v", h, err)
		}
		resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctxT(t), &rlsv3.RateLimitRequest{
			Domain:      "edge",
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "global"}}}},
		})
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit: %v %v", resp, err)
		}
	})

	// Raw handshakes, because grpc-go's own client always offers h2 and so cannot leave it out.
	// rls either fails the handshake or closes the connection without an HTTP/2 SETTINGS frame.
	speaksHTTP2 := func(cfg *tls.Config) error {
		d := &net.Dialer{Timeout: 5 * time.Second}
		conn, err := tls.DialWithDialer(d, "tcp", p.GRPCAddr, cfg)
		if err != nil {
			return err
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00"); err != nil {
			return err
		}
		head := make([]byte, 9)
		if _, err := io.ReadFull(conn, head); err != nil {
			return err
		}
		if head[3] != 0x4 {
			return fmt.Errorf("first frame has type %d, not SETTINGS", head[3])
		}
		return nil
	}
	tests := []struct {
		name   string
		change func(*tls.Config)
		ok     bool
	}{
		{"as configured", func(*tls.Config) {}, true},
		{"without alpn_protocols", func(c *tls.Config) { c.NextProtos = nil }, false},
		{"without a client certificate", func(c *tls.Config) { c.Certificates = nil }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := envoyTLS()
			tt.change(cfg)
			err := speaksHTTP2(cfg)
			if tt.ok && err != nil {
				t.Errorf("failed: %v", err)
			}
			if !tt.ok && err == nil {
				t.Error("rls spoke HTTP/2 over it")
			}
		})
	}
}
