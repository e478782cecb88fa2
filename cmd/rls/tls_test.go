package main

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
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rls-project/rls/internal/rlstest"
)

// testPKI is a throwaway CA with a server certificate for 127.0.0.1 and rls.test, and client
// certificates each naming one URI.
type testPKI struct {
	dir                           string
	ca                            *x509.Certificate
	caKey                         *ecdsa.PrivateKey
	caFile, serverCert, serverKey string
	serial                        int64
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), caKey: testKey(t), serial: 1}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "cmd/rls test CA"},
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
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", der)
	p.serverCert, p.serverKey = p.issue(t, "server", x509.ExtKeyUsageServerAuth, func(c *x509.Certificate) {
		c.IPAddresses, c.DNSNames = []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"rls.test"}
	})
	return p
}

func testKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// issue writes a certificate the CA signed, and its key, and returns their files.
func (p *testPKI) issue(t *testing.T, name string, usage x509.ExtKeyUsage, edit func(*x509.Certificate)) (cert, key string) {
	t.Helper()
	p.serial++
	k := testKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(p.serial), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
	}
	edit(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &k.PublicKey, p.caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return p.write(t, name+".pem", "CERTIFICATE", der), p.write(t, name+"-key.pem", "PRIVATE KEY", keyDER)
}

// client issues a client certificate naming the URI id.
func (p *testPKI) client(t *testing.T, name, id string) (cert, key string) {
	t.Helper()
	u, err := url.Parse(id)
	if err != nil {
		t.Fatal(err)
	}
	return p.issue(t, name, x509.ExtKeyUsageClientAuth, func(c *x509.Certificate) { c.URIs = []*url.URL{u} })
}

// binaryRun runs the rls binary with args, env added to the environment, and returns its exit
// status and output.
func binaryRun(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(rlstest.Binary(t), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), out.String(), errOut.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, out.String(), errOut.String()
}

// TestCommandsOverMutualTLS: rls check, inspect and reset, the real binary each, against an rls
// serving gRPC over mutual TLS under a caller policy: check is answered or refused as the policy
// says of the caller its --tls-cert names; it is refused without a client certificate, without
// the CA that verifies rls, or when the server's name is not --tls-server-name; RLS_TLS_*
// variables do what the flags do. inspect and reset reach the HTTP listener over mutual TLS
// too (--http-tls-*), under the same policy; its probes need no client certificate.
func TestCommandsOverMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	opsCert, opsKey := pki.client(t, "ops", "spiffe://test.local/ns/ops/sa/operator")
	otherCert, otherKey := pki.client(t, "other", "spiffe://test.local/ns/elsewhere/sa/job")
	dir := t.TempDir()
	for name, body := range map[string]string{
		"shop.yaml":    "domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
		"billing.yaml": "domain: billing\ndescriptors:\n  - key: account\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
		"policy.yaml":  "callers:\n  - identities: [\"spiffe://test.local/ns/ops/*\"]\n    domains: [shop]\n",
		"token":        "an-admin-token-of-enough-bytes\n",
	} {
		sub := "rules"
		if !strings.HasSuffix(name, ".yaml") || name == "policy.yaml" {
			sub = "etc"
		}
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, sub, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	p := rlstest.Start(t, rlstest.Options{Args: []string{
		"--config", filepath.Join(dir, "rules"), "--caller-policy", filepath.Join(dir, "etc", "policy.yaml"),
		"--admin-token-file", filepath.Join(dir, "etc", "token"),
		"--grpc-tls-cert", pki.serverCert, "--grpc-tls-key", pki.serverKey, "--grpc-tls-client-ca", pki.caFile,
		"--http-tls-cert", pki.serverCert, "--http-tls-key", pki.serverKey, "--http-tls-client-ca", pki.caFile,
	}})
	ops := []string{"--tls-ca", pki.caFile, "--tls-cert", opsCert, "--tls-key", opsKey}
	check := func(extra ...string) []string { return append([]string{"check", "--addr", p.GRPCAddr}, extra...) }
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		code int
		want string // in stdout (exit 0) or stderr
	}{
		{"the policy allows ops in shop", check(append(ops, "--domain", "shop", "user=u1")...), nil, 0, `"overall_code": "OK"`},
		{"flags after the descriptor", check(append([]string{"user=u1", "--domain", "shop"}, ops...)...), nil, 0, `"limit_remaining": 0`},
		{"the policy refuses ops in billing", check(append(ops, "--domain", "billing", "account=a")...), nil, 1,
			`PermissionDenied desc = caller policy: "spiffe://test.local/ns/ops/sa/operator" may not ask about domain "billing"`},
		{"the policy refuses a caller it does not name",
			check("--tls-ca", pki.caFile, "--tls-cert", otherCert, "--tls-key", otherKey, "--domain", "shop", "user=u2"), nil, 1, "PermissionDenied"},
		{"no client certificate", check("--tls-ca", pki.caFile, "--domain", "shop", "user=u3"), nil, 1, "Unavailable"},
		{"no CA: rls's certificate is not trusted", check("--tls-cert", opsCert, "--tls-key", opsKey, "--domain", "shop", "user=u3"), nil, 1,
			"certificate signed by unknown authority"},
		{"plaintext against TLS", check("--domain", "shop", "user=u3"), nil, 1, "Unavailable"},
		{"the server name rls's certificate holds", check(append(ops, "--tls-server-name", "rls.test", "--domain", "shop", "user=u4")...), nil, 0,
			`"overall_code": "OK"`},
		{"a server name it does not hold", check(append(ops, "--tls-server-name", "elsewhere.test", "--domain", "shop", "user=u4")...), nil, 1,
			"elsewhere.test"},
		{"RLS_TLS_* variables", check("--domain", "shop", "user=u5"),
			[]string{"RLS_TLS_CA=" + pki.caFile, "RLS_TLS_CERT=" + opsCert, "RLS_TLS_KEY=" + opsKey, "RLS_TLS_SERVER_NAME=rls.test"}, 0, `"overall_code": "OK"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := binaryRun(t, tc.env, tc.args...)
			got := errOut
			if tc.code == 0 {
				got = out
			}
			if code != tc.code || !strings.Contains(got, tc.want) {
				t.Errorf("rls %s: exit %d, want %d and %q\nstdout: %s\nstderr: %s", strings.Join(tc.args, " "), code, tc.code, tc.want, out, errOut)
			}
		})
	}

	// inspect and reset, over the HTTP listener's own mutual TLS.
	httpsURL := "https://" + p.HTTPAddr
	// Probes and scrapes need no client certificate; POST /json does.
	pool := x509.NewCertPool()
	pool.AddCert(pki.ca)
	anon := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "rls.test"}}}
	for path, want := range map[string]int{"/readyz": 200, "/metrics": 200, "/json": http.StatusUnauthorized} {
		method, body := http.MethodGet, io.Reader(nil)
		if path == "/json" {
			method, body = http.MethodPost, strings.NewReader(`{"domain":"shop","descriptors":[{"entries":[{"key":"user","value":"u9"}]}]}`)
		}
		req, _ := http.NewRequest(method, httpsURL+path, body)
		resp, err := anon.Do(req)
		if err != nil {
			t.Fatalf("%s without a client certificate: %v", path, err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("%s without a client certificate: %d, want %d", path, resp.StatusCode, want)
		}
	}
	otherTLS := []string{"--tls-ca", pki.caFile, "--tls-cert", otherCert, "--tls-key", otherKey}
	token := filepath.Join(dir, "etc", "token")
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"inspect over mutual TLS", append([]string{"inspect", "--http-url", httpsURL, "--domain", "shop", "user=u1"}, ops...), 0, `"remaining": 0`},
		{"a bare host:port with TLS flags is https", append([]string{"inspect", "--http-url", p.HTTPAddr, "--domain", "shop", "user=u1"}, ops...), 0,
			`"remaining": 0`},
		{"inspect without a client certificate", []string{"inspect", "--http-url", httpsURL, "--tls-ca", pki.caFile, "--domain", "shop", "user=u1"}, 1,
			"client certificate signed by --http-tls-client-ca is required"},
		{"the policy refuses inspect of another domain", append([]string{"inspect", "--http-url", httpsURL, "--domain", "billing", "account=a"}, ops...), 1,
			`may not ask about domain "billing"`},
		{"the policy refuses inspect by a caller it does not name", append([]string{"inspect", "--http-url", httpsURL, "--domain", "shop", "user=u1"}, otherTLS...), 1,
			"caller policy"},
		{"reset refused by the policy", append([]string{"reset", "--http-url", httpsURL, "--admin-token-file", token, "--domain", "billing", "account=a"}, ops...), 1,
			"caller policy"},
		{"reset over mutual TLS", append([]string{"reset", "--http-url", httpsURL, "--admin-token-file", token, "--domain", "shop", "user=u1"}, ops...), 0, `"remaining": 2`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := binaryRun(t, nil, tc.args...)
			got := errOut
			if tc.code == 0 {
				got = out
			}
			if code != tc.code || !strings.Contains(got, tc.want) {
				t.Errorf("rls %s: exit %d, want %d and %q\nstdout: %s\nstderr: %s", strings.Join(tc.args, " "), code, tc.code, tc.want, out, errOut)
			}
		})
	}
}
