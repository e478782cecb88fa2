package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// policyPKI is a throwaway CA, a server certificate for 127.0.0.1, and client certificates
// each naming one SPIFFE id.
type policyPKI struct {
	dir                           string
	caFile, serverCert, serverKey string
	pool                          *x509.CertPool
	ca                            *x509.Certificate
	caKey                         *ecdsa.PrivateKey
	serial                        int64
}

func newPolicyPKI(t *testing.T) *policyPKI {
	t.Helper()
	p := &policyPKI{dir: t.TempDir(), pool: x509.NewCertPool(), serial: 1}
	p.caKey = policyKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "policy test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	if p.ca, err = x509.ParseCertificate(der); err != nil {
		t.Fatal(err)
	}
	p.pool.AddCert(p.ca)
	p.caFile = p.writePEM(t, "ca.pem", "CERTIFICATE", der)
	cert := p.issue(t, "server", x509.ExtKeyUsageServerAuth, func(c *x509.Certificate) {
		c.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	})
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	p.serverCert = p.writePEM(t, "server.pem", "CERTIFICATE", cert.Certificate[0])
	p.serverKey = p.writePEM(t, "server-key.pem", "PRIVATE KEY", keyDER)
	return p
}

func policyKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (p *policyPKI) writePEM(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func (p *policyPKI) issue(t *testing.T, cn string, usage x509.ExtKeyUsage, edit func(*x509.Certificate)) tls.Certificate {
	t.Helper()
	p.serial++
	key := policyKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	edit(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// client dials addr over mTLS with a client certificate naming the URI id.
func (p *policyPKI) client(t *testing.T, addr, id string) rlsv3.RateLimitServiceClient {
	t.Helper()
	u, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	cert := p.issue(t, "client", x509.ExtKeyUsageClientAuth, func(c *x509.Certificate) { c.URIs = []*url.URL{u} })
	cfg := &tls.Config{RootCAs: p.pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

const policyRules = `domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
`

const policyRules2 = `domain: billing
descriptors:
  - key: account
    rate_limit: {unit: hour, requests_per_unit: 1}
`

const (
	meshID  = "spiffe://test.local/ns/mesh/sa/envoy"
	adminID = "spiffe://test.local/ns/ops/sa/admin"
	otherID = "spiffe://test.local/ns/elsewhere/sa/job"
)

const callerPolicy = `callers:
  - identities: [` + meshID + `]
    domains: [shop]
    refund: true
    max_hits: 5
  - identities: ["spiffe://test.local/ns/ops/*"]
    domains: ["*"]
    override: true
default:
  domains: [shop]
  max_hits: 1
`

// The same, with billing added to the mesh's domains.
var callerPolicyBilling = strings.Replace(callerPolicy, "domains: [shop]\n    refund", "domains: [shop, billing]\n    refund", 1)

func policyDesc(key, value string) *ratelimitv3.RateLimitDescriptor {
	return &ratelimitv3.RateLimitDescriptor{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}

// writeAtomically replaces path's content by renaming a new file over it, as an editor or a
// ConfigMap update does.
func writeAtomically(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestCallerPolicyOverMTLS runs rls with --caller-policy over mTLS: each caller is held to its
// entry (domain, refund, override, hits), refused PermissionDenied with the reason, and what
// it may do is decided as without a policy; POST /json is the default entry's (403 when
// refused); the denials are counted on /metrics; a changed policy file is in force without a
// restart, and a broken one leaves the policy in force.
func TestCallerPolicyOverMTLS(t *testing.T) {
	t.Parallel()
	pki := newPolicyPKI(t)
	policyFile := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(callerPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"shop.yaml": policyRules, "billing.yaml": policyRules2}),
		"--grpc-tls-cert", pki.serverCert, "--grpc-tls-key", pki.serverKey, "--grpc-tls-client-ca", pki.caFile,
		"--caller-policy", policyFile, "--reload-debounce", "50ms")
	mesh := pki.client(t, p.GRPCAddr, meshID)
	admin := pki.client(t, p.GRPCAddr, adminID)
	other := pki.client(t, p.GRPCAddr, otherID)
	ctx := ctxT(t)

	decide := func(c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) rlsv3.RateLimitResponse_Code {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx, req)
		if err != nil {
			t.Fatalf("%v: %v", req, err)
		}
		return resp.GetOverallCode()
	}
	denied := func(c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest, want string) {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx, req)
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), want) {
			t.Fatalf("%v: got %v, %v; want PermissionDenied with %q", req, resp, err, want)
		}
	}
	shop := func(user string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: append([]*ratelimitv3.RateLimitDescriptor{policyDesc("user", user)}, ds...)}
	}
	refund := func(user string) *rlsv3.RateLimitRequest {
		d := policyDesc("user", user)
		d.IsNegativeHits = true
		return &rlsv3.RateLimitRequest{Domain: "shop", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	}
	override := func(domain string) *rlsv3.RateLimitRequest {
		d := policyDesc("account", "a1")
		d.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1000, Unit: typev3.RateLimitUnit_SECOND}
		return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*ratelimitv3.RateLimitDescriptor{d}}
	}

	// The mesh's identity: its domain is decided as ever, and a refund gives a hit back.
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := decide(mesh, shop("u1")); got != want {
			t.Fatalf("mesh request %d: %v, want %v", i+1, got, want)
		}
	}
	if got := decide(mesh, refund("u1")); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("mesh refund: %v", got)
	}
	if got := decide(mesh, shop("u1")); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after the refund: %v, want OK (the refund gave a hit back)", got)
	}
	if got := decide(mesh, shop("u1")); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("after the refunded hit was spent: %v, want OVER_LIMIT", got)
	}
	if got := decide(mesh, &rlsv3.RateLimitRequest{Domain: "shop", HitsAddend: 5, Descriptors: []*ratelimitv3.RateLimitDescriptor{policyDesc("user", "u2")}}); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("5 hits at max_hits on a limit of 2: %v, want OVER_LIMIT", got)
	}
	// What it may not do.
	denied(mesh, &rlsv3.RateLimitRequest{Domain: "billing", Descriptors: []*ratelimitv3.RateLimitDescriptor{policyDesc("account", "a1")}},
		`"`+meshID+`" may not ask about domain "billing"`)
	denied(mesh, override("shop"), "carries a limit override")
	denied(mesh, &rlsv3.RateLimitRequest{Domain: "shop", HitsAddend: 6, Descriptors: []*ratelimitv3.RateLimitDescriptor{policyDesc("user", "u3")}},
		"hits_addend 6 is over 5")
	// The refused requests spent nothing: u3 still has its whole budget.
	if got := decide(mesh, shop("u3")); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("u3 after a refused request: %v", got)
	}

	// The ops pattern: any domain and overrides, but no refunds.
	if got := decide(admin, override("billing")); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("admin override: %v", got)
	}
	if got := decide(admin, &rlsv3.RateLimitRequest{Domain: "billing", Descriptors: []*ratelimitv3.RateLimitDescriptor{policyDesc("account", "b1")}}); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("admin on billing: %v", got)
	}
	denied(admin, refund("u1"), "refunds (is_negative_hits)")
	// The refused refund gave nothing back: u1 is still over its limit.
	if got := decide(mesh, shop("u1")); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("u1 after a refused refund: %v, want OVER_LIMIT", got)
	}

	// An identity the policy does not list gets the default entry.
	if got := decide(other, shop("u4")); got != rlsv3.RateLimitResponse_OK {
		t.Fatalf("unlisted caller on shop: %v", got)
	}
	denied(other, refund("u1"), "callers without a listed identity (the default entry)")
	denied(other, &rlsv3.RateLimitRequest{Domain: "shop", HitsAddend: 2, Descriptors: []*ratelimitv3.RateLimitDescriptor{policyDesc("user", "u4")}}, "hits_addend 2 is over 1")

	// POST /json has no client certificate: the default entry.
	postJSON := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post("http://"+p.HTTPAddr+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := postJSON(`{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"j1"}]}]}`); code != http.StatusOK {
		t.Fatalf("/json allowed: %d %s", code, body)
	}
	if code, body := postJSON(`{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"u1"}],"isNegativeHits":true}]}`); code != http.StatusForbidden || !strings.Contains(body, "refunds (is_negative_hits)") {
		t.Fatalf("/json refund: %d %s; want 403 with the reason", code, body)
	}
	if code, body := postJSON(`{"domain":"billing","descriptors":[{"entries":[{"key":"account","value":"a1"}]}]}`); code != http.StatusForbidden || !strings.Contains(body, `may not ask about domain "billing"`) {
		t.Fatalf("/json other domain: %d %s; want 403 with the reason", code, body)
	}

	// Every denial counted, by reason.
	m := metricValues(t, p.HTTPAddr)
	for reason, want := range map[string]string{"domain": "2", "override": "1", "refund": "3", "hits": "2", "caller": "0"} {
		if got := m[`rls_policy_denied_total{reason="`+reason+`"}`]; got != want {
			t.Errorf("rls_policy_denied_total{reason=%q} = %q, want %s", reason, got, want)
		}
	}
	if got := m[`rls_policy_loads_total{result="success"}`]; got != "1" {
		t.Errorf("loads success = %q, want 1", got)
	}

	// A new policy is in force without a restart.
	writeAtomically(t, policyFile, callerPolicyBilling)
	billing := &rlsv3.RateLimitRequest{Domain: "billing", Descriptors: []*ratelimitv3.RateLimitDescriptor{policyDesc("account", "m1")}}
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := mesh.ShouldRateLimit(ctx, billing)
		if err == nil {
			break
		}
		if status.Code(err) != codes.PermissionDenied || time.Now().After(deadline) {
			t.Fatalf("mesh on billing after the policy change: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A broken file is refused and counted; the policy in force stays.
	writeAtomically(t, policyFile, callerPolicyBilling+"  refunds: true\n")
	for metricValues(t, p.HTTPAddr)[`rls_policy_loads_total{result="failure"}`] != "1" {
		if time.Now().After(deadline) {
			t.Fatalf("the broken policy was not rejected\n%s", p.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !strings.Contains(p.Output(), policyFile+":12: unknown key refunds in default") {
		t.Errorf("the rejection does not name file:line\n%s", p.Output())
	}
	if got := decide(mesh, billing); got != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("mesh on billing after a broken policy: %v, want OVER_LIMIT (allowed, and over its limit of 1)", got)
	}
	denied(mesh, override("shop"), "carries a limit override")
	if got := metricValues(t, p.HTTPAddr)[`rls_policy_loads_total{result="success"}`]; got != "2" {
		t.Errorf("loads success = %q, want 2", got)
	}
}

// TestCallerPolicyAbsentChangesNothing: without --caller-policy, a caller over mTLS may still
// refund and override, and no policy metric is exported.
func TestCallerPolicyAbsentChangesNothing(t *testing.T) {
	t.Parallel()
	pki := newPolicyPKI(t)
	p := startRLS(t, nil, "--config", writeRules(t, map[string]string{"shop.yaml": policyRules}),
		"--grpc-tls-cert", pki.serverCert, "--grpc-tls-key", pki.serverKey, "--grpc-tls-client-ca", pki.caFile)
	c := pki.client(t, p.GRPCAddr, otherID)
	ctx := ctxT(t)
	d := policyDesc("user", "u1")
	d.IsNegativeHits = true
	o := policyDesc("user", "u2")
	o.Limit = &ratelimitv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 10, Unit: typev3.RateLimitUnit_MINUTE}
	for _, req := range []*rlsv3.RateLimitRequest{
		{Domain: "shop", Descriptors: []*ratelimitv3.RateLimitDescriptor{d}},
		{Domain: "shop", Descriptors: []*ratelimitv3.RateLimitDescriptor{o}},
		{Domain: "elsewhere", HitsAddend: 1000, Descriptors: []*ratelimitv3.RateLimitDescriptor{policyDesc("user", "u3")}},
	} {
		if _, err := c.ShouldRateLimit(ctx, req); err != nil {
			t.Fatalf("%v: %v", req, err)
		}
	}
	for k := range metricValues(t, p.HTTPAddr) {
		if strings.HasPrefix(k, "rls_policy_") {
			t.Errorf("metric %s without a policy", k)
		}
	}
}
