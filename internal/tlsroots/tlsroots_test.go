package tlsroots_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/rls-project/rls/client"
	"github.com/rls-project/rls/internal/rlstest"
	"github.com/rls-project/rls/internal/tlsroots"
)

// serve accepts TLS connections on loopback with certs' server certificate, completing each
// handshake, until the test ends; it returns the address.
func serve(t *testing.T, certs rlstest.Certs) string {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(certs.ServerCert, certs.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake()
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// handshake reports whether a TLS connection to addr verifies with roots (nil: the system's).
func handshake(addr string, roots *x509.CertPool) error {
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "localhost", MinVersion: tls.VersionTLS12})
	if err != nil {
		return err
	}
	return c.Close()
}

// TestPoolAddsToSystemRoots runs itself again with SSL_CERT_FILE naming a CA of its own as the
// system's roots (crypto/x509 reads them once per process), then checks that a CA file is added
// to them: a server of either CA verifies, through Pool and through client.TLSConfig, while
// the system's roots alone verify only theirs.
func TestPoolAddsToSystemRoots(t *testing.T) {
	if os.Getenv("TLSROOTS_OWN_CA") == "" {
		system, own := rlstest.NewCerts(t), rlstest.NewCerts(t)
		cmd := exec.Command(os.Args[0], "-test.run=^TestPoolAddsToSystemRoots$", "-test.v")
		cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+system.CA, "SSL_CERT_DIR="+t.TempDir(),
			"TLSROOTS_OWN_CA="+own.CA, "TLSROOTS_SYSTEM_SERVER="+system.ServerCert+","+system.ServerKey,
			"TLSROOTS_OWN_SERVER="+own.ServerCert+","+own.ServerKey)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestPoolAddsToSystemRoots") {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	server := func(env string) string {
		cert, key, _ := strings.Cut(os.Getenv(env), ",")
		return serve(t, rlstest.Certs{ServerCert: cert, ServerKey: key})
	}
	systemAddr, ownAddr := server("TLSROOTS_SYSTEM_SERVER"), server("TLSROOTS_OWN_SERVER")
	if err := handshake(systemAddr, nil); err != nil {
		t.Fatalf("the system's roots do not verify the system CA's server: %v", err)
	}
	if err := handshake(ownAddr, nil); err == nil {
		t.Fatal("the system's roots verify the own CA's server")
	}
	pool, err := tlsroots.Pool(os.Getenv("TLSROOTS_OWN_CA"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := client.TLSConfig(os.Getenv("TLSROOTS_OWN_CA"), "", "")
	if err != nil {
		t.Fatal(err)
	}
	for name, roots := range map[string]*x509.CertPool{"Pool": pool, "client.TLSConfig": cfg.RootCAs} {
		for _, addr := range []string{systemAddr, ownAddr} {
			if err := handshake(addr, roots); err != nil {
				t.Errorf("%s: %s: %v", name, addr, err)
			}
		}
	}
}

func TestPoolErrors(t *testing.T) {
	if pool, err := tlsroots.Pool(""); pool != nil || err != nil {
		t.Errorf("no file: %v %v, want nil nil", pool, err)
	}
	dir := t.TempDir()
	missing := dir + "/missing.pem"
	if _, err := tlsroots.Pool(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("missing file: %v", err)
	}
	empty := dir + "/empty.pem"
	if err := os.WriteFile(empty, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := tlsroots.Pool(empty); err == nil || err.Error() != empty+": no PEM certificates" {
		t.Errorf("file without PEM: %v", err)
	}
}

// TestPoolVerifiesItsCA: a server its CA file signed verifies, one another CA signed does not.
func TestPoolVerifiesItsCA(t *testing.T) {
	own, other := rlstest.NewCerts(t), rlstest.NewCerts(t)
	pool, err := tlsroots.Pool(own.CA)
	if err != nil {
		t.Fatal(err)
	}
	if err := handshake(serve(t, own), pool); err != nil {
		t.Errorf("own CA's server: %v", err)
	}
	var unknown x509.UnknownAuthorityError
	if err := handshake(serve(t, other), pool); !errors.As(err, &unknown) {
		t.Errorf("another CA's server: %v, want an unknown authority", err)
	}
}
