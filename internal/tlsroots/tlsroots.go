// Package tlsroots builds the roots that verify the servers rls and its client connect to (rls
// itself, an xDS server, Redis) from a CA bundle named by a flag or an option.
//
// A CA file is added to the system's roots, everywhere: a server whose certificate a private CA
// signed is trusted, and so is one with a publicly trusted certificate (a managed Redis). This
// is the meaning envoyproxy/ratelimit gives REDIS_TLS_CACERT and
// CONFIG_GRPC_XDS_SERVER_TLS_CACERT, which rls reads as --redis-tls-ca and --xds-tls-ca.
package tlsroots

import (
	"crypto/x509"
	"fmt"
	"os"
)

// Pool returns the system's roots with the certificates of the PEM file caFile added; nil when
// caFile is empty, which leaves crypto/tls to use the system's roots alone. A file that cannot
// be read or holds no PEM certificate is an error naming it. Where the system's roots cannot be
// loaded, the pool holds caFile's certificates only.
func Pool(caFile string) (*x509.CertPool, error) {
	if caFile == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s: no PEM certificates", caFile)
	}
	return pool, nil
}
