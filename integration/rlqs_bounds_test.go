package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
)

// streamEnd sends m on a new stream of c and returns how the stream ended (nil: answered).
func streamEnd(t *testing.T, c rlqspb.RateLimitQuotaServiceClient, m *rlqspb.RateLimitQuotaUsageReports) error {
	t.Helper()
	s, err := c.StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		return err
	}
	_ = s.Send(m) // a stream already ended says EOF; Recv has its status
	_, err = s.Recv()
	return err
}

func report1(domain string, bucket map[string]string) *rlqspb.RateLimitQuotaUsageReports {
	return &rlqspb.RateLimitQuotaUsageReports{Domain: domain, BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(bucket, 10, 0, time.Second)}}
}

// TestRLQSDomains: with --rlqs-domains, a stream naming another domain ends with
// PERMISSION_DENIED and the flag; the domains named are served.
func TestRLQSDomains(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	p := startRLS(t, nil, "--rlqs", "--config", rules, "--rlqs-domains", "rlqs,other")
	c := rlqsClient(t, p.GRPCAddr)
	for _, d := range []string{"rlqs", "other"} {
		if err := streamEnd(t, c, report1(d, map[string]string{"api_key": "shared"})); err != nil {
			t.Errorf("domain %q: %v, want an answer", d, err)
		}
	}
	err := streamEnd(t, c, report1("elsewhere", map[string]string{"api_key": "shared"}))
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "--rlqs-domains") {
		t.Errorf("domain elsewhere: %v, want PERMISSION_DENIED naming --rlqs-domains", err)
	}
	if v := metric(t, p.HTTPAddr, "rls_rlqs_refused_total", `{reason="domain_not_served"}`); v != 1 {
		t.Errorf("rls_rlqs_refused_total{reason=\"domain_not_served\"} %v, want 1", v)
	}
}

// TestRLQSMaxProxiesPerBucket: a bucket divided among --rlqs-max-proxies-per-bucket proxies
// refuses one more with RESOURCE_EXHAUSTED; the proxies it has keep their shares, and the
// stream refused could have reported another bucket.
func TestRLQSMaxProxiesPerBucket(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	p := startRLS(t, nil, "--rlqs", "--config", rules, "--rlqs-max-proxies-per-bucket", "2")
	c := rlqsClient(t, p.GRPCAddr)
	shared := map[string]string{"api_key": "shared"}
	var held []rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	for range 2 {
		s, err := c.StreamRateLimitQuotas(ctxT(t))
		if err != nil {
			t.Fatal(err)
		}
		exchange(t, s, report1("rlqs", shared))
		held = append(held, s)
	}
	err := streamEnd(t, c, report1("rlqs", shared))
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "--rlqs-max-proxies-per-bucket") {
		t.Fatalf("a third proxy of the bucket: %v, want RESOURCE_EXHAUSTED naming --rlqs-max-proxies-per-bucket", err)
	}
	if err := streamEnd(t, c, report1("rlqs", map[string]string{"api_key": "another"})); err != nil {
		t.Errorf("a third proxy on another bucket: %v, want an answer", err)
	}
	for i, s := range held {
		if st := exchange(t, s, report1("rlqs", shared)); st.GetTokenBucket() == nil && st.GetBlanketRule().String() != "DENY_ALL" {
			t.Errorf("proxy %d after the refusal: %v", i, st)
		}
	}
}

// TestRLQSWarningsThrottled: a client that sends malformed reports over and over gets each
// refused and counted, but rls logs a line per cause per interval, not one per report.
func TestRLQSWarningsThrottled(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	p := startRLS(t, nil, "--rlqs", "--config", rules)
	c := rlqsClient(t, p.GRPCAddr)
	const n = 50
	for range n {
		if err := streamEnd(t, c, report1("", map[string]string{"api_key": "shared"})); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a report without a domain: %v, want INVALID_ARGUMENT", err)
		}
	}
	if v := metric(t, p.HTTPAddr, "rls_rlqs_reports_rejected_total", `{reason="no_domain"}`); v != n {
		t.Errorf("rls_rlqs_reports_rejected_total{reason=\"no_domain\"} %v, want %d", v, n)
	}
	if lines := strings.Count(p.Output(), "malformed report"); lines < 1 || lines > 2 {
		t.Errorf("%d log lines for %d malformed reports in a few seconds, want 1 (or 2 across an interval)", lines, n)
	}
}

// rlqsPKI is a CA, a server certificate for 127.0.0.1 and two client certificates with the URI
// names spiffe://test/a and spiffe://test/b, as files and as tls.Certificates.
type rlqsPKI struct {
	ca, serverCert, serverKey string
	pool                      *x509.CertPool
	clients                   map[string]tls.Certificate
}

func newRLQSPKI(t *testing.T) *rlqsPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := newKey()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "rlqs test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	p := &rlqsPKI{ca: write("ca.pem", "CERTIFICATE", caDER), pool: x509.NewCertPool(), clients: map[string]tls.Certificate{}}
	p.pool.AddCert(ca)
	issue := func(serial int64, usage x509.ExtKeyUsage, uri string) ([]byte, *ecdsa.PrivateKey) {
		key := newKey()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "rlqs test"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		if uri != "" {
			u, _ := url.Parse(uri)
			tmpl.URIs = []*url.URL{u}
		} else {
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return der, key
	}
	der, key := issue(2, x509.ExtKeyUsageServerAuth, "")
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p.serverCert, p.serverKey = write("server.pem", "CERTIFICATE", der), write("server-key.pem", "EC PRIVATE KEY", keyDER)
	for i, name := range []string{"a", "b"} {
		der, key := issue(int64(3+i), x509.ExtKeyUsageClientAuth, "spiffe://test/"+name)
		p.clients[name] = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
	}
	return p
}

// TestRLQSIdentityOneShare: over mutual TLS a proxy is its client certificate: identity a opens
// four streams on a bucket and b one, all wanting more than the limit; b is given half of it
// (not a fifth), and a's four streams share the other half, however many it opens.
func TestRLQSIdentityOneShare(t *testing.T) {
	pki := newRLQSPKI(t)
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	p := startRLS(t, nil, "--rlqs", "--config", rules, "--rlqs-tick", "50ms",
		"--grpc-tls-cert", pki.serverCert, "--grpc-tls-key", pki.serverKey, "--grpc-tls-client-ca", pki.ca)
	client := func(name string) rlqspb.RateLimitQuotaServiceClient {
		creds := credentials.NewTLS(&tls.Config{RootCAs: pki.pool, Certificates: []tls.Certificate{pki.clients[name]}, ServerName: "127.0.0.1"})
		conn, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return rlqspb.NewRateLimitQuotaServiceClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var mu sync.Mutex
	rates := map[int]uint32{} // by stream: 0-3 are a's, 4 is b's
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	ca, cb := client("a"), client("b")
	for i := range 5 {
		c := ca
		if i == 4 {
			c = cb
		}
		s, err := c.StreamRateLimitQuotas(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			for {
				resp, err := s.Recv()
				if err != nil {
					return
				}
				for _, a := range resp.GetBucketAction() {
					mu.Lock()
					rates[i] = a.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetTokensPerFill().GetValue()
					mu.Unlock()
				}
			}
		}()
		go func() {
			defer wg.Done()
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for {
				if s.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
					usage(map[string]string{"api_key": "shared"}, 400, 400, 200*time.Millisecond)}}) != nil {
					return
				}
				select {
				case <-ctx.Done():
					s.CloseSend()
					return
				case <-tick.C:
				}
			}
		}()
	}
	// The shares settle within a few TTLs (what a stream holds is held until its TTL ends).
	var a, b uint32
	for start := time.Now(); time.Since(start) < 15*time.Second; time.Sleep(100 * time.Millisecond) {
		mu.Lock()
		a, b = rates[0]+rates[1]+rates[2]+rates[3], rates[4]
		mu.Unlock()
		if b >= 440 && a <= 500 && a >= 400 {
			break
		}
	}
	t.Logf("identity a (4 streams): %d/s together; identity b (1 stream): %d/s", a, b)
	if b < 440 || a > 500 || a < 400 {
		t.Errorf("identity a holds %d/s over its four streams and b %d/s, want about half of 969 each", a, b)
	}
	if a+b > 969 {
		t.Errorf("%d/s assigned in all, more than the limit less its reserve (969)", a+b)
	}
}

// TestRLQSTickWork: a stream of 1,000 buckets whose shares have settled costs its ticks a
// decision per bucket now and then (a recheck, every quarter TTL), not one per bucket per tick:
// over 3 s of 50 ms ticks, far fewer than the 60,000 decisions deciding everything would make.
func TestRLQSTickWork(t *testing.T) {
	rules := writeRules(t, map[string]string{"rlqs.yaml": rlqsRules})
	p := startRLS(t, nil, "--rlqs", "--config", rules, "--rlqs-tick", "50ms")
	s, err := rlqsClient(t, p.GRPCAddr).StreamRateLimitQuotas(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	m := &rlqspb.RateLimitQuotaUsageReports{Domain: "rlqs"}
	for i := range n {
		m.BucketQuotaUsages = append(m.BucketQuotaUsages, usage(map[string]string{"api_key": fmt.Sprintf("k%d", i)}, 1, 0, time.Second))
	}
	if err := s.Send(m); err != nil {
		t.Fatal(err)
	}
	for got := 0; got < n; {
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got += len(resp.GetBucketAction())
	}
	d0 := metric(t, p.HTTPAddr, "rls_rlqs_decisions_total", "")
	time.Sleep(3 * time.Second)
	d := metric(t, p.HTTPAddr, "rls_rlqs_decisions_total", "") - d0
	// A recheck every 750 ms (a quarter of the 3 s TTL): about 4 per bucket in 3 s.
	t.Logf("%.0f decisions in 3 s of ticks for %d settled buckets", d, n)
	if d > 6*n {
		t.Errorf("%.0f decisions in 3 s for %d settled buckets, want at most %d (a recheck every 750 ms)", d, n, 6*n)
	}
}
