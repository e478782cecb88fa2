package service

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/rls-project/rls/internal/backend"
	"github.com/rls-project/rls/internal/descriptors"
)

// keyHashes hashes n keys named prefix0…prefix(n-1) as the gate does.
func keyHashes(g *newKeyGate, prefix string, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = g.hash(fmt.Sprintf("%s%d", prefix, i))
	}
	return hs
}

func named(s string) func() string { return func() string { return s } }

func TestNewKeyGateRefusesPastMax(t *testing.T) {
	g := newNewKeyGate(10, newKeyCallers)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	a1, a2 := keyHashes(g, "a1-", 8), keyHashes(g, "a2-", 8)
	if ok, _ := g.admit(a1, named("a"), t0); !ok {
		t.Fatal("8 new keys of a burst of 10: refused")
	}
	if ok, who := g.admit(a2, named("a"), t0); ok || who != "a" {
		t.Fatalf("8 more new keys in the same instant: ok %v, caller %q; want refused, a", ok, who)
	}
	// The refused request's keys stay new; the keys let through are seen, and never refused.
	for range 100 {
		if ok, _ := g.admit(a1, func() string { t.Fatal("caller asked for seen keys"); return "" }, t0); !ok {
			t.Fatal("seen keys refused")
		}
	}
	// Another caller has its own budget.
	if ok, _ := g.admit(keyHashes(g, "b-", 10), named("b"), t0); !ok {
		t.Fatal("caller b refused for a's keys")
	}
	// A key repeated within a request counts once.
	if ok, _ := g.admit(append(keyHashes(g, "c-", 2), keyHashes(g, "c-", 2)...), named("a"), t0); !ok {
		t.Fatal("2 distinct new keys (each twice) past a's remaining 2: refused")
	}
	if ok, _ := g.admit(keyHashes(g, "d-", 1), named("a"), t0); ok {
		t.Fatal("a past 10 new keys in an instant: let through")
	}
	// A second later, a's budget is back to 10: a2 (8 keys, still new) goes through.
	if ok, _ := g.admit(a2, named("a"), t0+time.Second.Microseconds()); !ok {
		t.Fatal("a refused a second later")
	}
	// Sustained: 10 new keys a second pass, 11 do not.
	for s := int64(2); s < 10; s++ {
		now := t0 + s*time.Second.Microseconds()
		if ok, _ := g.admit(keyHashes(g, fmt.Sprintf("s%d-", s), 10), named("a"), now); !ok {
			t.Fatalf("second %d: 10 new keys refused", s)
		}
		if ok, _ := g.admit(keyHashes(g, fmt.Sprintf("t%d-", s), 1), named("a"), now); ok {
			t.Fatalf("second %d: an 11th new key let through", s)
		}
	}
	// More new keys in one request than the burst: refused at any rate.
	if ok, _ := g.admit(keyHashes(g, "big-", 11), named("z"), t0); ok {
		t.Fatal("11 new keys in one request past a burst of 10: let through")
	}
}

func TestNewKeyGateRotationForgets(t *testing.T) {
	g := newNewKeyGate(1, newKeyCallers)
	sec := time.Second.Microseconds()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	k, kept := keyHashes(g, "k", 1), keyHashes(g, "kept", 1)
	for _, h := range [][]uint64{k, kept} {
		if ok, _ := g.admit(h, named("a"), t0); !ok {
			g.admit(h, named("a"), t0+sec) // the burst is 1: the second a second later
		}
	}
	// Within a rotation both are seen; at 31 s, only "kept" is used again (so marked current).
	for _, now := range []int64{t0 + 10*sec, t0 + 29*sec} {
		if ok, _ := g.admit(k, func() string { t.Fatal("k new at", now); return "" }, now); !ok {
			t.Fatal("k refused")
		}
	}
	if ok, _ := g.admit(kept, func() string { t.Fatal("kept new at 31 s"); return "" }, t0+31*sec); !ok {
		t.Fatal("kept refused")
	}
	// At 62 s the filter has rotated again: k, last let through at 29 s, is forgotten (new), and
	// kept, let through at 31 s, is still seen.
	now := t0 + 62*sec
	g.mu.Lock()
	g.rotate(now)
	kSeen := has(g.cur, k[0]) || has(g.prev, k[0])
	keptSeen := has(g.cur, kept[0]) || has(g.prev, kept[0])
	g.mu.Unlock()
	if kSeen || !keptSeen {
		t.Fatalf("at 62 s: k seen %v (want false), kept seen %v (want true)", kSeen, keptSeen)
	}
	asked := false
	g.admit(k, func() string { asked = true; return "a" }, now)
	if !asked {
		t.Fatal("a forgotten key was not counted as new")
	}
	// Two rotations' time without a request forgets everything.
	now += 61 * sec
	g.mu.Lock()
	g.rotate(now)
	keptSeen = has(g.cur, kept[0]) || has(g.prev, kept[0])
	g.mu.Unlock()
	if keptSeen {
		t.Fatal("a key unused for 61 s still seen")
	}
}

func TestNewKeyGateBoundsCallers(t *testing.T) {
	g := newNewKeyGate(1, 3)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	for i := range 100 {
		if ok, _ := g.admit(keyHashes(g, fmt.Sprint("c", i, "-"), 1), named(fmt.Sprint("caller", i)), t0); !ok {
			t.Fatalf("caller %d refused its first key", i)
		}
	}
	if n := g.callers.Len(); n != 3 {
		t.Fatalf("%d callers kept; want the bound, 3", n)
	}
	// The latest callers are kept, spent; the first was pushed out and starts afresh.
	if ok, _ := g.admit(keyHashes(g, "more", 1), named("caller99"), t0); ok {
		t.Fatal("caller99, spent, let through")
	}
	if ok, _ := g.admit(keyHashes(g, "more", 1), named("caller0"), t0); !ok {
		t.Fatal("caller0, pushed out, refused")
	}
}

func TestCallerOf(t *testing.T) {
	withPeer := func(addr net.Addr, auth credentials.AuthInfo) context.Context {
		return peer.NewContext(context.Background(), &peer.Peer{Addr: addr, AuthInfo: auth})
	}
	u, _ := url.Parse("spiffe://example.org/edge")
	cert := &x509.Certificate{URIs: []*url.URL{u}, DNSNames: []string{"edge.example.org"}}
	verified := credentials.TLSInfo{State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}}}
	for _, c := range []struct {
		name string
		ctx  context.Context
		want string
	}{
		{"IPv4", withPeer(&net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 5}, nil), "10.0.0.7"},
		{"IPv4 mapped", withPeer(&net.TCPAddr{IP: net.ParseIP("::ffff:10.0.0.7"), Port: 5}, nil), "10.0.0.7"},
		{"IPv6 by its /64", withPeer(&net.TCPAddr{IP: net.ParseIP("2001:db8:1:2:aaaa::1"), Port: 5}, nil), "2001:db8:1:2::/64"},
		{"certificate", withPeer(&net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 5}, verified), "spiffe://example.org/edge"},
		{"TLS without a client certificate", withPeer(&net.TCPAddr{IP: net.ParseIP("10.0.0.8"), Port: 5}, credentials.TLSInfo{}), "10.0.0.8"},
		{"POST /json", context.WithValue(context.Background(), httpPeerKey{}, "192.0.2.1:4000"), "192.0.2.1"},
		{"nothing", context.Background(), "unknown"},
	} {
		if got := callerOf(c.ctx); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}

// TestShouldRateLimitNewKeys: through the service, a caller past its new keys is refused
// RESOURCE_EXHAUSTED, named, and counted; its seen keys and another caller are answered.
func TestShouldRateLimitNewKeys(t *testing.T) {
	rs, err := descriptors.Parse(map[string][]byte{"r.yaml": []byte(`
domain: nk
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000}
`)})
	if err != nil {
		t.Fatal(err)
	}
	m, _ := backend.NewMemory(backend.MemoryOptions{})
	reg := prometheus.NewRegistry()
	metrics, err := NewMetrics(reg, 0)
	if err != nil {
		t.Fatal(err)
	}
	svc, err := New(rs, Options{Backend: m, Metrics: metrics, MaxNewKeysPerCaller: 16})
	if err != nil {
		t.Fatal(err)
	}
	req := func(prefix string) *rlsv3.RateLimitRequest {
		r := &rlsv3.RateLimitRequest{Domain: "nk"}
		for i := range 8 {
			r.Descriptors = append(r.Descriptors, &ratelimitv3.RateLimitDescriptor{
				Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprint(prefix, i)}}})
		}
		return r
	}
	a := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.7"), Port: 1}})
	b := peer.NewContext(context.Background(), &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP("10.0.0.8"), Port: 1}})
	for _, p := range []string{"x", "y"} {
		if _, err := svc.ShouldRateLimit(a, req(p)); err != nil {
			t.Fatal(err)
		}
	}
	_, err = svc.ShouldRateLimit(a, req("z"))
	want := "caller 10.0.0.7 created more than 16 new keys a second (--max-new-keys-per-caller)"
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), want) {
		t.Fatalf("third request of 8 new keys: %v; want RESOURCE_EXHAUSTED %q", err, want)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var refused float64 = -1
	for _, mf := range mfs {
		if mf.GetName() == "rls_new_keys_refused_total" {
			refused = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if refused != 1 {
		t.Fatalf("rls_new_keys_refused_total %v, want 1", refused)
	}
	if resp, err := svc.ShouldRateLimit(a, req("x")); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("seen keys: %v, %v", resp, err)
	}
	if _, err := svc.ShouldRateLimit(b, req("z")); err != nil {
		t.Fatalf("another caller: %v", err)
	}
}

// TestNewKeyGateConcurrent runs the gate from several goroutines across rotations, for the race
// detector: seen keys (the read-locked path) beside new ones and rotations (the locked path).
func TestNewKeyGateConcurrent(t *testing.T) {
	g := newNewKeyGate(1000, newKeyCallers)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
	steady := keyHashes(g, "steady", 4)
	g.admit(steady, named("s"), t0)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				now := t0 + int64(i)*50*time.Millisecond.Microseconds() // 100 s: three rotations
				if ok, _ := g.admit(steady, named("s"), now); !ok {
					t.Error("steady keys refused")
					return
				}
				g.admit(keyHashes(g, fmt.Sprint(w, "-", i, "-"), 2), named(fmt.Sprint("w", w)), now)
			}
		})
	}
	wg.Wait()
}

// TestJSONNewKeys: POST /json callers are told apart by their address, and a caller past its
// new keys is answered 429 with the reason.
func TestJSONNewKeys(t *testing.T) {
	f := newFixture(t, Options{MaxNewKeysPerCaller: 2})
	h := f.svc.JSONHandler()
	post := func(addr, value string) *httptest.ResponseRecorder {
		body := `{"domain":"api","descriptors":[{"entries":[{"key":"key","value":"` + value + `"}]}]}`
		req := httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.RemoteAddr = addr
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, v := range []string{"a", "b"} {
		if rec := post("192.0.2.1:1000", v); rec.Code != 200 {
			t.Fatalf("new key %s: %d %s", v, rec.Code, rec.Body)
		}
	}
	rec := post("192.0.2.1:1001", "c")
	if want := "caller 192.0.2.1 created more than 2 new keys a second (--max-new-keys-per-caller)"; rec.Code != http.StatusTooManyRequests || !strings.Contains(rec.Body.String(), want) {
		t.Fatalf("third new key: %d %q; want 429 %q", rec.Code, rec.Body, want)
	}
	if rec := post("192.0.2.1:1002", "a"); rec.Code != 200 {
		t.Fatalf("a seen key: %d %s", rec.Code, rec.Body)
	}
	if rec := post("192.0.2.2:1000", "c"); rec.Code != 200 {
		t.Fatalf("another address: %d %s", rec.Code, rec.Body)
	}
}
