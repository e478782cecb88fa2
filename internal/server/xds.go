package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rls-project/rls/internal/tlsroots"
	"github.com/rls-project/rls/internal/xds"
)

// XDSConfig says where rules over xDS come from (with Server set).
type XDSConfig struct {
	Server         string        // --xds-server; "": the rules come from files
	NodeID         string        // --xds-node-id
	NodeMetadata   string        // --xds-node-metadata: key=value,key=value
	Headers        string        // --xds-header: key=value,key=value
	TLS            bool          // --xds-tls
	TLSCert        string        // --xds-tls-cert
	TLSKey         string        // --xds-tls-key
	TLSCA          string        // --xds-tls-ca
	TLSServerName  string        // --xds-tls-server-name
	BackoffInitial time.Duration // --xds-backoff-initial
	BackoffMax     time.Duration // --xds-backoff-max
	MaxMsgSize     int           // --xds-max-msg-size; 0: 4 MiB
}

// parsePairs parses "k=v,k=v" (flag names the flag, for errors).
func parsePairs(flag, s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	m := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return nil, fmt.Errorf("--%s: %q: want key=value[,key=value...]", flag, kv)
		}
		m[k] = strings.TrimSpace(v)
	}
	return m, nil
}

// clientTLS builds a client TLS configuration: an optional client certificate, an optional CA
// bundle added to the system's roots, an optional server name. With skipName the chain is still
// verified but not the name in it.
func clientTLS(what, cert, key, ca, serverName string, skipName bool) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if cert != "" || key != "" {
		if cert == "" || key == "" {
			return nil, fmt.Errorf("%s: a client certificate needs both its certificate and its key", what)
		}
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	if ca != "" {
		pool, err := tlsroots.Pool(ca)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		cfg.RootCAs = pool
	}
	if skipName {
		roots := cfg.RootCAs
		cfg.InsecureSkipVerify = true // the chain is verified below, without the name
		cfg.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("no server certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		}
	}
	return cfg, nil
}

// newXDS prepares the xDS subscription of c; apply takes each snapshot.
func newXDS(c Config, apply func([]*rlconfv3.RateLimitConfig) error, s *Server) (*xds.Client, error) {
	x := c.XDS
	md, err := parsePairs("xds-node-metadata", x.NodeMetadata)
	if err != nil {
		return nil, err
	}
	hdrs, err := parsePairs("xds-header", x.Headers)
	if err != nil {
		return nil, err
	}
	var tlsConf *tls.Config
	if x.TLS {
		if tlsConf, err = clientTLS("--xds-tls-*", x.TLSCert, x.TLSKey, x.TLSCA, x.TLSServerName, false); err != nil {
			return nil, err
		}
	}
	return xds.New(xds.Options{
		Server: x.Server, NodeID: x.NodeID, NodeMetadata: md, Headers: hdrs, TLS: tlsConf,
		BackoffInitial: x.BackoffInitial, BackoffMax: x.BackoffMax, MaxMsgSize: x.MaxMsgSize,
		Apply: apply, Log: s.log.With("rules", "xds"),
	})
}

// applyXDS swaps in the rules of an xDS snapshot, whole, or returns why not (the server is
// told, and the rules in force stay).
func (s *Server) applyXDS(configs []*rlconfv3.RateLimitConfig) error {
	return s.swapRules(xds.Rules(configs, s.cfg.rulesOptions()))
}
