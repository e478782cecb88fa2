package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	rlconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"

	"github.com/rls-project/rls/internal/tlsroots"
	"github.com/rls-project/rls/internal/xds"
)

// xdsConfig holds the flags of rules over xDS.
type xdsConfig struct {
	server         string
	nodeID         string
	nodeMetadata   string
	headers        string
	tls            bool
	tlsCert        string
	tlsKey         string
	tlsCA          string
	tlsServerName  string
	backoffInitial time.Duration
	backoffMax     time.Duration
	maxMsgSize     int
}

// xdsFlags registers the xDS flags on fs.
func xdsFlags(fs *flag.FlagSet) *xdsConfig {
	x := &xdsConfig{}
	fs.StringVar(&x.server, "xds-server", "", "take the rules from this xDS management server (host:port) instead of files: RateLimitConfig resources, as Envoy Gateway serves them to envoyproxy/ratelimit")
	fs.StringVar(&x.nodeID, "xds-node-id", "default", "--xds-server: the node id rls subscribes as (the server picks the rules by it)")
	fs.StringVar(&x.nodeMetadata, "xds-node-metadata", "", "--xds-server: node metadata as key=value,key=value")
	fs.StringVar(&x.headers, "xds-header", "", "--xds-server: gRPC metadata sent on the stream, as key=value,key=value (e.g. an authorization token)")
	fs.BoolVar(&x.tls, "xds-tls", false, "--xds-server: connect with TLS (the system's roots unless --xds-tls-ca)")
	fs.StringVar(&x.tlsCert, "xds-tls-cert", "", "--xds-server: PEM client certificate (with --xds-tls-key), for mTLS")
	fs.StringVar(&x.tlsKey, "xds-tls-key", "", "--xds-server: PEM client private key")
	fs.StringVar(&x.tlsCA, "xds-tls-ca", "", "--xds-server: PEM CA bundle that verifies the server")
	fs.StringVar(&x.tlsServerName, "xds-tls-server-name", "", "--xds-server: name the server's certificate must carry (default: the host of --xds-server)")
	fs.DurationVar(&x.backoffInitial, "xds-backoff-initial", xds.DefaultBackoffInitial, "--xds-server: first delay before subscribing again after the stream breaks; it doubles, with jitter, up to --xds-backoff-max")
	fs.DurationVar(&x.backoffMax, "xds-backoff-max", xds.DefaultBackoffMax, "--xds-server: longest delay between attempts to subscribe")
	fs.IntVar(&x.maxMsgSize, "xds-max-msg-size", 0, "--xds-server: largest response accepted, in bytes (0: 4 MiB)")
	return x
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
func newXDS(c serveConfig, apply func([]*rlconfv3.RateLimitConfig) error, s *server) (*xds.Client, error) {
	x := c.xds
	md, err := parsePairs("xds-node-metadata", x.nodeMetadata)
	if err != nil {
		return nil, err
	}
	hdrs, err := parsePairs("xds-header", x.headers)
	if err != nil {
		return nil, err
	}
	var tlsConf *tls.Config
	if x.tls {
		if tlsConf, err = clientTLS("--xds-tls-*", x.tlsCert, x.tlsKey, x.tlsCA, x.tlsServerName, false); err != nil {
			return nil, err
		}
	} else if x.tlsCert != "" || x.tlsKey != "" || x.tlsCA != "" || x.tlsServerName != "" {
		return nil, errors.New("--xds-tls-cert, --xds-tls-key, --xds-tls-ca and --xds-tls-server-name need --xds-tls")
	}
	return xds.New(xds.Options{
		Server: x.server, NodeID: x.nodeID, NodeMetadata: md, Headers: hdrs, TLS: tlsConf,
		BackoffInitial: x.backoffInitial, BackoffMax: x.backoffMax, MaxMsgSize: x.maxMsgSize,
		Apply: apply, Log: s.log.With("rules", "xds"),
	})
}

// applyXDS swaps in the rules of an xDS snapshot, whole, or returns why not (the server is
// told, and the rules in force stay).
func (s *server) applyXDS(configs []*rlconfv3.RateLimitConfig) error {
	return s.swapRules(xds.Rules(configs, s.cfg.rulesOptions()))
}
