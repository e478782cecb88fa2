package main

import (
	"crypto/tls"
	"flag"
	"fmt"

	"github.com/rls-project/rls/internal/tlsroots"
)

// clientTLS are the TLS flags of the commands that call a running rls (check, inspect, reset).
type clientTLS struct {
	on                                bool
	caFile, certFile, keyFile, server string
}

// clientTLSFlags registers the TLS flags of check, inspect and reset on fs; usage is --tls's
// help, which says when the command connects over TLS.
func clientTLSFlags(fs *flag.FlagSet, usage string) *clientTLS {
	t := &clientTLS{}
	fs.BoolVar(&t.on, "tls", false, usage)
	fs.StringVar(&t.caFile, "tls-ca", "", "PEM CA bundle that verifies rls's certificate, trusted besides the system's roots")
	fs.StringVar(&t.certFile, "tls-cert", "", "PEM client certificate, for an rls that requires one (--grpc-tls-client-ca; the caller policy names the caller by it)")
	fs.StringVar(&t.keyFile, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&t.server, "tls-server-name", "", "name rls's certificate must hold (default: the host of the address)")
	return t
}

// wanted reports whether any TLS flag was given.
func (t *clientTLS) wanted() bool {
	return t.on || t.caFile != "" || t.certFile != "" || t.keyFile != "" || t.server != ""
}

// config builds the TLS configuration the flags describe; a CA file means what it means
// everywhere rls takes one (tlsroots.Pool).
func (t *clientTLS) config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.server}
	if t.caFile != "" {
		pool, err := tlsroots.Pool(t.caFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = pool
	}
	if (t.certFile == "") != (t.keyFile == "") {
		return nil, fmt.Errorf("%w: --tls-cert and --tls-key go together", errUsage)
	}
	if t.certFile != "" {
		cert, err := tls.LoadX509KeyPair(t.certFile, t.keyFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-cert, --tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
